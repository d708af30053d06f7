"""Cutting series to at most `max_points` steps for the routes, and JSON-safe values.

Pure numpy; shared by the families' present modules.
"""

import warnings

import numpy as np

DEFAULT_MAX_POINTS = 2000
MAX_POINTS_RANGE = (2, 100_000)


def pick(count, max_points):
    """Indices of at most `max_points` evenly spaced items of `count` (all when None/fewer)."""
    if max_points is None or count <= max_points:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, max_points).round().astype(np.int64))


def bucket_means(values, starts):
    """Mean of each bucket of rows without its NaN values (an all-NaN bucket stays NaN; an
    infinite value makes its bucket's mean infinite); bucket i is rows `starts[i]` to
    `starts[i + 1]`.

    Example:
      >>> bucket_means(np.array([1.0, 3.0, np.nan, 4.0, np.nan]), [0, 2, 4]).tolist()
      [2.0, 4.0, nan]
    """
    values = np.asarray(values)
    missing = np.isnan(values)
    sizes = np.diff(starts, append=len(values))
    if not missing.any() and (sizes > 0).all():  # the usual case: the sums over the sizes
        sizes = sizes.reshape(-1, *(1,) * (values.ndim - 1))
        return np.add.reduceat(values, starts, axis=0) / sizes
    sums = np.add.reduceat(np.where(missing, 0, values), starts, axis=0)
    counts = np.add.reduceat((~missing).astype(np.int64), starts, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def bucket_max(values, starts, axis=0):
    """Per bucket (slices along `axis` starting at `starts`) the max over its slices, NaN only
    if all are NaN (`np.fmax`: no copy of the values)."""
    return np.fmax.reduceat(np.asarray(values), starts, axis=axis)


def nanmax(values, axis=None):
    """`np.nanmax` that gives NaN (not a warning) for all-NaN slices."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(values, axis=axis) if values.size else np.full((), np.nan)


def nanmedian(values, axis=None):
    """`np.nanmedian` that gives NaN (not a warning) for all-NaN slices."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(values, axis=axis) if values.size else np.full((), np.nan)


def floats(values):
    """A nested list of floats with NaN as None (JSON null: 'not measured'); float32 values
    as `float32_list` writes them."""
    array = shortest_float32(values)
    return _list_replacing(array, [(np.isnan(array), None)])


def float32_list(values):
    """`values.tolist()` with each float32 number written with its fewest digits
    (`shortest_float32`): about half the JSON text of float32 series, encoded in about half
    the time."""
    return shortest_float32(values).tolist()


def shortest_float32(values):
    """float64 values to write numbers with: each value that is a float32 number (recorded as
    float32, held in any dtype) becomes the shortest decimal of at most 9 significant digits
    that reads back as the same float32, as `str(np.float32(v))` writes it; other values (and
    magnitudes beyond about 1e±13) stay as they are.

    A float32 widened to float64 is written with up to 17 digits (0.1 as 0.10000000149011612);
    a JSON reader that keeps it as a float32 gets the same value from the short form.

    Args:
      values: an array (or nested lists) of numbers.

    Returns:
      A float64 array of the same shape.

    Example:
      >>> shortest_float32(np.float32([0.1, 13.783748626708984, np.nan])).tolist()
      [0.1, 13.783749, nan]
      >>> shortest_float32([float(np.float32(0.1)), 0.3]).tolist()  # 0.3: a float64
      [0.1, 0.3]
    """
    wide = np.asarray(values).astype(np.float64)
    result = wide.copy()
    if not wide.size:
        return result
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        narrow = wide.astype(np.float32)
        pending = np.isfinite(wide) & (wide != 0) & (narrow == wide)
        if not pending.any():
            return result
        exponent = np.floor(np.log10(np.abs(np.where(pending, wide, 1.0))))
        for digits in SIGNIFICANT_DIGITS:
            # Decimals of 10**power, power in ±22 (exact in float64, so that the quotient or
            # product is the float64 nearest to the decimal and prints as it).
            power = np.clip(digits - 1 - exponent, -EXACT_POWER, EXACT_POWER)
            scale = 10.0 ** np.abs(power)
            up = power >= 0
            rounded = np.where(up, np.round(wide * scale) / scale, np.round(wide / scale) * scale)
            exact = pending & (rounded.astype(np.float32) == narrow)
            result[exact] = rounded[exact]
            pending &= ~exact
            if not pending.any():
                break
    return result


# Significant digits tried, fewest first: 9 write every float32 exactly, fewer mostly do.
SIGNIFICANT_DIGITS = (6, 7, 8, 9)
EXACT_POWER = 22  # the largest power of ten held exactly by a float64


def _list_replacing(array, replacements):
    """`array.tolist()` with the elements where each `(mask, value)`'s mask holds as `value`
    (an object array is made only when some mask holds)."""
    replacements = [(mask, value) for mask, value in replacements if mask.any()]
    if not replacements:
        return array.tolist()
    values = array.astype(object)
    for mask, value in replacements:
        values[mask] = value
    return values.tolist()


def pool_pairs(matrix, side):
    """A replica × replica matrix cut to at most `side` × `side` blocks, as the tab draws it.

    Block i holds the replicas r with `r * P // R == i` (P = min(R, side)); each cell is the
    largest value over the pairs r ≠ q of its two blocks (a replica's pair with itself is left
    out), -1 where there is none (a diagonal block of one replica).

    Args:
      matrix: float [R, R].
      side: the most blocks per side.

    Returns:
      float64 [P, P].

    Example:
      >>> pool_pairs(np.array([[1, 0, 0, .5], [0, 1, 0, 0], [0, 0, 1, 0], [.5, 0, 0, 1]]), 2)
      array([[0. , 0.5],
             [0.5, 0. ]])
    """
    values = np.array(matrix, dtype=np.float64)
    starts = block_starts(values.shape[0], side)
    np.fill_diagonal(values, -1.0)
    return np.maximum.reduceat(np.maximum.reduceat(values, starts, axis=0), starts, axis=1)


def pool_uniform(replicas, side, value):
    """`pool_pairs` of an R × R matrix whose every pair r ≠ q holds `value` (its diagonal left
    out as there), without the matrix: `value` everywhere, -1 on a diagonal block of one
    replica.

    Example:
      >>> pool_uniform(5, 3, 0.0).tolist()
      [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, -1.0]]
    """
    starts = block_starts(replicas, side)
    sizes = np.diff(np.append(starts, replicas))
    pooled = np.full((len(starts), len(starts)), float(value))
    pooled[np.diag_indices(len(starts))] = np.where(sizes > 1, float(value), -1.0)
    return pooled


def block_starts(replicas, blocks):
    """The first replica position of each of min(R, `blocks`) blocks of R replicas: block i
    holds the positions r with `r * P // R == i` (P blocks, none empty).

    Example:
      >>> block_starts(5, 2).tolist()
      [0, 3]
    """
    count = min(replicas, blocks)
    return np.searchsorted(np.arange(replicas) * count // replicas, np.arange(count))


def pool_replicas(arrays, blocks, smallest=()):
    """Per-replica values cut to blocks of replicas (the last axis), when there are more
    replicas than `blocks`: each block keeps the largest value of its replicas (NaN only when
    all are NaN), so one outlying replica stays visible.

    Args:
      arrays: float arrays [..., R] of one run (same R).
      blocks: a route's `replica_blocks` (None: every replica).
      smallest: positions in `arrays` of NaN-free arrays whose blocks keep the smallest value
        instead (batch sizes: an empty shard stays visible).

    Returns:
      `(arrays, fields)`: the arrays as they are and `{}` when `blocks` is None or R is at most
      `blocks`; else each as [..., P] blocks and `{"pooled": {"blocks": [[first, last], ...]}}`,
      each block's first and last replica position.

    Example:
      >>> (rows,), fields = pool_replicas([np.array([[0.0, 2.0, np.nan, 1.0, 0.5]])], 2)
      >>> rows.tolist(), fields
      ([[2.0, 1.0]], {'pooled': {'blocks': [[0, 2], [3, 4]]}})
    """
    replicas = arrays[0].shape[-1]
    if blocks is None or replicas <= blocks:
        return list(arrays), {}
    starts = block_starts(replicas, blocks)
    lasts = np.append(starts[1:], replicas) - 1
    spans = [[int(first), int(last)] for first, last in zip(starts, lasts, strict=True)]
    pooled = [
        np.minimum.reduceat(np.asarray(array), starts, axis=-1)
        if index in smallest
        else bucket_max(np.asarray(array), starts, axis=-1)
        for index, array in enumerate(arrays)
    ]
    return pooled, {"pooled": {"blocks": spans}}


def pairs_above_zero(matrix):
    """How many replica pairs r < q of a symmetric [R, R] matrix hold a value above 0."""
    values = np.asarray(matrix)
    return int(np.count_nonzero(np.triu(values > 0, k=1)))


def cut_to_blocks(matrices, side):
    """Replica × replica matrices of a route, cut to blocks when `side` asks it.

    Args:
      matrices: float [R, R] matrices of one run; the first says which pairs are above 0.
      side: a route's `matrix_side` (None: every pair).

    Returns:
      `(matrices, fields)`: the matrices as they are and `{}` when `side` is None or R is at
      most `side`; else each as `pool_pairs` blocks and `{"pooled": {"side", "pairs_above_0"}}`.
    """
    if side is None or matrices[0].shape[0] <= side:
        return list(matrices), {}
    fields = {"pooled": {"side": side, "pairs_above_0": pairs_above_zero(matrices[0])}}
    return [pool_pairs(matrix, side) for matrix in matrices], fields


def hex64(value):
    """A 64-bit integer as 16 hex digits (JavaScript numbers hold only 53 bits)."""
    return f"{int(value) & 0xFFFFFFFFFFFFFFFF:016x}"


def hex64_lists(values):
    """`hex64` of every value of an integer array, as nested lists of its shape (one
    conversion of the array, not one per value: 6,144 values in 3 ms instead of 50).

    Example:
      >>> hex64_lists(np.array([[1, -1]]))
      [['0000000000000001', 'ffffffffffffffff']]
    """

    def text(value):
        return [text(v) for v in value] if isinstance(value, list) else f"{value:016x}"

    return text(np.asarray(values, np.int64).astype(np.uint64).tolist())


def json_floats(array):
    """Nested lists of floats with NaN/Inf as the strings "NaN", "Infinity", "-Infinity" (as
    TensorBoard's HTTP responses write them), so the document is strict JSON; float32 values as
    `float32_list` writes them."""
    array = shortest_float32(array)
    return _list_replacing(
        array,
        [(np.isnan(array), "NaN"), (array == np.inf, "Infinity"), (array == -np.inf, "-Infinity")],
    )
