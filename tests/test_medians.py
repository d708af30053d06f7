"""`core.medians.median_of_others` against `np.median` / `np.nanmedian` of each row without
the replica."""

import warnings

import numpy as np

from tb_replica_plugin.core.medians import median_of_others


def test_median_of_the_other_replicas_equals_nanmedian_for_every_replica():
    """The one-sort median of the others equals `np.nanmedian` of the row without the replica,
    bit for bit, with NaN, Inf, ties, all-NaN rows and odd and even counts."""
    rng = np.random.default_rng(5)
    rows = rng.choice([0.0, 1.0, 2.5, np.nan, np.inf, -3.0, 7.0], size=(300, 6))
    rows = np.concatenate([rows, rng.normal(size=(50, 9))[:, :6], np.full((2, 6), np.nan)])
    rows[-1, 2] = 4.0  # one finite value: the others of replica 2 are all NaN
    expected = np.empty_like(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices
        for replica in range(rows.shape[1]):
            expected[:, replica] = np.nanmedian(np.delete(rows, replica, axis=1), axis=1)
    np.testing.assert_array_equal(median_of_others(rows), expected)
    assert median_of_others(np.array([[1.0, 2.0, 4.0]])).tolist() == [[3.0, 2.5, 1.5]]


def test_median_of_the_others_in_rows_without_nan_equals_nanmedian_at_every_width():
    """Rows without NaN take order statistics instead of a sort (`_median_of_others_full`):
    equal to `np.median` of the row without the replica, bit for bit, with ties, infinities
    and huge values, for an odd and an even count of others."""
    rng = np.random.default_rng(7)
    for width in range(2, 10):
        rows = rng.choice([0.0, 1.0, 1.0, 2.5, np.inf, -np.inf, -3.0, 1e308], size=(400, width))
        rows = np.concatenate([rows, rng.normal(size=(100, width))])
        with np.errstate(invalid="ignore", over="ignore"):
            expected = np.stack(
                [np.median(np.delete(rows, r, axis=1), axis=1) for r in range(width)], axis=1
            )
            got = median_of_others(rows)
        np.testing.assert_array_equal(got, expected, err_msg=f"width {width}")
