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
    """Mean of each bucket of rows (NaN-aware; an all-NaN bucket stays NaN)."""
    sums = np.add.reduceat(np.nan_to_num(values), starts, axis=0)
    counts = np.add.reduceat(np.isfinite(values).astype(np.int64), starts, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def bucket_max(values, starts):
    """Per bucket (rows starting at `starts`) the max over its rows, NaN only if all are NaN."""
    filled = np.where(np.isnan(values), -np.inf, values)
    result = np.maximum.reduceat(filled, starts, axis=0)
    return np.where(result == -np.inf, np.nan, result)


def nanmax(values, axis=None):
    """`np.nanmax` that gives NaN (not a warning) for all-NaN slices."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(values, axis=axis) if values.size else np.full((), np.nan)


def floats(values):
    """A nested list of floats with NaN as None (JSON null: 'not measured')."""
    array = np.asarray(values, dtype=np.float64)
    return _list_replacing(array, [(np.isnan(array), None)])


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


def hex64(value):
    """A 64-bit integer as 16 hex digits (JavaScript numbers hold only 53 bits)."""
    return f"{int(value) & 0xFFFFFFFFFFFFFFFF:016x}"


def json_floats(array):
    """Nested lists of floats with NaN/Inf as the strings "NaN", "Infinity", "-Infinity" (as
    TensorBoard's HTTP responses write them), so the document is strict JSON."""
    array = np.asarray(array, np.float64)
    return _list_replacing(
        array,
        [(np.isnan(array), "NaN"), (array == np.inf, "Infinity"), (array == -np.inf, "-Infinity")],
    )
