"""RNG family: the tool's stream findings agree with the dropout masks each replica applied.

Real MirroredStrategy, real `fit`: 2 replicas in-process, 4 replicas in a subprocess (one strategy
size per process). The masks are captured by the layers themselves (`dropout_masks.py`).
"""

import os
import subprocess
import sys

import dropout_masks
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, mirrored

import tb_replica_plugin
from tb_replica_plugin import ReplicaProbe, analysis
from tb_replica_plugin.families.rng import present as rng_present
from tb_replica_plugin.families.rng import read as rng_read
from tb_replica_plugin.families.rng import rules as rng_rules


def actual_groups(masks):
    """Replica groups of equal masks (same convention as `rng_rules.stream_groups`)."""
    return rng_rules.stream_groups(np.stack([m.reshape(-1) for m in masks]))


def check_masks_agree(logdir, masks, num):
    report = tb_replica_plugin.load(logdir)
    rng = report.runs["replicas"].rng
    steps = dropout_masks.STEPS_PER_EPOCH * dropout_masks.EPOCHS
    assert rng.steps.tolist() == list(range(steps))
    names = [g["name"] for g in rng.generators]
    assert names[:2] == ["dropout", "g"]
    assert rng.generators[0]["kind"] == "keras.SeedGenerator"
    assert rng.generators[0]["layer_class"] == "RecordingDropout"
    assert rng.generators[1]["kind"] == "tf.random.Generator"
    for index, layer in ((0, "dropout"), (1, "gen_dropout")):
        for t in range(steps):
            applied = [masks[(layer, r)][t] for r in range(num)]
            assert rng_rules.stream_groups(rng.fingerprint[t, index]) == actual_groups(applied), (
                layer,
                t,
            )
    # Stock Keras Dropout: the same mask on every replica at every step; the generator: never.
    for t in range(steps):
        assert actual_groups([masks[("dropout", r)][t] for r in range(num)]) == [0] * num
        assert actual_groups([masks[("gen_dropout", r)][t] for r in range(num)]) == list(range(num))
    findings = report.findings["replicas"]
    identical = [f for f in findings if f.kind == "identical_rng_streams"]
    assert [(f.name, f.replicas, f.first_step, f.last_step, f.count) for f in identical] == [
        ("dropout", list(range(num)), 0, steps - 1, steps)
    ]
    who = "0 and 1" if num == 2 else f"0–{num - 1}"
    assert identical[0].message.startswith(
        f"Replicas {who} draw identical dropout masks in layer `dropout`"
    )
    assert not [f for f in findings if f.kind == "rng_desync"]
    return rng


def check_recorded_state_is_the_drawn_one(rng, masks, num):
    """The recorded state reproduces, on its own, the exact mask each replica applied."""
    for t in range(rng.steps.size):
        for r in range(num):
            keras_state = rng.state[t, 0, r, :2]
            seed = tf.cast(tf.math.floormod(keras_state, tf.int32.max - 1), tf.int32)
            shape = masks[("dropout", r)][t].shape
            redrawn = tf.nn.experimental.stateless_dropout(
                tf.ones(shape), rate=dropout_masks.RATE, seed=seed
            )
            np.testing.assert_array_equal(redrawn.numpy() != 0, masks[("dropout", r)][t])

            state = rng.state[t, 1, r, :3]
            counter = tf.bitcast(tf.constant(state[:2], tf.int64), tf.uint64)
            key = tf.bitcast(tf.constant(state[2:3], tf.int64), tf.uint64)
            replica_key = tf.raw_ops.StatelessRandomUniformFullIntV2(
                shape=[1], key=key, counter=tf.constant([r, 0], tf.uint64), alg=1, dtype=tf.uint64
            )
            uniform = tf.raw_ops.StatelessRandomUniformV2(
                shape=shape, key=replica_key, counter=counter, alg=1, dtype=tf.float32
            )
            np.testing.assert_array_equal(
                uniform.numpy() >= dropout_masks.RATE, masks[("gen_dropout", r)][t]
            )


@pytest.fixture(scope="module")
def two_replica_masks(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("rng_2"))
    masks = dropout_masks.train(mirrored(2), logdir)
    return logdir, masks


def test_keras_dropout_masks_agree_with_finding_on_2_replicas(two_replica_masks):
    logdir, masks = two_replica_masks
    rng = check_masks_agree(logdir, masks, 2)
    check_recorded_state_is_the_drawn_one(rng, masks, 2)
    # The generator names are written once (one layout), the streams at every logged step.
    samples = tb_replica_plugin.load(logdir).runs["replicas"].samples
    assert [step for step, _ in samples["rng/generators"]] == [0]
    assert len(samples["rng/streams"]) == 8
    # A mirrored generator: equal state on both replicas even though their streams differ.
    assert (rng.state[:, 1, 0] == rng.state[:, 1, 1]).all()
    assert (rng.fingerprint[:, 1, 0] != rng.fingerprint[:, 1, 1]).all()


def test_keras_dropout_masks_agree_with_finding_on_4_replicas(tmp_path):
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "dropout_masks.py"), str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    masks = dropout_masks.load_masks(os.path.join(tmp_path, "masks.npz"))
    rng = check_masks_agree(str(tmp_path), masks, 4)
    check_recorded_state_is_the_drawn_one(rng, masks, 4)


def test_generator_desynchronised_on_one_replica(tmp_path):
    strategy = mirrored(2)
    with strategy.scope():
        g = tf.random.Generator.from_seed(5)
    probe = ReplicaProbe(str(tmp_path), strategy, update_freq=1)

    @tf.function
    def step(index):
        def step_fn():
            probe.observe_rng({"g": g}, include_global=False)
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            # Replica 1 draws 3 more numbers than replica 0 at step 2 (after the probe).
            extra = tf.cond(
                tf.logical_and(tf.equal(replica, 1), tf.equal(index, 2)),
                lambda: tf.reduce_sum(g.normal([3])),
                lambda: tf.constant(0.0),
            )
            return tf.reduce_sum(g.normal([4])) + extra

        return strategy.run(step_fn)

    for index in range(5):
        step(tf.constant(index))
    probe.close()
    report = tb_replica_plugin.load(str(tmp_path))
    series = next(iter(report.runs.values())).rng
    assert series.state[:3, 0, 0].tolist() == series.state[:3, 0, 1].tolist()
    assert series.state[3, 0, 0, 0] != series.state[3, 0, 1, 0]
    (finding,) = [f for f in next(iter(report.findings.values())) if f.kind == "rng_desync"]
    assert (finding.name, finding.replicas, finding.first_step, finding.count) == ("g", [1], 3, 2)
    assert finding.message.startswith("Generator `g` desynchronised on replica 1")


def test_stream_groups_and_rng_findings_on_series():
    generators = [
        {
            "name": "aug",
            "kind": "tf.random.Generator",
            "layer": None,
            "layer_class": None,
            "mirrored": True,
            "state_size": 3,
        }
    ]
    fingerprint = np.array([[[5, 6, 5, 7]], [[1, 2, 3, 4]]])  # [S=2, G=1, R=4]
    state = np.zeros((2, 1, 4, 3), np.int64)
    series = rng_read.RngSeries(
        "r", [0, 1, 2, 3], [""] * 4, generators, np.array([0, 9]), fingerprint, state, []
    )
    (finding,) = rng_rules.find_rng(series)
    assert (finding.kind, finding.replicas, finding.first_step, finding.count) == (
        "identical_rng_streams",
        [0, 2],
        0,
        1,
    )
    assert "Replicas 0 and 2 draw identical random numbers from generator `aug`" in (
        finding.message
    )
    assert rng_rules.find_rng(series, analysis.Thresholds(min_identical_rng_steps=2)) == []
    generators[0]["mirrored"] = False  # one shared state: draws serialised, not compared
    assert rng_rules.find_rng(series) == []
    assert rng_rules.stream_groups([5, 6, 5, 7]) == [0, 1, 0, 3]
    # The match matrix, compared a few steps at a time, equals the all-at-once mean.
    streams = np.random.default_rng(4).integers(0, 3, size=(37, 5))
    whole = (streams[:, :, None] == streams[:, None, :]).mean(axis=0)
    original = rng_present.MATCH_CELLS
    rng_present.MATCH_CELLS = 2 * 25  # two steps of 5 × 5 pairs at a time
    try:
        np.testing.assert_array_equal(rng_present.match_fraction(streams), whole)
        # Steps grouping the replicas alike are compared once, whatever the values drawn.
        alike = np.array([[7, 7, 9], [1, 1, 2], [5, 6, 5], [3, 3, 3], [8, 8, 4]])
        labels = rng_present.first_equal_replica(alike)
        assert labels.tolist() == [[0, 0, 2], [0, 0, 2], [0, 1, 0], [0, 0, 0], [0, 0, 2]]
        np.testing.assert_array_equal(
            rng_present.match_fraction(alike) * 5, [[5, 4, 2], [4, 5, 1], [2, 1, 5]]
        )
    finally:
        rng_present.MATCH_CELLS = original
    assert rng_present.match_fraction(np.array([[1, 1], [1, 2]])).tolist() == [[1, 0.5], [0.5, 1]]


def test_generator_created_outside_the_scope_is_shared_and_not_judged(tmp_path):
    strategy = mirrored(2)
    shared = tf.random.Generator.from_seed(3)  # outside strategy.scope(): one state
    probe = ReplicaProbe(str(tmp_path), strategy, update_freq=1)

    @tf.function
    def step():
        def step_fn():
            probe.observe_rng({"shared": shared}, include_global=False)
            return shared.normal([2])

        return strategy.run(step_fn)

    draws = [strategy.experimental_local_results(step()) for _ in range(3)]
    probe.close()
    # TensorFlow serialises the replicas' draws: they differ although the state is one.
    assert all(not np.array_equal(a.numpy(), b.numpy()) for a, b in draws)
    report = tb_replica_plugin.load(str(tmp_path))
    series = next(iter(report.runs.values())).rng
    assert series.generators[0]["mirrored"] is False
    assert next(iter(report.findings.values())) == []
    assert "not mirrored" in report.to_text()


def test_stream_groups_name_the_first_replica_of_each_equal_value():
    assert rng_rules.stream_groups([5, 5, 7, 5, 7, 9]) == [0, 0, 2, 0, 2, 5]
    rows = np.array([[1, 2], [3, 4], [1, 2], [1, 3]])  # [R, W]: whole rows are compared
    assert rng_rules.stream_groups(rows) == [0, 1, 0, 3]
    assert rng_rules.stream_groups(np.zeros((0, 3), np.int64)) == []
    many = np.arange(4096) % 2048  # a 4,096-replica job whose second half repeats the first
    assert rng_rules.stream_groups(many) == list(range(2048)) * 2


def test_shared_values_and_match_fraction_equal_the_pairwise_definition():
    # Random steps of few distinct values (some steps all alike, some partly, some distinct),
    # against the definitions: replica r shares when another replica holds its value; the match
    # fraction is the mean of equal pairs over steps (compared whole and a few cells at a time).
    rng = np.random.default_rng(1)
    original = rng_present.MATCH_CELLS
    try:
        for trial in range(200):
            values = rng.integers(0, rng.integers(1, 5), size=rng.integers(1, 7, size=2))
            if trial % 3 == 0:
                values[:] = values[:, :1]
            pairs = values[:, :, None] == values[:, None, :]
            expected = pairs.sum(axis=2) > 1
            np.testing.assert_array_equal(rng_rules.shared_values(values), expected)
            for cells in (original, 2):
                rng_present.MATCH_CELLS = cells
                np.testing.assert_array_equal(
                    rng_present.match_fraction(values), pairs.mean(axis=0)
                )
    finally:
        rng_present.MATCH_CELLS = original


def test_match_blocks_without_the_matrix_equal_those_of_the_matrix():
    """With more replicas than `matrix_side`, a generator none of whose steps splits the
    replicas into groups (each step: all drew their own stream, or all the same) gets its blocks
    without the R x R matrix: equal to the matrix's (`cut_to_blocks`). A step where two
    replicas share a stream and the others do not takes the matrix (its pair shows)."""
    from tb_replica_plugin.core.downsample import cut_to_blocks

    generator = {"name": "g", "kind": "tf.random.Generator", "layer": None}
    generator.update(layer_class=None, mirrored=True, state_size=1)
    rng = np.random.default_rng(3)
    for case in ("distinct", "some steps alike", "every step alike", "a pair shares"):
        fingerprint = rng.integers(-(2**62), 2**62, size=(6, 1, 10))
        if case == "some steps alike":
            fingerprint[[1, 4]] = fingerprint[[1, 4], :, :1]
        elif case == "every step alike":
            fingerprint[:] = fingerprint[:, :, :1]
        elif case == "a pair shares":
            fingerprint[4, 0, 7] = fingerprint[4, 0, 1]
        state = np.zeros((6, 1, 10, 1), np.int64)
        series = rng_read.RngSeries(
            "r", list(range(10)), [""] * 10, [generator], np.arange(6), fingerprint, state, []
        )
        (body,) = rng_present.rng_body(series, matrix_side=4)["generators"]
        (want,), pooled = cut_to_blocks([rng_present.match_fraction(fingerprint[:, 0])], 4)
        assert body["match"] == want.round(6).tolist() and body["pooled"] == pooled["pooled"]
        above = {"distinct": 0, "some steps alike": 45, "every step alike": 45, "a pair shares": 1}
        assert pooled["pooled"]["pairs_above_0"] == above[case], case
    # Blocks of 10 replicas by 4: [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]; the pair (1, 7) at 1 step of 6.
    assert body["match"][0] == [0.0, 0.0, round(1 / 6, 6), 0.0]


def test_hex64_lists_write_each_value_as_hex64():
    from tb_replica_plugin.core.downsample import hex64, hex64_lists

    values = np.array([[0, 1, -1], [2**63 - 1, -(2**63), 255]], np.int64)
    assert hex64_lists(values) == [[hex64(v) for v in row] for row in values]
    assert hex64_lists(values)[0] == ["0000000000000000", "0000000000000001", "f" * 16]
    assert hex64_lists(values[1]) == ["7fffffffffffffff", "8000000000000000", "00000000000000ff"]
