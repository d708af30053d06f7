"""Watch family, write side: any tensor, per replica (`ReplicaProbe.watch`).

For one watched value (a tensor, `tf.RaggedTensor`, `tf.SparseTensor` or a nested structure of
them) and one step:

- the kinds, dtypes and shapes of every leaf on every replica go into the step's transfer through
  the inputs family's machinery (`inputs.shapes`: shapes from the replica's one `ShapeN`, one
  fingerprint on the host); the JSON document (`watch/<name>/shapes`) is formatted in-graph only
  at a step whose fingerprint differs from the previous call's, so an odd step is never lost to
  sampling;
- each replica sends, per dense numeric leaf, four floats (`stats.packed_values`: its sum, which
  also says whether every value is finite, its minimum, maximum and L2 norm): its stats
  wherever every value is finite; where one is not, the replica's fault branch computes the
  exact stats on its device (`stats.leaf_stats`, `core.transfer`);
- at sampled steps (`probe.sampled`: logged steps, every `examples_every` steps, each epoch's last
  step in `fit`) the host writes the stats (`watch/<name>/stats`), and at every step where some
  replica's value holds a NaN or an Inf, the stats of that step (`watch/<name>/nonfinite`, the
  stats layout), naming the replica and the step.

Ragged and sparse leaves (custom loops) are read by the host as they are at those steps.
"""

import functools

import tensorflow as tf

from tb_replica_plugin.core.nest import flatten_with_names
from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from tb_replica_plugin.core.recorder import run_if
from tb_replica_plugin.families.inputs import shapes
from tb_replica_plugin.families.inputs.shapes import as_leaf
from tb_replica_plugin.families.watch import schema, stats

# Distinct watched names per probe (each has its previous fingerprint).
MAX_WATCHED = 64


class _Plan:
    """Which leaves of one watched value send packed stats (`packed`: dense numeric leaves), are
    read by the host as they are (`kept`: ragged or sparse leaves) or have no numeric stats (the
    others: dense strings)."""

    def __init__(self, per_replica):
        self.packed = [i for i, values in enumerate(per_replica) if stats.packable(values)]
        self.kept = [
            i
            for i, values in enumerate(per_replica)
            if any(isinstance(v, (tf.RaggedTensor, tf.SparseTensor)) for v in values)
        ]
        self.count = len(per_replica)


def _put_values(transfer, owner, per_replica, plan):
    """Puts every replica's packed values of the leaves in `transfer` (cross-replica context):
    `(owner, "values")` the packed leaves' `stats.PACKED`, `(owner, "kept")` the kept numeric
    leaves' sums, and the fault branch's exact stats of the packed leaves."""
    guard = []
    for replica, packet in enumerate(transfer.packets):
        leaves = [values[replica] for values in per_replica]
        with tf.device(packet.device):
            packed = [v for index in plan.packed for v in stats.packed_values(leaves[index])]
            sums = []
            for index in plan.kept:
                values = stats.leaf_values(leaves[index])
                if stats.is_numeric(values.dtype):
                    sums.append(tf.reduce_sum(tf.cast(values, tf.float64)))
                packet.keep((owner, f"leaf/{index}"), leaves[index])
        packet.floats((owner, "values"), packed)
        packet.floats((owner, "kept"), sums)
        guard = [
            key for key, found in (((owner, "values"), packed), ((owner, "kept"), sums)) if found
        ]
        if plan.packed:

            def exact(leaves=leaves):
                return tf.concat([stats.leaf_stats(leaves[i]) for i in plan.packed], axis=0)

            size = len(plan.packed) * len(schema.STAT_ROWS)
            packet.on_fault((owner, "exact"), exact, size, tf.float64, guard=guard)
    return guard


class Recorder(RecorderBase):
    """State and writes of the watch family: the previous shapes fingerprint of each name."""

    name = "watch"

    def __init__(self, probe):
        super().__init__(probe)
        self._slots = {}

    def create_state(self):
        # The previous call's shapes fingerprint per watched name (0: none yet).
        self.variable("fingerprints", tf.zeros([MAX_WATCHED], tf.int64))

    def slot(self, name):
        """The fingerprint slot of watched name `name` (assigned at its first trace).

        Raises:
          ValueError: past `MAX_WATCHED` distinct names.
        """
        if name not in self._slots:
            if len(self._slots) >= MAX_WATCHED:
                raise ValueError(
                    f"more than {MAX_WATCHED} distinct watched names; watch a structure under "
                    "one name instead (e.g. watch('activations', {'a': a, 'b': b}))"
                )
            self._slots[name] = len(self._slots)
        return self._slots[name]

    def warn(self, error):
        self.probe.warn_failed("watch", error, "watched values")

    def merge(self, strategy, leaves, *, name, names, step, explain):
        """Cross-replica part of `watch`: every replica's shapes and packed values into the
        step's transfer, the host's part (`_deliver`) once it is delivered."""
        probe = self.probe
        owner = f"watch/{name}"
        transfer = None
        try:
            self.slot(name)
            per_replica = [probe.local_values(strategy, leaf, composite=True) for leaf in leaves]
            transfer = probe.transfer()
            layout = shapes.LeafLayout.of(names, per_replica)
            shapes.put_shapes(transfer, owner, layout, per_replica)
            plan = _Plan(per_replica)
            plan.checked = _put_values(transfer, owner, per_replica, plan)
            deliver = functools.partial(
                self._deliver, owner=owner, name=name, step=step, explain=explain, plan=plan
            )
            transfer.on_host(owner, deliver)
        except Exception as error:  # noqa: BLE001 - must never break training
            if transfer is not None:
                transfer.drop(owner)
            self.warn(error)
            return
        probe.ship(transfer)

    def _deliver(self, delivery, *, owner, name, step, explain, plan):
        try:
            self._write(delivery, owner, name, step, explain, plan)
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _write(self, delivery, owner, name, step, explain, plan):
        probe = self.probe
        received = shapes.received(delivery, owner)
        step_value = probe.step_of(delivery, owner, step)
        slot = self.slot(name)
        fingerprints = self.state["fingerprints"]
        changed = tf.not_equal(fingerprints.read_value()[slot], received.fingerprint)
        static = dict(probe.static, name=name, explain=bool(explain))
        probe.write(
            changed,
            schema.tag(schema.TAG_SHAPES, name),
            lambda: received.shapes_json(static, key="leaves"),
            step_value,
            schema.KIND_SHAPES,
        )
        sampled = probe.sampled(step_value)
        # Where some packed value is not finite (a NaN, an Inf; or an empty leaf's minimum):
        # the stats branch then reads which replica's sums are not.
        checked = [delivery.value(key) for key in plan.checked]
        unhealthy = tf.constant(False)
        if checked:
            values = checked[0] if len(checked) == 1 else tf.concat(checked, axis=1)
            unhealthy = tf.logical_not(tf.reduce_all(tf.math.is_finite(values)))

        def write_stats():
            # At sampled steps, and at any step where a replica's value holds NaN or Inf (the
            # exact counts decide).
            values = self._stats(delivery, owner, plan, received)
            rows = schema.STAT_ROWS
            bad = values[:, rows.index("nan")] + values[:, rows.index("inf")]
            stats_tag = schema.tag(schema.TAG_STATS, name)
            probe.write(sampled, stats_tag, lambda: values, step_value, schema.KIND_STATS)
            probe.write(
                tf.logical_and(unhealthy, tf.reduce_any(bad > 0)),
                schema.tag(schema.TAG_NONFINITE, name),
                lambda: values,
                step_value,
                schema.KIND_NONFINITE,
            )

        run_if(
            tf.logical_or(sampled, unhealthy), write_stats, as_function=probe.branches_as_functions
        )
        tf.raw_ops.ResourceScatterUpdate(
            resource=fingerprints.handle, indices=slot, updates=received.fingerprint
        )

    def _stats(self, delivery, owner, plan, received):
        """float64 [L, STATS, R]: every leaf's stats on every replica (in the write branch)."""
        devices = self.probe.static["devices"]
        sizes = [received.leaf_size(index) for index in range(plan.count)]
        per_leaf = [None] * plan.count
        if plan.packed:
            packed = delivery.value((owner, "values"))
            sums = [packed[:, :: len(stats.PACKED)]]
            if delivery.has((owner, "kept")):
                sums.append(delivery.value((owner, "kept")))
            # The replicas whose fault branch ran: some sum is not finite.
            broken = tf.logical_not(
                tf.reduce_all(tf.math.is_finite(tf.concat(sums, axis=1)), axis=1)
            )
            exact = delivery.value((owner, "exact")) if delivery.has((owner, "exact")) else None
            leaves = stats.host_stats(
                packed,
                tf.stack([sizes[i][0] for i in plan.packed]),
                tf.stack([sizes[i][1] for i in plan.packed]),
                exact,
                broken,
            )
            for position, index in enumerate(plan.packed):
                per_leaf[index] = leaves[position]
        for index in plan.kept:
            columns = []
            for replica, leaf in enumerate(delivery.kept((owner, f"leaf/{index}"))):
                with tf.device(devices[replica]):
                    columns.append(stats.leaf_stats(leaf))
            per_leaf[index] = tf.stack(columns, axis=1)
        for index in range(plan.count):
            if per_leaf[index] is None:
                per_leaf[index] = stats.string_stats(*sizes[index])
        return tf.stack(per_leaf)  # [L, STATS, R]

    def close(self):
        super().close()
        self._slots = {}

    def fit_step(self, fit):
        """Keras `fit` with `outputs=True`: each replica's `y_pred` (captured at the model's
        `compute_loss`) watched as `outputs` after the model's step; outputs captured in another
        graph (a validation step of the same fit) are ignored."""
        if not fit.options.outputs:
            return None, None
        capture = fit.capture_outputs()
        if capture is None:
            return None, None
        probe = self.probe

        def after():
            try:
                y_pred = fit.take(capture)
            except Exception as error:  # noqa: BLE001 - never break training
                probe.warn_failed("watch", error, "model outputs")
                return
            if y_pred is not None:
                probe.watch("outputs", y_pred)

        return None, after


class Recording:
    """`ReplicaProbe` methods of the watch family."""

    def watch(self, name, value, step=None, explain=False):
        """Records any tensor per replica: shapes, dtypes, kind, small stats and NaN/Inf.

        Call it in replica context (inside `strategy.run`) with this replica's value, or in
        cross-replica context with what `strategy.run` returned (`PerReplica` leaves, any
        nesting). Every leaf may be a tensor, a `tf.RaggedTensor` or a `tf.SparseTensor`. Per
        leaf and replica it records: kind, dtype and shape at the first call and at every step
        where any of them changes (a ragged dimension is recorded as -1; its row count and
        ragged structure count), which gives the `gather_would_fail` finding when replicas
        disagree beyond the leading axis; min, max, mean, L2 norm of the finite values, NaN/Inf
        counts, number of values, leading dimension (ragged: nrows, sparse: dense_shape[0]) and,
        for ragged leaves, the shortest and longest row, at sampled steps (every logged step and
        every `examples_every` steps); and at EVERY step where a replica's value holds a NaN or
        an Inf, those stats at that step (`nonfinite_values`). A failure warns once and never
        stops training.

        Args:
          name: the value's name, e.g. "logits" (one series per name; up to 64 names).
          value: the tensor or (nested dict/list/tuple) structure of tensors.
          step: the step to record at (int or int tensor). When omitted, the step of the step
            axis (see `observe_inputs`; outside `probe.step()`, each name is a caller of its
            own).
          explain: also give an info finding (`per_replica_result`) that explains what
            `strategy.run` returned for this value: the local shape on every replica and the
            shape `strategy.gather(value, axis=0)` would give.

        Raises:
          ValueError: if `name` is not a non-empty string (a mistake in the calling code; any
            failure while recording only warns).

        Example:
          ```python
          def step_fn(x):
              logits = model(x)
              probe.watch("logits", logits)  # replica context
              return logits

          per_replica = strategy.run(step_fn, args=(x,))
          probe.watch("returned", per_replica, explain=True)  # cross-replica context
          ```
        """
        if not isinstance(name, str) or not name or "*" in name:
            raise ValueError(
                f"`name` must be a non-empty string without '*'. Received: name={name!r}"
            )
        if not self.build():
            return
        recorder = self.recorder("watch")
        try:
            pairs = flatten_with_names(value, prefix=name)
            if not pairs:
                self.warn_once("watch_none", f"tb_replica_plugin: watch({name!r}) got no tensors.")
                return
            names = [leaf_name for leaf_name, _ in pairs]
            leaves = [
                leaf if isinstance(leaf, tf.distribute.DistributedValues) else as_leaf(leaf)
                for _, leaf in pairs
            ]
            merge = functools.partial(
                recorder.merge, name=name, names=names, step=step, explain=explain
            )
            self.merge_leaves(merge, leaves)
        except Exception as error:  # noqa: BLE001 - must never break training
            recorder.warn(error)
