"""Watch family, write side: any tensor, per replica (`ReplicaProbe.watch`).

For one watched value (a tensor, `tf.RaggedTensor`, `tf.SparseTensor` or a nested structure of
them) and one step, in cross-replica context:

- the kinds, dtypes and shapes of every leaf on every replica go through the inputs family's
  machinery (`inputs.record.InputsStats`: one packed int64 shape vector per replica, one
  fingerprint); the JSON document (`watch/<name>/shapes`) is formatted in-graph only at a step
  whose fingerprint differs from the previous call's, so an odd step is never lost to sampling;
- at sampled steps (`probe.sampled`: logged steps, every `examples_every` steps, each epoch's last
  step in `fit`) the small stats of every leaf (`schema.STAT_ROWS`) are computed on each
  replica's device and written (`watch/<name>/stats`);
- at every step each replica checks that the sum of its floating-point values is finite (one
  reduction per leaf); only where some replica's is not are the exact stats computed and written
  (`watch/<name>/nonfinite`, the stats layout), naming the replica and the step.
"""

import functools

import tensorflow as tf

from tb_replica_plugin.core.joined import segment_ids
from tb_replica_plugin.core.nest import flatten_with_names
from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from tb_replica_plugin.core.recorder import run_if
from tb_replica_plugin.families.inputs.record import InputsStats, as_leaf
from tb_replica_plugin.families.watch import schema

# Distinct watched names per probe (each has its own step counter and previous fingerprint).
MAX_WATCHED = 64
# Columns of the int64 [MAX_WATCHED, 3] counters: next step, has a previous call, its
# fingerprint.
_STEP, _HAS_PREV, _PREV_FP = range(3)

_NAN = float("nan")


def _leaf_values(value):
    """The stored values of a leaf: a ragged leaf's flat values, a sparse leaf's values, else
    the leaf itself."""
    if isinstance(value, tf.RaggedTensor):
        return value.flat_values
    if isinstance(value, tf.SparseTensor):
        return value.values
    return value


def _numeric_values(value):
    """The scalar values of a leaf as a float64 vector, or None for strings and other dtypes."""
    values = _leaf_values(value)
    dtype = values.dtype
    if not (dtype.is_floating or dtype.is_integer or dtype.is_bool):
        return None
    return tf.cast(tf.reshape(values, [-1]), tf.float64)


def _leading(shape):
    """The leading dimension of an int64 shape vector, 1 for a scalar (float64)."""
    padded = tf.concat([shape, tf.ones([1], tf.int64)], axis=0)
    return tf.cast(padded[0], tf.float64)


def leaf_stats(value):
    """float64 [len(schema.STAT_ROWS)]: the stats of one leaf on one replica.

    Args:
      value: a tensor, `tf.RaggedTensor` or `tf.SparseTensor` (one replica's).

    Returns:
      The rows of `schema.STAT_ROWS`: min, max, mean and L2 norm of the finite values, NaN and
      Inf counts, number of values, leading dimension, shortest and longest ragged row.

    Example:
      >>> leaf_stats(tf.constant([[1.0, float("nan")], [3.0, 4.0]])).numpy()[:7]
      array([1., 4., 2.66666667, 5.09901951, 1., 0., 4.])
    """
    nan = tf.constant(_NAN, tf.float64)
    values = _numeric_values(value)
    if isinstance(value, tf.RaggedTensor):
        nrows = tf.cast(value.nrows(), tf.float64)
        lengths = tf.cast(value.row_lengths(), tf.float64)
        has_rows = tf.size(lengths) > 0
        row_min = tf.where(has_rows, tf.reduce_min(lengths), nan)
        row_max = tf.where(has_rows, tf.reduce_max(lengths), nan)
        size = tf.cast(tf.size(value.flat_values), tf.float64)
    else:
        if isinstance(value, tf.SparseTensor):
            nrows = _leading(tf.cast(value.dense_shape, tf.int64))
            size = tf.cast(tf.shape(value.indices)[0], tf.float64)
        else:
            nrows = _leading(tf.shape(value, out_type=tf.int64))
            size = tf.cast(tf.size(value), tf.float64)
        row_min = row_max = nan
    if values is None:
        moments = tf.fill([4], nan)
        nans = infs = tf.constant(0.0, tf.float64)
    else:
        # Masked reductions (no boolean_mask): fewer ops to trace and to run.
        finite = tf.math.is_finite(values)
        count = tf.reduce_sum(tf.cast(finite, tf.float64))
        inf = tf.constant(float("inf"), tf.float64)
        kept = tf.where(finite, values, tf.zeros_like(values))
        low = tf.reduce_min(tf.where(finite, values, inf))
        high = tf.reduce_max(tf.where(finite, values, -inf))
        mean = tf.reduce_sum(kept) / tf.maximum(count, 1.0)
        l2 = tf.sqrt(tf.reduce_sum(tf.square(kept)))
        moments = tf.where(count > 0, tf.stack([low, high, mean, l2]), nan)
        nans = tf.reduce_sum(tf.cast(tf.math.is_nan(values), tf.float64))
        infs = tf.cast(tf.size(values), tf.float64) - count - nans
    return tf.concat([moments, tf.stack([nans, infs, size, nrows, row_min, row_max])], axis=0)


def dense_leaf_stats(values):
    """float64 [len(schema.STAT_ROWS), R]: `leaf_stats` of one dense leaf on every replica at once.

    One set of segment reductions over the replicas' values concatenated on the host CPU, instead
    of one set of reductions per replica: the same figures from about a fifth of the ops to trace
    (it runs at sampled steps only, so the copy to the host is rare).

    Args:
      values: the replicas' tensors of one leaf, all dense and of one numeric dtype.

    Returns:
      One column per replica, the rows of `schema.STAT_ROWS` (the ragged rows are NaN).

    Example:
      >>> dense_leaf_stats([tf.constant([1.0, 2.0]), tf.constant([float("nan")])]).numpy()[:, 1]
      array([nan, nan, nan, nan,  1.,  0.,  1.,  1., nan, nan])
    """
    count = len(values)
    nan = tf.constant(_NAN, tf.float64)
    with tf.device("/cpu:0"):
        shapes = tf.stack(tf.shape_n(values, out_type=tf.int64))  # [R, rank]
        sizes = tf.reduce_prod(shapes, 1)
        leading = tf.cast(
            shapes[:, 0] if values[0].shape.rank else tf.ones([count], tf.int64), tf.float64
        )
        flat = tf.cast(tf.concat([tf.reshape(v, [-1]) for v in values], 0), tf.float64)
        owner = segment_ids(sizes)
        finite = tf.math.is_finite(flat)
        kept = tf.where(finite, flat, tf.zeros_like(flat))
        inf = tf.constant(float("inf"), tf.float64)
        finite_count = tf.math.unsorted_segment_sum(tf.cast(finite, tf.float64), owner, count)
        low = tf.math.unsorted_segment_min(tf.where(finite, flat, inf), owner, count)
        high = tf.math.unsorted_segment_max(tf.where(finite, flat, -inf), owner, count)
        sums = tf.math.unsorted_segment_sum(tf.stack([kept, tf.square(kept)], 1), owner, count)
        nans = tf.math.unsorted_segment_sum(tf.cast(tf.math.is_nan(flat), tf.float64), owner, count)
        moments = tf.stack(
            [low, high, sums[:, 0] / tf.maximum(finite_count, 1.0), tf.sqrt(sums[:, 1])]
        )
        moments = tf.where(finite_count > 0, moments, nan)
        size = tf.cast(sizes, tf.float64)
        ragged = tf.fill([2, count], nan)
        return tf.concat(
            [moments, tf.stack([nans, size - finite_count - nans, size, leading]), ragged], 0
        )


def _vectorizable(values):
    """Whether `dense_leaf_stats` applies: dense numeric leaves of one dtype and rank."""
    if len({v.shape.rank for v in values}) != 1 or values[0].shape.rank is None:
        return False
    dtypes = {v.dtype for v in values}
    if len(dtypes) != 1 or any(isinstance(v, (tf.RaggedTensor, tf.SparseTensor)) for v in values):
        return False
    dtype = dtypes.pop()
    numeric = dtype.is_floating or dtype.is_integer or dtype.is_bool
    return numeric


def leaf_finite(value):
    """bool scalar: the sum of a leaf's floating-point values is finite (True otherwise).

    False whenever a value is NaN or Inf (or the float sum overflows): the every-step check.
    """
    values = _leaf_values(value)
    if not values.dtype.is_floating:
        return tf.constant(True)
    return tf.math.is_finite(tf.reduce_sum(tf.cast(values, tf.float32)))


class Recorder(RecorderBase):
    """State and writes of the watch family: one slot of counters per watched name."""

    name = "watch"

    def __init__(self, probe):
        super().__init__(probe)
        self._slots = {}

    def create_state(self):
        start = int(self._start_step)
        self.variable("counters", [[start, 0, 0]] * MAX_WATCHED, tf.int64)

    def set_step(self, step):
        counters = self.state.get("counters")
        self._start_step = step
        if counters is not None:
            column = tf.fill([MAX_WATCHED], tf.cast(step, tf.int64))
            counters.assign(
                tf.concat([tf.expand_dims(column, 1), counters.read_value()[:, 1:]], axis=1)
            )

    def slot(self, name):
        """The counters row of watched name `name` (assigned at its first trace).

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
        """Cross-replica part of `watch`: shapes, stats, NaN/Inf, summary writes."""
        probe = self.probe
        try:
            per_replica = [probe.local_values(strategy, leaf, composite=True) for leaf in leaves]
            self._write(name, names, per_replica, step, explain)
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _write(self, name, names, per_replica, step, explain):
        probe = self.probe
        devices = probe.static["devices"]
        slot = self.slot(name)
        shapes = InputsStats(names, per_replica, devices)
        counters = self.state["counters"]
        row = tf.unstack(counters.read_value()[slot])
        if step is None:
            step_value = row[_STEP]
            next_step = step_value + 1
        else:
            step_value = tf.cast(step, tf.int64)
            next_step = row[_STEP]
        recording = probe.recording()
        changed = tf.logical_or(
            tf.equal(row[_HAS_PREV], 0), tf.not_equal(row[_PREV_FP], shapes.fingerprint)
        )
        static = dict(probe.static, name=name, explain=bool(explain))
        probe.write(
            tf.logical_and(changed, recording),
            schema.tag(schema.TAG_SHAPES, name),
            lambda: shapes.shapes_json(static, key="leaves"),
            step_value,
            schema.KIND_SHAPES,
        )

        def stats():
            per_leaf = []
            for leaf in per_replica:
                if _vectorizable(leaf):
                    per_leaf.append(dense_leaf_stats(leaf))
                    continue
                columns = []
                for replica, device in enumerate(devices):
                    with tf.device(device):
                        columns.append(leaf_stats(leaf[replica]))
                per_leaf.append(tf.stack(columns, axis=1))  # [STATS, R]
            return tf.stack(per_leaf)  # [L, STATS, R]

        flags = []
        for replica, device in enumerate(devices):
            with tf.device(device):
                flags.extend(leaf_finite(leaf[replica]) for leaf in per_replica)
        sampled = tf.logical_and(probe.sampled(step_value), recording)
        unhealthy = tf.logical_and(tf.logical_not(tf.reduce_all(tf.stack(flags))), recording)

        def write_stats():
            # One trace of the stats for both writes: at sampled steps, and at any step where a
            # replica's value holds NaN or Inf (the exact counts decide).
            values = stats()
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
        new_row = tf.stack([next_step, tf.constant(1, tf.int64), shapes.fingerprint])
        counters.assign(tf.tensor_scatter_nd_update(counters.read_value(), [[slot]], [new_row]))

    def close(self):
        super().close()
        self._slots = {}


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
          step: the step to record at (int or int tensor). When omitted, each name counts its
            own calls from 0 (or from `set_step`).
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
