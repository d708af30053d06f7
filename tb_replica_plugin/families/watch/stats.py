"""The watch family's small stats of one leaf (`schema.STAT_ROWS`), on a replica's device and on
the host.

Per replica and step, each dense numeric leaf sends four values in the step's transfer
(`packed_values`: its sum, which also tells whether every value is finite, and its minimum,
maximum and L2 norm, four reductions in its own float dtype). Where every value is finite these
are its stats; where one is not, the replica's fault branch (`core.transfer`) computes the exact
`leaf_stats` on its device. The host builds the `[L, STATS, R]` tensor (`host_stats`) only at
the steps it writes one. Ragged and sparse leaves (custom loops) are read by the host as they are
(`leaf_stats` there).
"""

import tensorflow as tf

from tb_replica_plugin.families.watch import schema

_NAN = float("nan")
ROW = {name: index for index, name in enumerate(schema.STAT_ROWS)}
# What a packed leaf sends per replica, in order.
PACKED = ("sum", "min", "max", "l2")


def leaf_values(value):
    """The stored values of a leaf: a ragged leaf's flat values, a sparse leaf's values, else
    the leaf itself."""
    if isinstance(value, tf.RaggedTensor):
        return value.flat_values
    if isinstance(value, tf.SparseTensor):
        return value.values
    return value


def is_numeric(dtype):
    return dtype.is_floating or dtype.is_integer or dtype.is_bool


def packable(values):
    """Whether one leaf's replica tensors send packed stats: dense and numeric on every
    replica."""
    return all(
        not isinstance(v, (tf.RaggedTensor, tf.SparseTensor)) and is_numeric(v.dtype)
        for v in values
    )


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
    values = leaf_values(value)
    numeric = is_numeric(values.dtype)
    values = tf.cast(tf.reshape(values, [-1]), tf.float64) if numeric else None
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


def packed_values(value):
    """The `PACKED` values of one replica's dense numeric leaf, reduced on its device: float
    scalars in the leaf's float dtype (float64 for integers and booleans), over every value. Its
    sum is finite exactly when every value is (short of overflow); with its size, the four are
    its stats where every value is finite."""
    if not value.dtype.is_floating:
        value = tf.cast(value, tf.float64)
    return [
        tf.reduce_sum(value),
        tf.reduce_min(value),
        tf.reduce_max(value),
        tf.math.reduce_euclidean_norm(value),
    ]


def host_stats(packed, sizes, nrows, exact, broken):
    """float64 [L, STATS, R]: the packed leaves' stats on every replica (host side).

    Args:
      packed: float64 [R, L * len(PACKED)], each leaf's `packed_values`.
      sizes: float64 [L, R], each leaf's number of values.
      nrows: float64 [L, R], each leaf's leading dimension (1 for a scalar).
      exact: float64 [R, L * STATS], `leaf_stats` from the fault branch (zeros where it did
        not run), or None.
      broken: bool [R], where the fault branch computed them.

    Returns:
      The stats from the packed values where every value of the replica's leaves is finite,
      the exact ones elsewhere.
    """
    count = sizes.shape[0]
    values = tf.reshape(packed, [-1, count, len(PACKED)])  # [R, L, 4]
    sizes_rl = tf.transpose(sizes)  # [R, L]
    some = sizes_rl > 0
    nan = tf.constant(_NAN, tf.float64)
    moments = [
        tf.where(some, values[:, :, 1], nan),
        tf.where(some, values[:, :, 2], nan),
        tf.where(some, values[:, :, 0] / tf.maximum(sizes_rl, 1.0), nan),
        tf.where(some, values[:, :, 3], nan),
    ]
    zeros = tf.zeros_like(sizes_rl)
    ragged = tf.fill(tf.shape(sizes_rl), nan)
    rows = [*moments, zeros, zeros, sizes_rl, tf.transpose(nrows), ragged, ragged]
    stats = tf.stack(rows, axis=2)  # [R, L, STATS]
    if exact is not None:
        exact = tf.reshape(exact, [-1, count, len(schema.STAT_ROWS)])
        stats = tf.where(broken[:, None, None], exact, stats)
    return tf.transpose(stats, [1, 2, 0])


def string_stats(sizes, nrows):
    """float64 [STATS, R] of a leaf with no numeric stats (e.g. strings): NaN moments, no NaN
    or Inf, its number of values and leading dimension (float64 [R] each)."""
    nan = tf.fill(tf.shape(sizes), tf.constant(_NAN, tf.float64))
    zeros = tf.zeros_like(sizes)
    return tf.stack([nan, nan, nan, nan, zeros, zeros, sizes, nrows, nan, nan])
