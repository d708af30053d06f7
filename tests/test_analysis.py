"""Pure-logic tests: rebuilding per-step series, downsampling, findings, metadata."""

import json
import warnings

import numpy as np
import pytest
from tensorboard.compat.proto import summary_pb2

from tb_replica_plugin import analysis, metadata
from tb_replica_plugin.core import leaf_entries
from tb_replica_plugin.core.downsample import (
    block_starts,
    bucket_means,
    float32_list,
    floats,
    json_floats,
    pairs_above_zero,
    pool_pairs,
    pool_replicas,
    pool_uniform,
)
from tb_replica_plugin.families.inputs import present as inputs_present
from tb_replica_plugin.families.inputs import read as inputs_read
from tb_replica_plugin.families.inputs import rules as inputs_rules
from tb_replica_plugin.families.inputs import schema as inputs_schema


def event(step, shapes, dtypes=None, name="x"):
    dtypes = dtypes or ["float32"] * len(shapes)
    document = {
        "devices": ["d0", "d1"],
        "replicas": [0, 1],
        "source": "fit",
        "inputs": [{"name": name, "dtypes": dtypes, "shapes": shapes}],
    }
    return inputs_read.parse_shape_event(step, json.dumps(document))


def test_change_events_rebuild_every_step_exactly():
    events = [event(0, [[4, 3], [4, 3]]), event(2, [[1, 3], [0, 3]]), event(3, [[4, 3], [4, 3]])]
    dense = [(0, [[4, 4], [4, 4], [4, 4]]), (5, [[4, 4], [1, 0], [4, 4]])]
    series = inputs_read.build_inputs_series("r", events, dense)
    assert series.steps.tolist() == [0, 1, 2, 3, 4, 5]
    assert series.batch_size.tolist() == [[4, 4], [4, 4], [1, 0], [4, 4], [4, 4], [4, 4]]
    assert series.notes == []


def test_missing_change_events_are_noted_and_dense_values_win():
    events = [event(0, [[4, 3], [4, 3]])]  # the [1, 0] event at step 2 was sampled away
    dense = [(2, [[1, 0], [1, 0], [4, 4]])]
    series = inputs_read.build_inputs_series("r", events, dense)
    assert series.batch_size.tolist() == [[4, 4], [4, 4], [1, 0]]
    assert "samples_per_plugin replicas=0" in series.notes[0]


def test_replica_count_change_is_noted():
    events = [event(0, [[4, 3], [4, 3]])]
    dense = [(0, [[4, 4], [4, 4], [4, 4]]), (1, [[2, 2, 2], [2, 2, 2], [2, 2, 2]])]
    series = inputs_read.build_inputs_series("r", events, dense)
    assert series.num_replicas == 3
    assert "replica count changes" in series.notes[0]


@pytest.mark.parametrize(
    ("dtypes", "shapes", "dims"),
    [
        (["float32", "float32"], [[4, 3], [3, 3]], []),  # batch dim may differ
        (["float32", "float32"], [[4, 3], [4, 5]], [1]),
        (["float32", "float32"], [[4, 3], [4]], ["rank"]),
        (["float32", "int32"], [[4, 3], [4, 3]], ["dtype"]),
        (["float32", "int32"], [[4, 3, 2], [4, 2, 2]], ["dtype", 1]),
    ],
)
def test_mismatch_dims(dtypes, shapes, dims):
    assert leaf_entries.mismatch_dims(dtypes, shapes) == dims


def test_downsampling_keeps_a_single_odd_step_in_bucket_extremes():
    steps = np.arange(10_000)
    sizes = np.full((10_000, 2), 8)
    sizes[7_777] = [8, 0]
    series = inputs_read.InputsSeries(
        "r", [0, 1], ["a", "b"], "fit", steps, sizes, [], steps[:0], np.zeros((0, 3, 2)), []
    )
    body = inputs_present.downsample_inputs(series, 100)
    assert body["downsampled"] is True and len(body["steps"]) == 100
    assert body["steps"][77] == 7_700
    assert body["batch_size_min"][77] == [8, 0]
    assert sum(row == [8, 0] for row in body["batch_size_min"]) == 1
    assert body["imbalance"][77] == 1.0  # value at the bucket's first step


def test_json_floats_and_floats_write_nonfinite_values_as_documented():
    values = np.array([[1.5, np.nan], [np.inf, -np.inf]], dtype=np.float32)
    assert json_floats(values) == [[1.5, "NaN"], ["Infinity", "-Infinity"]]
    assert json.dumps(json_floats(values), allow_nan=False) == (
        '[[1.5, "NaN"], ["Infinity", "-Infinity"]]'
    )
    assert json_floats(np.float32(0.25)) == 0.25 and json_floats(np.nan) == "NaN"
    assert json_floats(np.zeros((0, 3))) == []
    assert type(json_floats([2, 3])[0]) is float
    # The routes' floats: NaN is null ("not measured").
    assert floats(values) == [[1.5, None], [np.inf, -np.inf]] and floats(np.nan) is None
    assert floats(np.array([0.5, 2])) == [0.5, 2.0] and type(floats([1, 2])[1]) is float


def test_float32_values_are_written_with_their_shortest_digits():
    """A float32 widened to float64 is written with up to 17 digits; the JSON gets the shortest
    decimal that reads back as the same float32 (numpy's own `str`), non-finite values and
    zeros as they are."""
    rng = np.random.default_rng(7)
    values = np.concatenate(
        [
            (rng.standard_normal(5000) * 10.0 ** rng.integers(-30, 30, 5000)).astype(np.float32),
            np.float32([0.1, 1e-45, 3.4e38, -0.0, 0.0, np.nan, np.inf, -np.inf, 16777217.0]),
        ]
    )
    written = float32_list(values)
    assert json.dumps(float32_list(np.float32([0.1, 13.783748626708984, 2.0]))) == (
        "[0.1, 13.783749, 2.0]"
    )
    finite = np.isfinite(values)
    assert np.array_equal(np.float32(written)[finite], values[finite])  # the same float32s
    assert np.isnan(written[-4]) and written[-3:-1] == [np.inf, -np.inf]
    usual = finite & (np.abs(values) > 1e-13) & (np.abs(values) < 1e13)
    assert usual.sum() > 2000
    shortest = [float(str(v)) for v in values[usual]]  # numpy's shortest decimal of each
    assert [w for w, u in zip(written, usual, strict=True) if u] == shortest
    assert float32_list(np.float64([0.1 + 1e-12, 0.25])) == [
        0.1 + 1e-12,
        0.25,
    ]  # not a float32: as is
    assert json_floats(np.float32([[0.1, np.nan]])) == [[0.1, "NaN"]]
    assert floats(np.float32([0.3, np.nan])) == [0.3, None]


def test_a_match_matrix_is_cut_to_blocks_of_replica_pairs():
    """Block i holds replicas r with r * P // R == i; a cell is the largest value of its pairs
    r != q (a replica's own 1.0 left out), -1 for a diagonal block of one replica."""
    matrix = np.eye(5)
    matrix[0, 4] = matrix[4, 0] = 0.25  # replicas 0 and 4: blocks 0 and 1 of P = 2
    matrix[1, 2] = matrix[2, 1] = 0.5  # both in block 0
    # R = 5, P = 2: blocks [0, 0, 0, 1, 1]; P = 3: [0, 0, 1, 1, 2]; P = 4: [0, 0, 1, 2, 3].
    assert pool_pairs(matrix, 2).tolist() == [[0.5, 0.25], [0.25, 0.0]]
    assert pool_pairs(matrix, 3).tolist() == [[0.0, 0.5, 0.25], [0.5, 0.0, 0.0], [0.25, 0.0, -1]]
    assert pool_pairs(matrix, 4)[2:, 2:].tolist() == [[-1.0, 0.0], [0.0, -1.0]]
    assert pool_pairs(matrix, 5).tolist() == np.where(np.eye(5) > 0, -1, matrix).tolist()
    assert pairs_above_zero(matrix) == 2 and pairs_above_zero(np.eye(3)) == 0
    assert pool_pairs(matrix, 2).dtype == np.float64 and matrix[0, 0] == 1.0  # input untouched
    # Every pair holds one value (the identity: none; all ones): the same blocks without the
    # matrix.
    for replicas, side in ((5, 2), (5, 3), (5, 4), (7, 6), (2048, 640), (2048, 64)):
        for value in (0.0, 0.25, 1.0):
            matrix = np.full((replicas, replicas), value)
            np.fill_diagonal(matrix, 1.0)
            want = pool_pairs(matrix, side)
            assert pool_uniform(replicas, side, value).tolist() == want.tolist()


def test_per_replica_series_are_cut_to_blocks_of_replicas():
    """With more replicas than blocks, each block keeps the largest value of its replicas (NaN:
    no value, only when all are NaN) and the body names each block's first and last position."""
    values = np.array([[0.0, 2.0, np.nan, 1.0, 0.5], [np.nan, np.nan, np.nan, 3.0, np.inf]])
    (pooled,), fields = pool_replicas([values], 2)  # R = 5, P = 2: blocks [0, 0, 0, 1, 1]
    assert floats(pooled) == [[2.0, 1.0], [None, np.inf]]
    assert fields == {"pooled": {"blocks": [[0, 2], [3, 4]]}}
    rel, fields = pool_replicas([values, values[:, ::-1]], 3)  # [0, 0, 1, 1, 2]
    assert floats(rel[0]) == [[2.0, 1.0, 0.5], [None, 3.0, np.inf]]
    assert floats(rel[1]) == [[1.0, 2.0, 0.0], [np.inf, None, None]]
    assert fields == {"pooled": {"blocks": [[0, 1], [2, 3], [4, 4]]}}
    for blocks in (5, 6, None):  # no more replicas than blocks: as they are
        (same,), fields = pool_replicas([values], blocks)
        assert same is values and fields == {}
    steps_variables_replicas = np.zeros((3, 2, 2048))
    steps_variables_replicas[1, 0, 100] = 0.5  # replica 100: block 3 of 64 (32 replicas each)
    (pooled,), fields = pool_replicas([steps_variables_replicas], 64)
    assert pooled.shape == (3, 2, 64) and pooled[1, 0, 3] == 0.5 and pooled.sum() == 0.5
    assert fields["pooled"]["blocks"][:2] == [[0, 31], [32, 63]]
    assert block_starts(2048, 64).tolist() == list(range(0, 2048, 32))
    assert block_starts(5, 2).tolist() == [0, 3] and block_starts(3, 8).tolist() == [0, 1, 2]
    sizes = np.array([[4, 0, 4, 3, 4]])  # batch sizes: a block keeps its smallest
    (low, high), _ = pool_replicas([sizes, sizes], 2, smallest=(0,))
    assert low.tolist() == [[0, 3]] and high.tolist() == [[4.0, 4.0]]


def test_findings_messages_and_thresholds():
    events = [event(0, [[8, 3], [7, 3]]), event(3, [[1, 3], [0, 3]])]
    series = inputs_read.build_inputs_series("r", events, [(3, [[1, 0], [1, 0], [8, 7]])])
    findings = inputs_rules.find_inputs(series)
    assert [(f.kind, f.severity, f.first_step, f.last_step, f.count) for f in findings] == [
        ("first_batch_uneven", "error", 0, 0, 1),
        ("uneven_batch", "warning", 0, 2, 3),
        ("empty_shard", "warning", 3, 3, 1),
    ]
    assert findings[1].value == pytest.approx(8 / 7)
    loose = inputs_rules.find_inputs(series, analysis.Thresholds(max_imbalance_ratio=1.2))
    assert [f.kind for f in loose] == ["first_batch_uneven", "empty_shard"]


def test_last_partial_batch_is_info_not_warning():
    events = [event(0, [[4, 3], [4, 3]]), event(2, [[3, 3], [2, 3]])]
    series = inputs_read.build_inputs_series("r", events, [])
    (finding,) = inputs_rules.find_inputs(series)
    assert (finding.kind, finding.severity) == ("uneven_batch", "info")
    assert "last partial batch" in finding.message and "instead of 8" in finding.message


def test_clean_run_has_no_findings():
    series = inputs_read.build_inputs_series("r", [event(0, [[4, 3], [4, 3]])], [])
    assert inputs_rules.find_inputs(series) == []


def test_metadata_roundtrip_and_newer_schema_refused():
    md = metadata.create_summary_metadata(inputs_schema.KIND_SHAPES)
    assert md.plugin_data.plugin_name == "replicas"
    assert md.data_class == summary_pb2.DATA_CLASS_TENSOR
    assert metadata.parse_plugin_content(md.plugin_data.content)["kind"] == "shapes"
    with pytest.raises(metadata.UnsupportedSchemaError, match="upgrade"):
        metadata.parse_plugin_content(b'{"version": 99, "kind": "shapes"}')
    with pytest.raises(metadata.UnsupportedSchemaError):
        metadata.parse_plugin_content(b"\xff")
    with pytest.raises(ValueError, match="Unknown series kind"):
        metadata.create_summary_metadata("nope")


def test_flatten_with_names():
    from tb_replica_plugin.core.nest import flatten_with_names
    from tb_replica_plugin.families.inputs.record import name_fit_batch

    assert flatten_with_names({"b": 1, "a": (2, None)}) == [("a/0", 2), ("b", 1)]
    assert [n for n, _ in flatten_with_names(name_fit_batch(({"img": 1}, 2, None)))] == [
        "x/img",
        "y",
    ]
    assert flatten_with_names(5) == [("input", 5)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_bucket_means_equal_each_buckets_nanmean_with_and_without_nan(dtype):
    """`downsample.bucket_means`: values without NaN take the sums over the bucket sizes, bit for
    bit the sums over the counts that values with NaN take; both are each bucket's mean of its
    values that are not NaN (an all-NaN bucket stays NaN, an Inf makes its bucket's mean Inf)."""
    rng = np.random.default_rng(3)
    values = rng.normal(size=(101, 3, 5)).astype(dtype)
    starts = np.array([0, 1, 7, 40, 100])
    ends = [*starts[1:], len(values)]
    close = 1e-6 if dtype == np.float32 else 0  # float32 sums of 60 values, added in turn

    def nanmeans(values):
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the all-NaN bucket
            return np.stack(
                [np.nanmean(values[a:b], axis=0) for a, b in zip(starts, ends, strict=True)]
            )

    got = bucket_means(values, starts)
    counts = np.add.reduceat(np.ones(values.shape, np.int64), starts, axis=0)
    np.testing.assert_array_equal(got, np.add.reduceat(values, starts, axis=0) / counts)
    np.testing.assert_allclose(got, nanmeans(values), rtol=1e-6, atol=close)
    values[3, 0, 0], values[100, 1] = np.nan, np.nan  # one value, and the last bucket's row
    values[50, 2, 4] = np.inf
    got = bucket_means(values, starts)
    np.testing.assert_allclose(got, nanmeans(values), rtol=1e-6, atol=close)
    assert np.isnan(got[4, 1]).all() and got[3, 2, 4] == np.inf
    assert np.isfinite(np.delete(got[:4].reshape(4, -1), 14, axis=1)).all()
