"""Culprit capture, write side: a replica's local batch at the step its gradients turn non-finite.

The gradients recorder calls `capture_block` inside the `tf.cond` that only runs at a step where
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
    row_shape = leaf.shape[1:]
    if leaf.dtype != tf.string and row_shape.is_fully_defined():
        # Known row size (the usual case): the row count is a constant, one slice to trace.
        per_row = max(row_shape.num_elements() * leaf.dtype.size, 1)
        return leaf[: max(budget // per_row, 1)]
    budget = tf.constant(budget, tf.int64)
    rows = tf.cast(tf.shape(leaf, out_type=tf.int64)[0], tf.int64)
    per_row = tf.maximum(_leaf_bytes(leaf) // tf.maximum(rows, 1), 1)
    keep = tf.minimum(rows, tf.maximum(budget // per_row, 1))
    return leaf[:keep]


def capture_block(replica, names, leaves, capture_bytes):
    """One replica's block of the `gradients/batch` vector (string [1 + 2 * L]).

    Args:
      replica: the replica's global id.
      names: the input leaf names.
      leaves: the replica's local input tensors, one per name.
      capture_bytes: the byte budget of this replica's batch (each leaf gets an equal share).

    Returns:
      A string tensor: the JSON header, then per leaf the serialized full shape and kept rows.
    """
    leaves = [tf.convert_to_tensor(leaf) for leaf in leaves]
    header = json.dumps(
        {
            "replica": int(replica),
            "names": list(names),
            "dtypes": [leaf.dtype.name for leaf in leaves],
            "leaves": len(leaves),
            "capture_bytes": int(capture_bytes),
        },
        sort_keys=True,
    )
    budget = max(int(capture_bytes) // max(len(leaves), 1), 1)
    parts = [tf.constant(header)]
    for leaf in leaves:
        parts.append(tf.io.serialize_tensor(tf.shape(leaf, out_type=tf.int64)))
        parts.append(tf.io.serialize_tensor(kept_rows(leaf, budget)))
    return tf.stack(parts)
