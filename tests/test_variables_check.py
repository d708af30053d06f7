"""The weight-drift check's mechanics: fused summaries of many copies, the host check, the
written fingerprint rows, copies of one size checked together, and the rotating checks with
their period and budget (real MirroredStrategy on logical CPUs, values against a reference)."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored
from test_variables import SKETCH_TOLERANCE, only, reference_sketch

from tb_replica_plugin import ReplicaCallback, ReplicaProbe, metadata
from tb_replica_plugin.families.variables import check as variables_check
from tb_replica_plugin.families.variables import fingerprint as collector
from tb_replica_plugin.families.variables import present as variables_present
from tb_replica_plugin.families.variables import read as variables_read
from tb_replica_plugin.families.variables import record as variables_record


def test_fused_summary_of_many_copies_matches_the_reference():
    """A device with FUSED_MIN_COPIES or more copies is summarized at once (segment sums): the
    same stats and sketch as by hand, agreeing copies share replica 0's rows bit for bit, and a
    drifted copy gets its own."""
    strategy = mirrored(2)
    rng = np.random.default_rng(11)
    shapes = [(3,), (64,), (65,), (7, 61), (130, 3)] * 14  # 70 variables, small and large
    with strategy.scope():
        variables = [
            tf.Variable(rng.normal(size=shape).astype("float32"), name=f"v{i}")
            for i, shape in enumerate(shapes)
        ]
    assert len(variables) >= variables_check.FUSED_MIN_COPIES
    entries = collector.describe_variables(variables, list(strategy.extended.worker_devices))
    traced = tf.function(lambda: variables_check.VariablesStats(entries, 2).fingerprint)
    written = traced().numpy()
    for index, variable in enumerate(variables):
        flat = variable.values[0].numpy().astype(np.float64).reshape(-1)
        stats = [flat.min(), flat.max(), flat.sum(), np.sum(flat**2)]
        np.testing.assert_allclose(written[index, 0, :4], stats, rtol=1e-12)
        np.testing.assert_allclose(written[index, 0, 4:], reference_sketch(flat), atol=1e-9)
    np.testing.assert_array_equal(written[:, 0], written[:, 1])
    drifted = variables[3].values[1]
    drifted.assign_add(tf.ones_like(drifted))
    written = traced().numpy()
    others = [i for i in range(len(variables)) if i != 3]
    np.testing.assert_array_equal(written[others, 0], written[others, 1])
    np.testing.assert_allclose(written[3, 1, 2] - written[3, 0, 2], 7 * 61, rtol=1e-9)


def test_host_check_summarizes_every_copy_at_once_with_the_same_values():
    """The host-side check (epoch ends) passes `fused_min_copies=1`: a short list of mixed dtypes
    is summarized by segment sums with the stats and sketch of the per-copy reductions; with one
    drifted copy, only that copy of replica 1 is summarized (`partial_fused_summary`) and the
    others take replica 0's rows."""
    strategy = mirrored(2)
    rng = np.random.default_rng(12)
    with strategy.scope():
        variables = [
            tf.Variable(rng.normal(size=(3,)).astype("float32"), name="small"),
            tf.Variable(rng.normal(size=(7, 61)).astype("float32"), name="large"),
            tf.Variable(np.int64(41), name="count"),
            tf.Variable([True, False, True, True], name="mask"),
            tf.Variable(rng.normal(size=(65,)).astype("float32"), name="edge"),
        ]
    entries = collector.describe_variables(variables, list(strategy.extended.worker_devices))

    def fingerprints(fused_min_copies):
        stats = variables_check.VariablesStats(entries, 2, fused_min_copies=fused_min_copies)
        return stats.fingerprint

    per_copy = tf.function(lambda: fingerprints(variables_check.FUSED_MIN_COPIES))
    at_once = tf.function(lambda: fingerprints(1))
    for drift in (False, True):
        if drift:
            variables[1].values[1].assign_add(tf.ones([7, 61]))
        expected, written = per_copy().numpy(), at_once().numpy()
        np.testing.assert_allclose(written[:, :, :4], expected[:, :, :4], rtol=1e-12)
        np.testing.assert_allclose(written[:, :, 4:], expected[:, :, 4:], atol=1e-9)
        assert written[2, 0, :4].tolist() == [41.0, 41.0, 41.0, 1681.0]
        assert written[3, 1, :4].tolist() == [0.0, 1.0, 3.0, 3.0]
        np.testing.assert_allclose(written[1, 1, 2] - written[1, 0, 2], 7 * 61 if drift else 0)
        # Copies bit-identical to replica 0's take its rows, also beside a drifted one.
        np.testing.assert_array_equal(written[[0, 2, 3, 4], 1], written[[0, 2, 3, 4], 0])


def test_written_fingerprint_has_rows_of_replica_0_and_of_drifted_copies_only():
    """`variables/fingerprint` (version 2) holds one `(v, r, fingerprint)` row per copy of replica
    0 and per copy whose hash differs from replica 0's; the reader gives back every copy's
    fingerprint bit for bit, and still reads the version-1 layout (every copy)."""
    strategy = mirrored(2)
    rng = np.random.default_rng(13)
    with strategy.scope():
        variables = [
            tf.Variable(rng.normal(size=(3,)).astype("float32"), name="small"),
            tf.Variable(rng.normal(size=(7, 61)).astype("float32"), name="large"),
            tf.Variable(np.int64(41), name="count"),
        ]
    entries = collector.describe_variables(variables, list(strategy.extended.worker_devices))

    @tf.function
    def check():
        stats = variables_check.VariablesStats(entries, 2)
        return stats.hash, stats.fingerprint, variables_record.fingerprint_rows(stats)

    for drift, ids in ((False, [[0, 0], [1, 0], [2, 0]]), (True, [[0, 0], [1, 0], [1, 1], [2, 0]])):
        if drift:
            variables[1].values[1].assign_add(tf.ones([7, 61]))
        hashes, every_copy, rows = (t.numpy() for t in check())
        assert rows[:, :2].tolist() == ids
        np.testing.assert_array_equal(rows[:, 2:], every_copy[tuple(np.array(ids).T)])
        for written in (rows, every_copy):  # version 2, version 1
            compact = variables_read.compact_fingerprints([written], hashes[None])
            dense = variables_read.dense_fingerprints(*compact)
            np.testing.assert_array_equal(dense[0], every_copy)
        # Version 2 keeps each written fingerprint once; the others point at replica 0's row.
        table, row_of = variables_read.compact_fingerprints([rows], hashes[None])
        assert len(table) == len(ids)
        assert row_of[0].tolist() == (
            [[0, 0], [1, 2], [3, 3]] if drift else [[0, 0], [1, 1], [2, 2]]
        )
    assert rows[-1, 2:6].tolist() == [41.0, 41.0, 41.0, 1681.0]  # the int64 count, replica 0
    content = json.loads(
        metadata.create_summary_metadata("variable_fingerprint").plugin_data.content
    )
    assert content == {"kind": "variable_fingerprint", "version": 2}
    content = json.loads(metadata.create_summary_metadata("variable_hash").plugin_data.content)
    assert content == {"kind": "variable_hash", "version": 1}


def test_copies_of_one_size_are_hashed_and_summarized_together_with_each_copys_values():
    """A short variable list (the step's check) stacks the copies of one size and dtype: one
    `tf.fingerprint` per group and device, and each copy gets the hash and summary it gets
    alone; a copy above `GROUP_MAX_ELEMENTS` stays alone. A drifted copy in a group is told."""
    strategy = mirrored(2)
    rng = np.random.default_rng(17)
    shapes = [(16, 16), (5,), (16, 16), (256,), (5,), (16, 16)]
    with strategy.scope():
        variables = [
            tf.Variable(rng.normal(size=shape).astype("float32"), name=f"v{i}")
            for i, shape in enumerate(shapes)
        ]
        variables.append(tf.Variable(tf.zeros([variables_check.GROUP_MAX_ELEMENTS + 1])))
        variables.append(tf.Variable(tf.ones([variables_check.GROUP_MAX_ELEMENTS + 1])))
    entries = collector.describe_variables(variables, list(strategy.extended.worker_devices))

    @tf.function
    def check():
        stats = variables_check.VariablesStats(entries, 2)
        return stats.hash, stats.fingerprint

    graph = check.get_concrete_function().graph
    fingerprints = [op for op in graph.get_operations() if op.type == "Fingerprint"]
    # Per device: (16, 16) x 3 and (256,) in one group, (5,) x 2, and the two large ones.
    assert len(fingerprints) == 2 * 4

    def expected():
        hashes, rows = np.zeros([len(variables), 2], np.int64), []
        for v, variable in enumerate(variables):
            row = []
            for r, copy in enumerate(variable.values):
                with tf.device(copy.device):
                    value = tf.convert_to_tensor(copy)
                    hashes[v, r] = int(collector.farmhash(value, copy.dtype))
                    row.append(collector.copy_summary(value, copy.dtype).numpy())
            rows.append(row)
        return hashes, np.array(rows)

    for drift in (False, True):
        if drift:
            variables[2].values[1].assign_add(tf.ones([16, 16]))
        stats = check()
        hashes, rows = expected()
        np.testing.assert_array_equal(stats[0].numpy(), hashes)
        np.testing.assert_allclose(stats[1].numpy(), rows, rtol=1e-12, atol=1e-12)
        differs = (hashes[:, 1] != hashes[:, 0]).tolist()
        assert differs == [False, False, drift, False, False, False, False, False]


# ----------------------------------------------------------------- rotating checks


def test_rotating_check_reads_one_slice_per_logged_step(tmp_path):
    """With a budget, each logged check in a tf.function reads slice (step mod P) of every
    variable larger than 4,096 elements (the small ones whole): a drift in one element is seen at
    the steps whose slice holds it, with the slice's stats and drift."""
    strategy = mirrored(2)
    rng = np.random.default_rng(21)
    with strategy.scope():
        big = tf.Variable(rng.normal(size=(100, 100)).astype("float32"), name="big")
        small = tf.Variable(rng.normal(size=(7,)).astype("float32"), name="small")
    big.values[1].assign(big.values[0] + tf.scatter_nd([[80, 0]], [1.0], [100, 100]))
    probe = ReplicaProbe(str(tmp_path / "replicas"), strategy, update_freq=1)
    with pytest.raises(ValueError, match="`budget` must be an integer >= 1"):
        probe.observe_variables([big, small], budget=0)

    @tf.function
    def check():
        probe.observe_variables([big, small], budget=2500)  # 10,000 elements: P = 4

    for _ in range(8):
        check()
    probe.close()
    series, findings = only(str(tmp_path))
    assert series.steps.tolist() == list(range(8))
    assert series.rotation == {"period": 4, "budget": 2500, "whole_elements": 4096}
    np.testing.assert_array_equal(series.coverage, [[0.25, 1.0]] * 8)
    # Element 8,000 (row 80) is in slice 3 = elements 7,500..9,999.
    assert series.identical[:, 0, 1].tolist() == [True, True, True, False] * 2
    assert series.identical[:, 1, :].all()
    flat = big.values[0].numpy().reshape(-1).astype(np.float64)
    for step in range(8):
        part = flat[2500 * (step % 4) : 2500 * (step % 4 + 1)]
        expected = [part.min(), part.max(), part.sum(), np.square(part).sum()]
        np.testing.assert_allclose(series.stats[step, 0, 0], expected, rtol=1e-9)
    drift = series.rel_l2[3, 0, 1]
    np.testing.assert_allclose(drift, 1.0 / np.linalg.norm(flat[7500:]), rtol=SKETCH_TOLERANCE)
    (finding,) = findings
    assert (finding.kind, finding.first_step, finding.count, finding.replicas) == (
        "variable_drift",
        3,
        2,
        [1],
    )
    assert "from step 3 (first seen at a rotating check that read 25% of it" in finding.message
    assert "up to 4 logged steps earlier" in finding.message
    body = variables_present.variables_body(series)
    assert body["rotation"] == {
        "period": 4,
        "budget": 2500,
        "partial_steps": 8,
        "partial_fraction": 0.25,
    }
    assert any("every element once every 4 logged steps" in note for note in body["notes"])


def _fit_wide(logdir, epochs, **callback_kwargs):
    """A Dense(80 -> 64) model fitted on 2 replicas, 4 steps per epoch; returns its variables."""
    strategy = mirrored(2)
    with strategy.scope():
        layers = [keras.Input((80,)), keras.layers.Dense(64), keras.layers.Dense(1)]
        model = keras.Sequential(layers)
        model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(22)
    x = rng.normal(size=(32, 80)).astype("float32")
    y = rng.normal(size=(32, 1)).astype("float32")
    model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
        epochs=epochs,
        verbose=0,
        callbacks=[ReplicaCallback(logdir, **callback_kwargs)],
    )
    return model.variables


def test_rotating_fit_checks_whole_at_epoch_ends(tmp_path):
    """ReplicaCallback(update_freq=1) with a small budget: slices at the steps, the full check at
    each epoch's last step (its events replace that step's slice)."""
    with pytest.raises(ValueError, match="`variables_budget` must be an integer >= 1"):
        ReplicaCallback(str(tmp_path), variables_budget=-1)
    variables = _fit_wide(str(tmp_path), 2, update_freq=1, variables_budget=4096)
    series, findings = only(str(tmp_path))
    assert series.steps.tolist() == list(range(8))
    # 3 kernels of 5,120 elements (the layer's and Adam's two) are cut: P = ceil(15,360 / 4,096).
    assert series.rotation["period"] == 4
    kernels = [i for i, v in enumerate(series.variables) if v["shape"] == [80, 64]]
    assert len(kernels) == 3
    partial = (series.coverage < 1).any(axis=1)
    assert partial.tolist() == [True, True, True, False] * 2
    np.testing.assert_allclose(series.coverage[0, kernels], 1280 / 5120)
    assert series.identical.all() and findings == []
    # The last step's check is whole: replica 0's kernel as it is after training.
    copy = variables[0].value.values[0]
    value = tf.convert_to_tensor(copy)
    digest, values = collector.copy_fingerprint(value, copy.dtype, algorithm="farmhash64")
    assert series.hash[-1, kernels[0], 0] == int(digest)
    np.testing.assert_allclose(series.stats[-1, kernels[0], 0], values.numpy()[:4], rtol=1e-12)


def test_full_checks_are_at_least_a_rotation_period_apart(tmp_path):
    """With P = 8 (budget 2,048) and epochs of 4 steps, the callback's full check runs at the
    epoch end 8 steps after the fit's start and at the end of training, not at every epoch end:
    with rotating slices in the steps, and with `update_freq="epoch"` (its only checks)."""
    rotating = str(tmp_path / "rotating")
    _fit_wide(rotating, 3, update_freq=1, variables_budget=2048)
    series, _ = only(rotating)
    assert series.rotation["period"] == 8
    assert series.steps.tolist() == list(range(12))
    whole = ~(series.coverage < 1).any(axis=1)
    assert np.flatnonzero(whole).tolist() == [7, 11]

    by_epoch = str(tmp_path / "by_epoch")
    _fit_wide(by_epoch, 3, variables_budget=2048)
    series, findings = only(by_epoch)
    assert series.steps.tolist() == [7, 11]
    assert series.rotation is None and (series.coverage == 1).all()
    assert series.identical.all() and findings == []


def test_whole_check_period_counts_the_elements_of_large_variables(tmp_path):
    """P of the full checks' spacing: the rotation period of the variables' static sizes."""
    kernels = [tf.Variable(tf.zeros([80, 64])) for _ in range(3)]  # 3 x 5,120 elements
    small = [tf.Variable(tf.zeros([64])), tf.Variable(1.0), keras.Variable(np.zeros((4096,)))]
    variables = kernels + small
    probe = ReplicaProbe(str(tmp_path), mirrored(2))
    assert probe.build()
    recorder = probe.recorder("variables")
    assert recorder.period(variables, False, 2048) == 8
    assert recorder.period(variables, False, 4096) == 4
    assert recorder.period(variables, False, None) == 1  # full checks: no spacing
    assert recorder.period(variables, True, 2048) == 1  # exact checks are full
    assert recorder.period(small, False, 1) == 1  # none above 4,096 elements
    probe.close()
