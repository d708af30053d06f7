"""Examples family, write side: a fingerprint per example, and examples shared by replicas.

Per-example fingerprint (deterministic across processes and machines, so workers of a multi-worker
job can be compared offline; little-endian hosts):

1. For each input leaf (named and ordered as `core.nest.flatten_with_names`: dict keys sorted, `x`,
   `y`, `sample_weight` in `fit`) with a leading batch dimension B: its example rows as bytes
   (`bool` cast to uint8, numbers bit-cast to uint8, `[B, -1]`; strings stay strings), hashed by
   `tf.fingerprint` (farmhash64) into 8 bytes per example. A leaf whose leading dimension differs
   from the first leaf's contributes 8 zero bytes; rank-0 leaves are skipped.
2. The leaf digests of one example are concatenated (8 bytes per leaf, leaf order) and hashed
   again with `tf.fingerprint`; the 8 bytes bit-cast to int64 are the example's fingerprint.

Per step the probe keeps, per replica, the set of distinct fingerprints; it computes in-graph the
replica × replica count of shared examples (exact) and writes a bottom-K sketch of each replica's
set (the K smallest fingerprints in signed int64 order), enough to tell identical batches apart
from disjoint ones across workers and to estimate overlaps (Jaccard of two bottom-K sketches).
"""

import functools

import tensorflow as tf

from tb_replica_plugin.core.joined import leading_dims, segment_ids
from tb_replica_plugin.core.nest import flatten_with_names
from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from tb_replica_plugin.core.recorder import run_if
from tb_replica_plugin.families.examples import pss, schema
from tb_replica_plugin.families.examples.fingerprints import (
    SKETCH_SIZE,
    byte_view,
    example_fingerprints,
)


def _joinable(values):
    """Whether one leaf's replica tensors can be hashed as one batch: dense, one dtype, rank >= 1
    and one fully known row shape (`shape[1:]`)."""
    first = values[0]
    if any(isinstance(v, (tf.RaggedTensor, tf.SparseTensor)) for v in values):
        return False
    rank = first.shape.rank
    if rank is None or rank < 1 or not first.shape[1:].is_fully_defined():
        return False
    return all(v.dtype == first.dtype and v.shape[1:] == first.shape[1:] for v in values)


def fingerprints_across(per_leaf):
    """Every replica's example fingerprints in one set of ops (cross-replica context).

    The same per-example fingerprints as `example_fingerprints` on each replica, from the
    replicas' batches concatenated on the host CPU (where `tf.fingerprint` runs anyway): one
    set of ops to trace instead of one per replica. One difference: a leaf whose leading
    dimension differs from the first leaf's on any replica contributes zeros on every replica.

    Args:
      per_leaf: `[leaf][replica]` tensors, the leaves in name order.

    Returns:
      `(fingerprints, owner, batch_size)`: int64 [N] fingerprints of every replica's examples,
      replica after replica; int32 [N] the replica of each; int64 [R] examples per replica. None
      when a leaf cannot be joined (ragged, sparse, unknown row shape, or differing dtypes or
      row shapes across replicas): the caller hashes replica by replica then.
    """
    leaves = [values for values in per_leaf if values[0].shape.rank != 0]
    if not leaves or not all(_joinable(values) for values in leaves):
        return None
    count = len(leaves[0])
    with tf.device("/cpu:0"):
        batch_size = leading_dims(leaves[0])
        total = tf.reduce_sum(batch_size)
        digests = []
        for index, values in enumerate(leaves):
            joined = byte_view(tf.concat(values, 0) if count > 1 else values[0])
            width = max(joined.shape[1:].num_elements(), 1)
            digest = tf.fingerprint(tf.reshape(joined, [-1, width]))
            if index:
                # Zeros when the leaf's rows are not the first leaf's on every replica.
                same = tf.reduce_all(tf.equal(leading_dims(values), batch_size))
                kept = tf.where(same, total, tf.constant(0, tf.int64))
                digest = tf.pad(digest[:kept], tf.stack([tf.stack([0, total - kept]), [0, 0]]))
            digests.append(digest)
        combined = tf.fingerprint(tf.concat(digests, axis=1))
        fingerprints = tf.reshape(tf.bitcast(combined, tf.int64), [-1])
        owner = segment_ids(batch_size)
    return fingerprints, owner, batch_size


class OverlapStats:
    """Cross-replica statistics of one step's example fingerprints (cross-replica context).

    Args:
      fingerprints: list over local replicas of int64 [B_r] vectors.
      sketch_size: K, fingerprints kept per replica in the sketch.

    Attributes:
      batch_size: int64 [R], examples per replica.
      distinct: int64 [R], distinct examples per replica.
      duplicated: int64 [R], distinct examples of a replica also fed to another replica.
      shared: int64 [R, R], distinct examples fed to both replicas (diagonal: `distinct`).
      sketch: int64 [R, K], the K smallest distinct fingerprints per replica, ascending, zero
        padded after `min(distinct, K)` entries.
    """

    def __init__(self, fingerprints, sketch_size=SKETCH_SIZE):
        num = len(fingerprints)
        uniques = [tf.unique(f).y for f in fingerprints]
        self.batch_size = tf.stack([tf.size(f, out_type=tf.int64) for f in fingerprints])
        self.distinct = tf.stack([tf.size(u, out_type=tf.int64) for u in uniques])
        everything = tf.concat(uniques, axis=0)
        owner = tf.concat(
            [tf.fill(tf.shape(u), tf.constant(r, tf.int32)) for r, u in enumerate(uniques)], 0
        )
        values, index = tf.unique(everything, out_idx=tf.int32)
        presence = tf.math.unsorted_segment_max(
            tf.one_hot(owner, num, dtype=tf.int32), index, tf.size(values)
        )
        as_float = tf.cast(presence, tf.float64)
        self.shared = tf.cast(tf.matmul(as_float, as_float, transpose_a=True), tf.int64)
        on_several = tf.cast(tf.reduce_sum(presence, axis=1) > 1, tf.int64)
        self.duplicated = tf.reduce_sum(tf.cast(presence, tf.int64) * on_several[:, None], 0)
        rows = []
        for unique in uniques:
            smallest = tf.sort(unique)[:sketch_size]
            rows.append(tf.pad(smallest, [[0, sketch_size - tf.size(smallest)]]))
        self.sketch = tf.stack(rows)

    @classmethod
    def joined(cls, fingerprints, owner, batch_size, sketch_size=SKETCH_SIZE):
        """The same statistics from `fingerprints_across`'s joined form, in one set of ops.

        Args:
          fingerprints, owner, batch_size: what `fingerprints_across` returns.
          sketch_size: K, fingerprints kept per replica in the sketch.

        Returns:
          An `OverlapStats`.
        """
        self = cls.__new__(cls)
        num = int(batch_size.shape[0])
        values, index = tf.unique(fingerprints, out_idx=tf.int64)
        # presence[u, r]: replica r was fed the example with fingerprint values[u].
        presence = tf.math.unsorted_segment_max(
            tf.one_hot(owner, num, dtype=tf.int32), index, tf.size(values, out_type=tf.int64)
        )
        self.batch_size = batch_size
        self.distinct = tf.reduce_sum(tf.cast(presence, tf.int64), 0)
        as_float = tf.cast(presence, tf.float64)
        self.shared = tf.cast(tf.matmul(as_float, as_float, transpose_a=True), tf.int64)
        on_several = tf.cast(tf.reduce_sum(presence, axis=1) > 1, tf.int64)
        self.duplicated = tf.reduce_sum(tf.cast(presence, tf.int64) * on_several[:, None], 0)
        # Sketch: in ascending fingerprint order, each replica's first `sketch_size` examples.
        order = tf.argsort(values)
        present = tf.gather(presence, order)  # [U, R]
        rank = tf.cumsum(present, axis=0) - 1
        where = tf.where(tf.logical_and(present > 0, rank < sketch_size))  # [n, 2]: (u, r)
        self.sketch = tf.scatter_nd(
            tf.stack([where[:, 1], tf.cast(tf.gather_nd(rank, where), tf.int64)], 1),
            tf.gather(tf.gather(values, order), where[:, 0]),
            tf.constant([num, sketch_size], tf.int64),
        )
        return self


# Slots of the family's packed int64 counters: step of the last sample, sampled steps since the
# last write.
_LAST_STEP, _WIN_COUNT = range(2)
# The family's value in a step's transfer: each replica's batch, read at sampled steps only.
_BATCH = ("examples", "batch")


class Recorder(RecorderBase):
    """State and writes of the examples family (tags `data/*`)."""

    name = "examples"
    pss_window = None  # `pss.Window` under ParameterServerStrategy

    def create_state(self):
        num = self.probe.num_replicas
        width = 4 + SKETCH_SIZE
        self.variable("counters", [-1, 0], tf.int64)
        self.variable("last_examples", tf.zeros([num, width], tf.int64))
        self.variable("last_overlap", tf.zeros([3, num, num], tf.int64))
        self.variable("win_dup", tf.zeros([num], tf.int64))
        self.variable("win_shared", tf.zeros([num, num], tf.int64))
        self.variable("win_steps", tf.zeros([num, num], tf.int64))

    def sample_last_of(self, steps):
        """Host side: also sample the last of the next `steps` steps (an epoch's last)."""
        if self.state:
            self.probe.sample_last_of(steps)

    def merge(self, strategy, leaves, *, step):
        """Cross-replica part of `observe_examples`: every replica's batch handed to the host's
        part (`_deliver`), which reads it at sampled steps only."""
        probe = self.probe
        transfer = None
        try:
            per_replica = [probe.local_values(strategy, leaf, composite=True) for leaf in leaves]
            transfer = probe.transfer()
            for replica, packet in enumerate(transfer.packets):
                packet.keep(_BATCH, [leaf[replica] for leaf in per_replica])
            transfer.on_host(self.name, functools.partial(self._deliver, step=step))
        except Exception as error:  # noqa: BLE001
            if transfer is not None:
                transfer.drop(self.name)
            probe.warn_failed("data", error)
            return
        probe.ship(transfer)

    def _deliver(self, delivery, *, step):
        probe = self.probe
        try:
            per_replica = [list(leaves) for leaves in zip(*delivery.kept(_BATCH), strict=True)]
            devices = probe.static["devices"]
            step_value = probe.step_of(delivery, self.name, step)

            def sample():
                joined = fingerprints_across(per_replica)
                if joined is not None:
                    self._record(OverlapStats.joined(*joined), step_value)
                    return
                fingerprints = []
                for replica, device in enumerate(devices):
                    with tf.device(device):
                        fingerprints.append(
                            example_fingerprints([leaf[replica] for leaf in per_replica])
                        )
                self._record(OverlapStats(fingerprints), step_value)

            run_if(probe.sampled(step_value), sample, as_function=probe.branches_as_functions)
        except Exception as error:  # noqa: BLE001
            probe.warn_failed("data", error)

    def _record(self, stats, step_value):
        """Window sums, in-graph write and state of one sampled step."""
        probe = self.probe
        state = self.state
        counters = tf.unstack(state["counters"].read_value())
        fresh = tf.equal(counters[_WIN_COUNT], 0)

        def accumulate(name, value):
            return tf.where(fresh, tf.zeros_like(value), state[name]) + value

        ones = tf.ones_like(stats.distinct)
        any_shared = tf.linalg.set_diag(tf.cast(stats.shared > 0, tf.int64), ones)
        win_dup = accumulate("win_dup", stats.duplicated)
        win_shared = accumulate("win_shared", stats.shared)
        win_steps = accumulate("win_steps", any_shared)
        column = functools.partial(tf.expand_dims, axis=1)
        examples = tf.concat(
            [
                column(stats.batch_size),
                column(stats.distinct),
                column(stats.duplicated),
                column(win_dup),
                stats.sketch,
            ],
            axis=1,
        )
        overlap = tf.stack([stats.shared, win_shared, win_steps])
        if probe.update_freq is None:
            count = counters[_WIN_COUNT] + 1
        else:
            write = probe.gated(probe.logged(step_value))
            self._write(examples, overlap, step_value, write)
            count = tf.where(write, tf.constant(0, tf.int64), counters[_WIN_COUNT] + 1)
        for name, value in (
            ("last_examples", examples),
            ("last_overlap", overlap),
            ("win_dup", win_dup),
            ("win_shared", win_shared),
            ("win_steps", win_steps),
        ):
            state[name].assign(value)
        state["counters"].assign(tf.stack([step_value, count]))

    def _write(self, examples, overlap, step, condition):
        self.probe.write_all(
            condition,
            [
                (schema.TAG_DATA_EXAMPLES, lambda: examples, schema.KIND_DATA_EXAMPLES),
                (schema.TAG_DATA_OVERLAP, lambda: _int32(overlap), schema.KIND_DATA_OVERLAP),
            ],
            step,
        )

    def pss_deliver(self, per_worker, step):
        """`ParameterServerStrategy`: every worker's `step`-th step (see `pss.deliver`)."""
        if self.pss_window is None:
            self.pss_window = pss.Window(len(per_worker))
        pss.deliver(self, per_worker, step)

    def pss_fit_step(self, fit):
        """tf_keras `fit` under `ParameterServerStrategy` with `examples=True`: each worker's
        batch, in its step (sampled by its content, `pss.observe`)."""
        return (self.probe.observe_examples if fit.options.examples else None), None

    def write_window(self):
        pss.write_window(self)  # ParameterServerStrategy: the coordinator's window
        counters = self.state.get("counters")
        if counters is None:
            return
        values = counters.numpy()
        if int(values[_WIN_COUNT]) == 0:
            return
        with tf.init_scope():
            self._write(
                self.state["last_examples"].read_value(),
                self.state["last_overlap"].read_value(),
                int(values[_LAST_STEP]),
                True,
            )
        counters.assign(tf.tensor_scatter_nd_update(counters, [[_WIN_COUNT]], [0]))

    def fit_step(self, fit):
        """Keras `fit` with `examples=True`: the step's batch, before the model's step."""
        return (self.probe.observe_examples if fit.options.examples else None), None

    def fit_epoch_begin(self, fit):
        """Keras `fit` with `update_freq="epoch"`: the epoch's last step is sampled too (the
        step written at the epoch end). Unknown epoch length: the last sampled step is written."""
        if not fit.options.examples or fit.options.update_freq != "epoch":
            return
        try:
            if fit.steps_per_epoch:
                self.sample_last_of(fit.steps_per_epoch)
        except Exception as error:  # noqa: BLE001 - never break the training
            self.probe.warn_failed("data", error)


def _int32(counts):
    """int64 counts as the int32 the overlap is written in (version 2), saturating."""
    return tf.cast(tf.minimum(counts, tf.constant(2**31 - 1, tf.int64)), tf.int32)


class Recording:
    """`ReplicaProbe` methods of the examples family."""

    def observe_examples(self, batch, step=None):
        """Records a fingerprint of every example each replica is fed, and their overlaps.

        At sampled steps (every `examples_every` steps and every logged step, see the
        constructor) it hashes, per replica, every example of the batch in-graph
        (`tf.fingerprint`, see `families/examples/record.py`), counts the examples shared with
        each other replica at this step (exact), and keeps a small sketch of the fingerprints
        that can be compared across workers; the other steps only advance the step counter (the
        work sits under a `tf.cond`). Call it like `observe_inputs`: in replica context with the
        local batch, or in cross-replica context with a distributed batch. A failure warns once
        and never stops training.

        Args:
          batch: the (nested) structure of input tensors; every leaf with a leading batch
            dimension is part of an example's fingerprint.
          step: the step to record at; when omitted, the step of the step axis (see
            `observe_inputs`).

        Example:
          ```python
          def step_fn(x, y):
              probe.observe_examples({"x": x, "y": y})
              ...
          ```

        Under `ParameterServerStrategy`, call it in a step given to `probe.schedule`: a batch is
        sampled from its content, so workers fed the same batch are compared whatever their
        steps (docs/parameter-server.md).
        """
        if self.pss_capturing():  # a step given to `schedule` (ParameterServerStrategy)
            try:
                pss.observe(self, batch)
            except Exception as error:  # noqa: BLE001 - must never break training
                self.warn_failed("data", error)
            return
        if not self.build():
            return
        recorder = self.recorder("examples")
        try:
            leaves = [leaf for _, leaf in flatten_with_names(batch)]
            if not leaves:
                self.warn_once("data_none", "tb_replica_plugin: observe_examples got no tensors.")
                return
            # The fingerprints are computed in the merge, on each replica's device, under the
            # sampling tf.cond.
            self.merge_leaves(functools.partial(recorder.merge, step=step), leaves)
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn_failed("data", error)
