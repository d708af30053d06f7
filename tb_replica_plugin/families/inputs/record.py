"""Inputs family, write side: per-replica batch size, shape and dtype of every input leaf.

Every step, per replica, the shapes of the input leaves are packed into one small int64 vector on
the replica's device; in cross-replica context they give the batch sizes (the leading dimension of
the first leaf) and one fingerprint of every shape and dtype. The shapes are formatted to JSON
in-graph only at a step whose fingerprint differs from the previous step's (`inputs/shapes`, a
sparse event, so an odd batch is never lost to sampling). The dense `inputs/batch_size` series
keeps per-window minima and maxima. In a multi-worker job this family also records the step time
(`workers/step_time`: the step_time family's data).
"""

import functools
import hashlib
import json
import math

import tensorflow as tf

from tb_replica_plugin.core.nest import flatten_with_names
from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from tb_replica_plugin.families.inputs import schema
from tb_replica_plugin.families.step_time import schema as step_time_schema

# Names Keras gives to the parts of a `fit` batch, in `unpack_x_y_sample_weight` order.
FIT_BATCH_NAMES = ("x", "y", "sample_weight")

# Kinds of leaf: a dense tensor, a `tf.RaggedTensor`, a `tf.SparseTensor`.
DENSE, RAGGED, SPARSE = "dense", "ragged", "sparse"
# The size recorded for a ragged dimension (its row lengths vary within the leaf).
RAGGED_DIM = -1


def leaf_kind(value):
    """ "dense", "ragged" (`tf.RaggedTensor`) or "sparse" (`tf.SparseTensor`)."""
    if isinstance(value, tf.RaggedTensor):
        return RAGGED
    if isinstance(value, tf.SparseTensor):
        return SPARSE
    return DENSE


def as_leaf(value):
    """`value` as a tensor, a `tf.RaggedTensor` or a `tf.SparseTensor` (others converted)."""
    if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
        return value
    return tf.convert_to_tensor(value)


def leaf_rank(value):
    """The static rank of a leaf (None when only known at run time)."""
    if isinstance(value, tf.RaggedTensor):
        inner = value.flat_values.shape.rank
        return None if inner is None else value.ragged_rank + inner
    return value.shape.rank


def shape_vector(value):
    """int64 [rank]: the shape of one leaf as recorded.

    Dense: `tf.shape`. Sparse: `dense_shape`. Ragged: `[nrows, -1 for each ragged dimension,
    the uniform inner dimensions of flat_values]`, so a ragged leaf's shape changes only when its
    row count or structure does, not with its row lengths.

    Example:
      >>> shape_vector(tf.ragged.constant([[1, 2], [3]])).numpy()
      array([ 2, -1])
    """
    if isinstance(value, tf.RaggedTensor):
        return tf.concat(
            [
                tf.reshape(value.nrows(out_type=tf.int64), [1]),
                tf.fill([value.ragged_rank], tf.constant(RAGGED_DIM, tf.int64)),
                tf.shape(value.flat_values, out_type=tf.int64)[1:],
            ],
            axis=0,
        )
    if isinstance(value, tf.SparseTensor):
        return tf.cast(value.dense_shape, tf.int64)
    return tf.shape(value, out_type=tf.int64)


def structure_vector(value):
    """int64 [3]: what one leaf holds at this step, besides its shape.

    Ragged: (total values in `flat_values`, shortest row, longest row) of the outermost ragged
    dimension (0, 0 without rows). Sparse: (nnz, -1, -1). Dense: (size, -1, -1).

    Example:
      >>> structure_vector(tf.ragged.constant([[1, 2], [3]])).numpy()
      array([3, 1, 2])
    """
    none = tf.constant(-1, tf.int64)
    if isinstance(value, tf.RaggedTensor):
        lengths = tf.cast(value.row_lengths(), tf.int64)
        has_rows = tf.size(lengths) > 0
        zero = tf.constant(0, tf.int64)
        shortest = tf.where(has_rows, tf.reduce_min(lengths), zero)
        longest = tf.where(has_rows, tf.reduce_max(lengths), zero)
        return tf.stack([tf.size(value.flat_values, out_type=tf.int64), shortest, longest])
    if isinstance(value, tf.SparseTensor):
        return tf.stack([tf.shape(value.indices, out_type=tf.int64)[0], none, none])
    return tf.stack([tf.size(value, out_type=tf.int64), none, none])


def name_fit_batch(data):
    """Names the parts of a Keras `fit` batch `(x,)`, `(x, y)` or `(x, y, sample_weight)`.

    Args:
      data: the batch as `train_step` receives it.

    Returns:
      A dict `{"x": ..., "y": ..., "sample_weight": ...}` without the missing parts.
    """
    if isinstance(data, tuple) and not hasattr(data, "_fields") and 1 <= len(data) <= 3:
        return {
            name: part
            for name, part in zip(FIT_BATCH_NAMES, data, strict=False)
            if part is not None
        }
    return {"x": data}


class InputsStats:
    """The inputs family for one step, computed from per-replica leaves in cross-replica context.

    Each replica's shapes are packed into one int64 vector on that replica's device, so a step
    moves one small tensor per replica to the merge point, whatever the number of inputs.

    Args:
      names: input names, one per leaf.
      per_replica_leaves: `per_replica_leaves[l][r]` is the tensor of leaf `l` on replica `r`.
      devices: optional device of each replica, where its shape vector is computed.

    Attributes:
      batch_size: int32 tensor [R], leading dimension of the first leaf of rank >= 1 (0 for a
        replica whose leaf is empty, 1 if every leaf is a scalar).
      fingerprint: int64 scalar tensor, changes whenever any shape or dtype on any replica changes.
    """

    def __init__(self, names, per_replica_leaves, devices=None):
        self.names = list(names)
        self.num_replicas = len(per_replica_leaves[0]) if per_replica_leaves else 0
        self.leaves = per_replica_leaves
        self.dtypes = [[t.dtype.name for t in leaf] for leaf in per_replica_leaves]
        self.kinds = [[leaf_kind(t) for t in leaf] for leaf in per_replica_leaves]
        devices = list(devices or [None] * self.num_replicas)
        self._devices = devices
        # ranks[r][l]: static rank, or None when only known at run time.
        self._ranks = [
            [leaf_rank(leaf[r]) for leaf in per_replica_leaves] for r in range(self.num_replicas)
        ]
        vectors = []
        for replica in range(self.num_replicas):
            with tf.device(devices[replica]):
                pieces = []
                for leaf, rank in zip(per_replica_leaves, self._ranks[replica], strict=True):
                    shape = shape_vector(leaf[replica])
                    if rank is None:  # the rank goes in front, so [4, 3] and [43] cannot collide
                        pieces.append(tf.reshape(tf.size(shape, out_type=tf.int64), [1]))
                    pieces.append(shape)
                vectors.append(tf.concat(pieces, axis=0) if pieces else tf.zeros([0], tf.int64))
        self._vectors = vectors
        # Every replica's vector has one static layout (the usual case): the vectors stacked,
        # so that a column (one dimension of one leaf) is one slice, not one per replica.
        ranks = self._ranks[0] if self._ranks else []
        uniform = bool(vectors) and None not in ranks and all(r == ranks for r in self._ranks)
        self._matrix = tf.stack(vectors) if uniform else None  # int64 [R, D]
        self._offsets = [sum(ranks[:index]) for index in range(len(ranks))] if uniform else None
        self.batch_size = self._batch_size()
        self.fingerprint = self._fingerprint()

    def _leaf_shape(self, replica, leaf):
        """Shape of one leaf on one replica, sliced from that replica's vector (run-time rank
        leaves carry their rank in front)."""
        offset = 0
        vector = self._vectors[replica]
        for index, rank in enumerate(self._ranks[replica]):
            if rank is None:
                size = vector[offset]
                if index == leaf:
                    return vector[offset + 1 : offset + 1 + size]
                offset = offset + 1 + size
            else:
                if index == leaf:
                    return vector[offset : offset + rank]
                offset = offset + rank
        raise IndexError(leaf)

    def _batch_size(self):
        for leaf in range(len(self.names)):
            ranks = [self._ranks[r][leaf] for r in range(self.num_replicas)]
            if ranks and all(rank is None or rank >= 1 for rank in ranks):
                if self._matrix is not None:
                    return tf.cast(self._matrix[:, self._offsets[leaf]], tf.int32)
                # A run-time rank of 0 would make [0] fail; such inputs are rare (scalars).
                return tf.cast(
                    tf.stack([self._leaf_shape(r, leaf)[0] for r in range(self.num_replicas)]),
                    tf.int32,
                )
        return tf.ones([self.num_replicas], tf.int32)

    def _fingerprint(self):
        static = json.dumps([self.names, self.dtypes, self.kinds, self._ranks]).encode("utf-8")
        static_hash = int.from_bytes(hashlib.blake2b(static, digest_size=7).digest(), "little")
        if self._matrix is not None:
            # The same signature, with the vectors' lengths known when tracing.
            head = [static_hash] + [sum(self._ranks[0])] * self.num_replicas
            signature = tf.concat([tf.constant(head, tf.int64), tf.reshape(self._matrix, [-1])], 0)
        else:
            lengths = [tf.reshape(tf.size(v, out_type=tf.int64), [1]) for v in self._vectors]
            signature = tf.concat(
                [tf.constant([static_hash], tf.int64), *lengths, *self._vectors], 0
            )
        digest = tf.fingerprint(tf.expand_dims(tf.bitcast(signature, tf.uint8), 0))
        return tf.reshape(tf.bitcast(digest, tf.int64), [])

    def shapes_json(self, static_fields, key="inputs"):
        """Builds the JSON document of a shapes event as a scalar string tensor.

        Args:
          static_fields: dict of JSON-serialisable fields known when tracing (devices, replica
            ids, source) merged into the document.
          key: the document's key of the list of leaves.

        Returns:
          A scalar tf.string tensor, e.g. `{"inputs": [{"name": "x", "dtypes": ["float32"],
          "shapes": [[4, 3]]}], "devices": [...], ...}`. A ragged or sparse leaf also has
          `kinds` (per replica) and `structure` (per replica, `structure_vector`: total values
          and row-length range, or nnz).
        """
        head = json.dumps(static_fields, sort_keys=True)[:-1]
        pieces = [head, f'{", " if static_fields else ""}"{key}": [']
        # One static layout: every replica's shape of a leaf formatted in one set of ops.
        uniform = self._matrix is not None
        if uniform:
            ranks, offsets = self._ranks[0], self._offsets
            strings = tf.strings.as_string(self._matrix)  # [R, D]
        for index, (name, dtypes) in enumerate(zip(self.names, self.dtypes, strict=True)):
            fields = {"name": name, "dtypes": dtypes}
            kinds = self.kinds[index]
            if any(kind != DENSE for kind in kinds):
                fields["kinds"] = kinds
            head = json.dumps(fields)[:-1] + ', "shapes": ['
            pieces.append(("" if index == 0 else ", ") + head)
            if uniform:
                rank, offset = ranks[index], offsets[index]
                if rank == 0:
                    pieces.append(", ".join(["[]"] * self.num_replicas))
                else:
                    rows = tf.strings.reduce_join(
                        strings[:, offset : offset + rank], axis=1, separator=", "
                    )
                    pieces.extend(["[", tf.strings.reduce_join(rows, separator="], ["), "]"])
            else:
                for replica in range(self.num_replicas):
                    shape = tf.strings.as_string(self._leaf_shape(replica, index))
                    pieces.append("[" if replica == 0 else ", [")
                    pieces.append(tf.strings.reduce_join(shape, separator=", "))
                    pieces.append("]")
            pieces.append("]")
            if "kinds" in fields:
                # What each replica's ragged or sparse leaf holds at this step.
                pieces.append(', "structure": [')
                for replica in range(self.num_replicas):
                    with tf.device(self._devices[replica]):
                        vector = structure_vector(self.leaves[index][replica])
                    pieces.append("[" if replica == 0 else ", [")
                    pieces.append(
                        tf.strings.reduce_join(tf.strings.as_string(vector), separator=", ")
                    )
                    pieces.append("]")
                pieces.append("]")
            pieces.append("}")
        pieces.append("]}")
        return tf.strings.join(pieces)


# Slots of the packed int64 counters: next step, has a previous step, its fingerprint, last step,
# steps in the window.
_STEP, _HAS_PREV, _PREV_FP, _LAST_STEP, _WIN_COUNT = range(5)
# Slots of the float64 timing variable of a multi-worker worker's probe.
_LAST_TIME, _LAST_PERIOD, _WIN_TIME, _WIN_STEPS = range(4)


class Recorder(RecorderBase):
    """State and writes of the inputs family (and of the step time of a multi-worker job)."""

    name = "inputs"

    def create_state(self):
        probe = self.probe
        start = int(self._start_step)
        # Packed so that a step reads and writes each variable once.
        self.variable("counters", [start, 0, 0, -1, 0], tf.int64)
        # rows: batch size at the last step, window minimum, window maximum
        self.variable("window", tf.zeros([3, probe.num_replicas], tf.int32))
        if probe.worker is not None:
            # Step timing (multi-worker jobs only), wall-clock seconds, NaN until known:
            # last arrival, last period, arrival at the window start, steps in window.
            self.variable("timing", [math.nan, math.nan, math.nan, 0.0], tf.float64)

    def warn(self, error):
        self.probe.warn_failed("inputs", error)

    def merge(self, strategy, leaves, *, names, step):
        """Cross-replica part of `observe_inputs`: stats, change detection, summary writes."""
        probe = self.probe
        try:
            per_replica = [probe.local_values(strategy, leaf, composite=True) for leaf in leaves]
            stats = InputsStats(names, per_replica, probe.static["devices"])
            now = None
            if probe.worker is not None:
                # Host wall-clock time once this step's inputs are ready (cheap, CPU, no sync).
                with tf.control_dependencies([t for leaf in per_replica for t in leaf]):
                    now = tf.timestamp()
            self._write(stats, step, now)
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _write(self, stats, step, now=None):
        probe = self.probe
        # Unstacked: one op per variable, not one slice per use.
        counters = tf.unstack(self.state["counters"].read_value())
        window = tf.unstack(self.state["window"].read_value())
        if step is None:
            step_value = counters[_STEP]
            next_step = step_value + 1
        else:
            step_value = tf.cast(step, tf.int64)
            next_step = counters[_STEP]
        changed = tf.logical_or(
            tf.equal(counters[_HAS_PREV], 0), tf.not_equal(counters[_PREV_FP], stats.fingerprint)
        )
        batch_size = stats.batch_size
        window_empty = tf.equal(counters[_WIN_COUNT], 0)
        win_min = tf.where(window_empty, batch_size, tf.minimum(window[1], batch_size))
        win_max = tf.where(window_empty, batch_size, tf.maximum(window[2], batch_size))
        static = probe.static
        recording = probe.recording()
        probe.write(
            tf.logical_and(changed, recording),
            schema.TAG_SHAPES,
            lambda: stats.shapes_json(static),
            step_value,
            schema.KIND_SHAPES,
        )
        if probe.update_freq is None:
            # Host-written only (e.g. at epoch ends): no dense write op in the step's graph.
            next_count = counters[_WIN_COUNT] + 1
            write_dense = tf.constant(False)
        else:
            write_dense = probe.logged(step_value)
            probe.write(
                tf.logical_and(write_dense, recording),
                schema.TAG_BATCH_SIZE,
                lambda: tf.stack([batch_size, win_min, win_max]),
                step_value,
                schema.KIND_BATCH_SIZE,
            )
            next_count = tf.where(write_dense, tf.constant(0, tf.int64), counters[_WIN_COUNT] + 1)
        if now is not None:
            self._record_time(now, step_value, write_dense, recording)
        one = tf.constant(1, tf.int64)
        self.state["counters"].assign(
            tf.stack([next_step, one, stats.fingerprint, step_value, next_count])
        )
        self.state["window"].assign(tf.stack([batch_size, win_min, win_max]))

    def _record_time(self, now, step, write, recording):
        """Step timing of a multi-worker job: arrival time, period, window mean (in-graph)."""
        timing = self.state["timing"]
        last_time, _, win_time, win_steps = tf.unstack(timing.read_value())
        period = now - last_time
        steps = win_steps + 1.0
        mean = (now - win_time) / steps
        if self.probe.update_freq is not None:
            self.probe.write(
                tf.logical_and(write, recording),
                step_time_schema.TAG_STEP_TIME,
                lambda: tf.stack([now, period, mean]),
                step,
                step_time_schema.KIND_STEP_TIME,
            )
        timing.assign(
            tf.stack(
                [
                    now,
                    period,
                    tf.where(write, now, win_time),
                    tf.where(write, tf.constant(0.0, tf.float64), steps),
                ]
            )
        )

    def write_window(self):
        counters = self.state.get("counters")
        if counters is None:
            return
        values = counters.numpy()
        if int(values[_WIN_COUNT]) == 0:
            return
        window = self.state["window"]
        step = int(values[_LAST_STEP])
        self.probe.write_now(schema.TAG_BATCH_SIZE, window.read_value, step, schema.KIND_BATCH_SIZE)
        counters.assign(tf.tensor_scatter_nd_update(counters, [[_WIN_COUNT]], [0]))
        self._write_time_window(step)

    def _write_time_window(self, step):
        """Host side: the step time of the last step of a window that had no in-graph write."""
        timing = self.state.get("timing")
        if timing is None or float(timing.numpy()[_WIN_STEPS]) == 0:
            return
        last, period, start, steps = (float(v) for v in timing.numpy())
        self.probe.write_now(
            step_time_schema.TAG_STEP_TIME,
            lambda: tf.constant([last, period, (last - start) / steps], tf.float64),
            step,
            step_time_schema.KIND_STEP_TIME,
        )
        timing.assign([last, period, last, 0.0])

    def last_step(self):
        counters = self.state.get("counters")
        if counters is None:
            return None
        step = int(counters.numpy()[_LAST_STEP])
        return None if step < 0 else step


class Recording:
    """`ReplicaProbe` methods of the inputs family."""

    def observe_inputs(self, batch, step=None):
        """Records the batch size and the shape and dtype of every input leaf, per replica.

        Call it in replica context (inside `strategy.run`) with the replica's local batch, or in
        cross-replica context with the distributed batch (leaves are `PerReplica` values).
        Nested dicts, lists and tuples are named by their path ("x/image", "0"); pass a dict to
        choose names. A failure inside the probe warns once and never stops training.

        Args:
          batch: the (nested) structure of input tensors.
          step: the step to record at (int or int tensor). When omitted, the probe counts calls:
            the first call records step 0 (or what `set_step` set), the next step 1, and so on.

        Example:
          ```python
          def step_fn(x, y):
              probe.observe_inputs({"x": x, "y": y})  # replica context
              ...
          ```
        """
        if not self.build():
            return
        recorder = self.recorder("inputs")
        try:
            names_and_leaves = flatten_with_names(batch)
            names = [name for name, _ in names_and_leaves]
            leaves = [leaf for _, leaf in names_and_leaves]
            if not leaves:
                self.warn_once("no_inputs", "tb_replica_plugin: observe_inputs got no tensors.")
                return
            self.merge_leaves(functools.partial(recorder.merge, names=names, step=step), leaves)
        except Exception as error:  # noqa: BLE001 - must never break training
            recorder.warn(error)

    def last_step(self):
        """The step of the latest `observe_inputs` call (host side), or None before any (or
        once the probe is closed)."""
        return self.recorder("inputs").last_step()

    def next_step(self):
        """The step the next `observe_inputs` call without `step=` would record at (host side).

        Returns:
          An int, or None before the probe is built or after it is closed.
        """
        return self.recorder("inputs").next_step()
