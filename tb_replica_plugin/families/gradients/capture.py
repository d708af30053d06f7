"""Culprit capture, write side: a replica's local batch at the step its gradients turn non-finite.

The gradients recorder calls `capture_blocks` inside the `tf.cond` that only runs at a step where
some replica's gradients or loss are not finite, so a clean step pays nothing. Each captured
replica gives one block of the `gradients/batch` string vector (layout in `schema`): a JSON
header, then per input leaf its full shape and its first rows, as serialized `TensorProto`s, which
the read side decodes without TensorFlow.
"""

import json

import tensorflow as tf

# Defaults of `ReplicaCallback` / `ReplicaProbe`: at most this many captured steps per run, and
# this many bytes per captured replica batch (shared evenly by its leaves).
DEFAULT_CAPTURE_LIMIT = 3
DEFAULT_CAPTURE_BYTES = 4 * 1024 * 1024


def check_capture(capture_limit, capture_bytes):
    """Raises ValueError unless `capture_limit` is an int >= 0 and `capture_bytes` an int >= 1."""
    if isinstance(capture_limit, bool) or not isinstance(capture_limit, int) or capture_limit < 0:
        raise ValueError(
            f"`capture_limit` must be an integer >= 0 (0: no capture). Received: {capture_limit!r}"
        )
    if isinstance(capture_bytes, bool) or not isinstance(capture_bytes, int) or capture_bytes < 1:
        raise ValueError(f"`capture_bytes` must be an integer >= 1. Received: {capture_bytes!r}")


def _leaf_bytes(leaf):
    """int64 bytes of `leaf` (string leaves: the sum of their lengths plus one per element)."""
    if leaf.dtype == tf.string:
        lengths = tf.strings.length(leaf)
        return tf.cast(tf.reduce_sum(lengths) + tf.size(leaf), tf.int64)
    return tf.cast(tf.size(leaf), tf.int64) * leaf.dtype.size


def _fixed_row_count(leaf, budget):
    """How many rows of `leaf` fit `budget` bytes when its row size is known while tracing (the
    usual case: the row count is a constant, one slice to trace), else None."""
    row_shape = leaf.shape[1:]
    if leaf.dtype == tf.string or not row_shape.is_fully_defined():
        return None
    per_row = max(row_shape.num_elements() * leaf.dtype.size, 1)
    return max(budget // per_row, 1)


def kept_rows(leaf, budget):
    """The first rows of `leaf` that fit `budget` bytes (at least one row; rank 0: all of it).

    Args:
      leaf: one replica's input tensor.
      budget: the leaf's byte budget (int).

    Returns:
      The kept rows (a tensor).
    """
    if leaf.shape.rank == 0:
        return leaf
    fixed = _fixed_row_count(leaf, budget)
    if fixed is not None:
        return leaf[:fixed]
    budget = tf.constant(budget, tf.int64)
    rows = tf.cast(tf.shape(leaf, out_type=tf.int64)[0], tf.int64)
    per_row = tf.maximum(_leaf_bytes(leaf) // tf.maximum(rows, 1), 1)
    keep = tf.minimum(rows, tf.maximum(budget // per_row, 1))
    return leaf[:keep]


def _header(replica, names, leaves, capture_bytes):
    """The JSON header of one replica's block."""
    return json.dumps(
        {
            "replica": int(replica),
            "names": list(names),
            "dtypes": [leaf.dtype.name for leaf in leaves],
            "leaves": len(leaves),
            "capture_bytes": int(capture_bytes),
        },
        sort_keys=True,
    )


def _row_slicer(values, budget):
    """`fn(leaf)`: `kept_rows` of one leaf's replica tensors. Where every replica's rows have the
    same known size, every slice shares one set of bounds (fewer ops to trace)."""
    first = values[0]
    fixed = _fixed_row_count(first, budget) if first.shape.rank else None
    if fixed is None or any(
        v.dtype != first.dtype or v.shape[1:] != first.shape[1:] for v in values
    ):
        return lambda leaf: kept_rows(leaf, budget)
    begin, end, strides = (tf.constant([n]) for n in (0, fixed, 1))
    return lambda leaf: tf.strided_slice(leaf, begin, end, strides)


def capture_blocks(replicas, names, batch, capture_bytes, devices):
    """Every local replica's block of the `gradients/batch` vector (string [R, 1 + 2 * L]).

    Row `r` is replica `r`'s block: the JSON header, then per leaf the serialized full shape and
    kept rows (at least one row; each leaf gets an equal share of `capture_bytes`).

    Args:
      replicas: the local replicas' global ids.
      names: the input leaf names.
      batch: `[R][L]` the replicas' local input tensors, one per name.
      capture_bytes: the byte budget of one replica's batch.
      devices: the replicas' devices (each replica's rows are serialized on its own).

    Returns:
      A string tensor of one block per local replica.

    Example:
      >>> blocks = capture_blocks([0, 1], ["x"], [[tf.ones([3, 2])], [tf.ones([1, 2])]], 64,
      ...                         [None, None])
      >>> tf.io.parse_tensor(blocks[1, 1], tf.int64).numpy()
      array([1, 2])
    """
    count = len(batch)
    batch = [[tf.convert_to_tensor(leaf) for leaf in leaves] for leaves in batch]
    budget = max(int(capture_bytes) // max(len(names), 1), 1)
    headers = [_header(replicas[r], names, batch[r], capture_bytes) for r in range(count)]
    columns = [[tf.constant(header) for header in headers]]
    for values in zip(*batch, strict=True):
        values = list(values)
        if len({v.dtype for v in values}) == 1:
            shapes = tf.shape_n(values, out_type=tf.int64)  # one op for every replica
        else:
            shapes = [tf.shape(v, out_type=tf.int64) for v in values]
        rows_of = _row_slicer(values, budget)
        shape_parts, row_parts = [], []
        for replica in range(count):
            with tf.device(devices[replica]):
                shape_parts.append(tf.io.serialize_tensor(shapes[replica]))
                row_parts.append(tf.io.serialize_tensor(rows_of(values[replica])))
        columns.extend([shape_parts, row_parts])
    return tf.stack([tf.stack(column) for column in columns], axis=1)
