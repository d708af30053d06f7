"""In-graph helpers for a family that handles every replica's tensors in one set of ops.

Tracing costs CPU per op, and a merge function that loops over replicas traces its ops once per
replica. At sampled steps a family can instead join the replicas' tensors on the host CPU and
reduce them by segment (the replica), which traces one set of ops whatever the replica count.
"""

import tensorflow as tf


def leading_dims(values):
    """int64 [R]: the leading dimension of each tensor of `values` (all of rank >= 1).

    Example:
      >>> leading_dims([tf.zeros([3, 2]), tf.zeros([0, 2])]).numpy()
      array([3, 0])
    """
    return tf.stack(tf.shape_n(values, out_type=tf.int64))[:, 0]


def segment_ids(sizes):
    """int32 [sum(sizes)]: `i` repeated `sizes[i]` times (fewer ops than `tf.repeat`).

    Example:
      >>> segment_ids(tf.constant([2, 0, 1], tf.int64)).numpy()
      array([0, 0, 2], dtype=int32)
    """
    ends = tf.cumsum(sizes)
    positions = tf.range(tf.reduce_sum(sizes), dtype=sizes.dtype)
    # `tf.searchsorted(ends, positions, side="right")` without its reshapes.
    ids = tf.raw_ops.UpperBound(
        sorted_inputs=tf.expand_dims(ends, 0),
        values=tf.expand_dims(positions, 0),
        out_type=tf.int32,
    )
    return tf.reshape(ids, [-1])
