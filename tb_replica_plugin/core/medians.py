"""The median of the other replicas, for every replica at once: `median_of_others`.

The gradients' ratio to the median and the slow-replica rule compare each replica with the
median of the others at the same step or worker. Pure numpy.
"""

import numpy as np

__all__ = ["median_of_others"]


def median_of_others(values):
    """float64 [S, R]: `nanmedian` of each row without column r, for every r at once.

    Rows without NaN (the usual case) take `_median_of_others_full`, bit for bit `np.median` of
    the others; the others are sorted.

    Args:
      values: float array [S, R].

    Returns:
      The medians; NaN where no other value is finite or NaN-free.

    Example:
      >>> median_of_others(np.array([[1.0, 2.0, 4.0]])).tolist()
      [[3.0, 2.5, 1.5]]
    """
    full = ~np.isnan(values).any(axis=1)
    if full.all():
        return _median_of_others_full(values)
    medians = np.empty(values.shape, np.float64)
    medians[full] = _median_of_others_full(values[full])
    medians[~full] = _median_of_others_sorted(values[~full])
    return medians


def _median_of_others_full(values):
    """`median_of_others` of rows without NaN, from 4 order statistics per row.

    Leaving one of R values out leaves R - 1, whose middle positions a <= b are those of the
    row's order statistics v[a], v[b] when the value left out is above v[b], v[a + 1], v[b + 1]
    when it is at most v[a], and v[a], v[b + 1] in between (R - 1 even). Equal values leave the
    same others, so comparing the value with v[a] and v[b] picks the case. A partition per row
    instead of a sort.
    """
    width = values.shape[1]
    low, high = (width - 2) // 2, (width - 1) // 2  # the middle positions of R - 1 values
    kth = sorted({low, low + 1, high, high + 1})
    part = np.partition(values, kth, axis=1)
    v_low, v_low1 = part[:, low, None], part[:, low + 1, None]
    v_high, v_high1 = part[:, high, None], part[:, high + 1, None]
    if low == high:  # an odd count of others: one middle value
        above, below, between = v_high, v_low1, v_high
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            above, below, between = (
                (v_low + v_high) / 2,
                (v_low1 + v_high1) / 2,
                (v_low + v_high1) / 2,
            )
    # One [S, R] array written case by case, the first case of the nested test written last.
    medians = np.empty(values.shape, np.result_type(above, below, between))
    np.copyto(medians, between)
    with np.errstate(invalid="ignore"):
        np.copyto(medians, below, where=values <= v_low)
        np.copyto(medians, above, where=values > v_high)
    return medians


def _median_of_others_sorted(values):
    """`median_of_others` of any rows.

    Sorts each row once (NaN last); leaving out the value at sorted position p shifts the
    positions after it by one, so the median of the others is read at one or two positions
    (the mean of the two middle values for an even count, as `np.nanmedian`). NaN where no other
    value is finite or NaN-free.
    """
    count, width = values.shape
    order = np.argsort(values, axis=1, kind="stable")
    ordered = np.take_along_axis(values, order, axis=1)
    valid = ~np.isnan(values)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(width), (count, width)), axis=1)
    total = valid.sum(axis=1, keepdims=True)
    others = total - valid  # values left once the replica's own (if not NaN) is out
    left_out = np.where(valid, rank, total)  # a NaN value leaves nothing out

    def at(position):
        shifted = np.where(position < left_out, position, position + 1)
        return np.take_along_axis(ordered, np.clip(shifted, 0, width - 1), axis=1)

    high = at(others // 2)
    with np.errstate(invalid="ignore"):
        middle = np.where(others % 2 == 1, high, (at(np.maximum(others - 1, 0) // 2) + high) / 2)
    return np.where(others > 0, middle, np.nan)
