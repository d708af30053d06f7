"""Weight drift and placement: real MirroredStrategy on logical CPUs, values checked against a
hand computation from the copies' `.values` (2 replicas in-process, 4 via the demo logs)."""

import json
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TensorBoardServer, http_get, mirrored

import tb_replica_plugin
from tb_replica_plugin import ReplicaCallback, ReplicaProbe, analysis, cli
from tb_replica_plugin.core import jobs
from tb_replica_plugin.families.variables import check as variables_check
from tb_replica_plugin.families.variables import fingerprint as collector
from tb_replica_plugin.families.variables import read as variables_read
from tb_replica_plugin.families.variables import rules as variables_rules
from tb_replica_plugin.families.variables.merge import VariablesMerger

# The sketch estimate of ||copy_r - copy_0|| has a relative standard deviation of about
# 1 / sqrt(2W) = 9.1 % with W = 61 buckets (README "Weight drift"); about 4 standard deviations:
SKETCH_TOLERANCE = 0.35


M64 = (1 << 64) - 1


def reference_mix(z):
    """splitmix64's finalizer on Python integers."""
    (m1, m2), (s1, s2, s3) = collector.MIX_MULTIPLIERS, collector.MIX_SHIFTS
    z = ((z ^ (z >> s1)) * m1) & M64
    z = ((z ^ (z >> s2)) * m2) & M64
    return z ^ (z >> s3)


def reference_sketch(values):
    """The sketch of `values` computed by hand (Python integers for the row hash, numpy float64
    sums): rows of W = 61 elements, sign of element (r, c) from bit c of the hash of row r."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    k, w = collector.SKETCH_SIZE, collector.SKETCH_WIDTH
    if flat.size <= k:
        return np.pad(flat, (0, k - flat.size))
    rows = -(-flat.size // w)
    grid = np.pad(flat, (0, rows * w - flat.size)).reshape(rows, w)
    hashed = np.array(
        [
            reference_mix((((r + 1) * collector.GOLDEN) & M64) ^ collector.SKETCH_SEED)
            for r in range(rows)
        ],
        dtype=np.uint64,
    )
    bits = (hashed[:, None] >> np.arange(w, dtype=np.uint64)[None, :]) & np.uint64(1)
    signs = 1.0 - 2.0 * bits.astype(np.float64)
    return np.pad((signs * grid).sum(axis=0), (0, k - w))


def reference_hash(values):
    """The bitwise hash of `values` computed by hand (README "Data written"), as int64."""
    flat = np.ascontiguousarray(values).reshape(-1)
    word = {1: "<u1", 2: "<u2"}.get(flat.dtype.itemsize, "<u4")
    words = [int(w) for w in flat.view(word)]
    total = 0
    for j, u in enumerate(words):
        total += reference_mix((u + (j + 1) * collector.GOLDEN) & M64)
    total &= M64
    return total - (1 << 64) if total >= 1 << 63 else total


def test_bitwise_hash_sees_one_ulp_and_signed_zero():
    one = np.float32(1.0)
    cases = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array([1.5, -2.0]),
        np.array([3, -7], np.int64),
        np.array([1, 2, 3], np.float16),
        np.array([True, False, True]),
        np.array([5, 255], np.uint8),
        np.array([one, np.nextafter(one, np.float32(2))]),
        np.array([0.0, -0.0], np.float32),
    ]
    hashes = []
    for values in cases:
        tensor = tf.constant(values)
        hashes.append(int(collector.bitwise_hash(tensor, tensor.dtype)))
        assert hashes[-1] == reference_hash(values)
    ulp = [int(collector.bitwise_hash(tf.constant([v]), tf.float32)) for v in cases[-2]]
    zeros = [int(collector.bitwise_hash(tf.constant([v]), tf.float32)) for v in cases[-1]]
    assert ulp[0] != ulp[1] and zeros[0] != zeros[1]


def test_farmhash_on_cpu_mix64_elsewhere():
    cpu = "/job:localhost/replica:0/task:0/device:CPU:1"
    assert collector.hash_algorithm(cpu, tf.float32) == "farmhash64"
    assert collector.hash_algorithm("/job:worker/task:1/device:GPU:0", tf.float32) == "mix64"
    assert collector.hash_algorithm("", tf.float32) == "mix64"
    one = np.float32(1.0)
    cases = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array([3, -7], np.int64),
        np.array([True, False, True]),
        np.array([one, np.nextafter(one, np.float32(2))], np.float32),
        np.array([0.0, -0.0], np.float32),
    ]
    for values in cases:
        tensor = tf.constant(values)
        digest = int(collector.copy_hash(tensor, tensor.dtype, "farmhash64"))
        raw = np.ascontiguousarray(values).view(np.uint8).reshape(1, -1)
        expected = tf.bitcast(tf.fingerprint(tf.constant(raw)), tf.int64)
        assert digest == int(tf.reshape(expected, [])), values
        # Bit-identical copies hash equal; one element changed (one ulp, -0.0) changes it.
        assert digest == int(collector.copy_hash(tf.constant(values), tensor.dtype, "farmhash64"))
    ulp = [int(collector.farmhash(tf.constant([v]), tf.float32)) for v in cases[-2]]
    zeros = [int(collector.farmhash(tf.constant([v]), tf.float32)) for v in cases[-1]]
    assert ulp[0] != ulp[1] and zeros[0] != zeros[1]
    big = np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32)
    changed = big.copy()
    changed[200, 3] = np.nextafter(changed[200, 3], np.float32(10))
    hashes = {int(collector.farmhash(tf.constant(a), tf.float32)) for a in (big, changed)}
    assert len(hashes) == 2


def test_sketch_matches_reference_and_estimates_structured_differences():
    rng = np.random.default_rng(4)
    for shape in [(3, 5), (64,), (65,), (256, 256), (7, 61)]:
        values = rng.normal(size=shape).astype(np.float32)
        _, written = collector.copy_fingerprint(tf.constant(values), tf.float32)
        np.testing.assert_allclose(
            written.numpy()[4:], reference_sketch(values), rtol=1e-12, atol=1e-12
        )
        flat = values.astype(np.float64).reshape(-1)
        stats = [flat.min(), flat.max(), flat.sum(), np.sum(flat**2)]
        np.testing.assert_allclose(written.numpy()[:4], stats, rtol=1e-12)
    # Linear: the sketch of a difference is the difference of the sketches; and its norm
    # estimates the difference's norm for differences concentrated in a column (power-of-two
    # stride), a row, one element, or spread uniformly.
    base = rng.normal(size=(256, 256))
    column, row, single = (np.zeros((256, 256)) for _ in range(3))
    column[:, 17] = rng.normal(size=256)
    row[100] = rng.normal(size=256)
    single[5, 9] = 3.0
    for diff in (column, row, single, np.full((256, 256), 1e-3), rng.normal(size=(256, 256))):
        delta = reference_sketch(base + diff) - reference_sketch(base)
        np.testing.assert_allclose(delta, reference_sketch(diff), atol=1e-9)
        ratio = np.linalg.norm(delta) / np.linalg.norm(diff)
        assert abs(ratio - 1) < SKETCH_TOLERANCE, ratio


def test_agreeing_copies_share_replica_0s_summary_bit_for_bit():
    """The tf.cond shortcut (one summary when every hash equals replica 0's) writes exactly what
    summarizing every copy writes: agreeing, drifted and mixed checks, traced and eager."""
    strategy = mirrored(2)
    rng = np.random.default_rng(7)
    with strategy.scope():
        variables = [
            tf.Variable(rng.normal(size=[70, 9]).astype("float32"), name="big"),
            tf.Variable(rng.normal(size=[300]).astype("float32"), name="same_size"),
            tf.Variable(rng.normal(size=[5]).astype("float32"), name="small"),
            tf.Variable(tf.constant(3, tf.int64), name="count"),
        ]
    devices = list(strategy.extended.worker_devices)
    entries = collector.describe_variables(variables, devices)
    traced = tf.function(lambda: variables_check.VariablesStats(entries, 2).fingerprint)

    def per_copy():
        rows = []
        for entry in entries:
            row = []
            for copy in entry.copies:
                with tf.device(copy.device):
                    row.append(collector.copy_summary(tf.convert_to_tensor(copy), entry.dtype))
            rows.append(tf.stack(row))
        return tf.stack(rows).numpy()

    for drift in ([], [0], [0, 1, 2, 3]):  # all agree; one differs; all differ
        for index in drift:
            copy = variables[index].values[1]
            copy.assign_add(tf.ones_like(copy))
        expected = per_copy()
        assert (np.array_equal(expected[:, 0], expected[:, 1])) == (not drift)
        for fingerprint in (traced(), variables_check.VariablesStats(entries, 2).fingerprint):
            np.testing.assert_array_equal(fingerprint.numpy(), expected)


def only(logdir):
    report = tb_replica_plugin.load(logdir)
    assert len(report.runs) == 1, list(report.runs)
    (name,) = report.runs
    return report.runs[name].variables, report.findings[name]


# ----------------------------------------------------------------- synchronous fit (2 replicas)


@pytest.fixture(scope="module")
def fit_every_step(tmp_path_factory):
    """Keras fit, 2 replicas, drift checked every step with the exact check too."""
    logdir = str(tmp_path_factory.mktemp("fit_every_step"))
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(40, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype("float32")
    y = rng.normal(size=(32, 1)).astype("float32")
    model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
        epochs=2,
        verbose=0,
        callbacks=[ReplicaCallback(logdir, update_freq=1, variables_exact=True)],
    )
    return logdir, model


def test_sync_fit_on_2_replicas_is_bit_identical_at_every_step(fit_every_step):
    logdir, model = fit_every_step
    series, findings = only(logdir)
    assert series.steps.tolist() == list(range(8))
    assert series.source == "fit"
    names = series.names
    assert names[:4] == [v.path for v in model.variables]
    # The optimizer's variables: "adam/iteration", or "adam_<n>/..." when an earlier test of
    # the process made Adam optimizers (Keras numbers their names).
    optimizer = model.optimizer.name
    assert f"{optimizer}/iteration" in names and any(n.endswith("_momentum") for n in names)
    assert series.present.all() and all(v["mirrored"] for v in series.variables)
    assert series.identical.all()
    for array in (series.rel_l2, series.max_abs, series.exact_max_abs, series.exact_rel_l2):
        assert np.all(array == 0.0)
    assert findings == []
    # The last logged fingerprint is that of the weights after the last update.
    kernel = model.variables[0].value
    for column, copy in enumerate(kernel.values):
        algorithm = collector.hash_algorithm(copy.device, copy.dtype)
        assert algorithm == "farmhash64"  # logical CPU replicas
        digest, values = collector.copy_fingerprint(
            tf.convert_to_tensor(copy), copy.dtype, algorithm=algorithm
        )
        assert series.hash[-1, 0, column] == int(digest)
        np.testing.assert_allclose(series.stats[-1, 0, column], values.numpy()[:4], rtol=1e-12)


def test_default_callback_checks_at_epoch_ends(unit_logs):
    report = tb_replica_plugin.load(os.path.join(unit_logs, "fit_17_8"))
    series = report.runs["replicas"].variables
    assert series.steps.tolist() == [2]  # one epoch of 3 steps: its last step
    assert not series.exact.any()
    assert series.identical.all() and np.all(series.rel_l2 == 0.0)
    kernel, bias = series.variables[:2]
    assert (kernel["shape"], bias["shape"], kernel["trainable"]) == ([3, 1], [1], True)


# -------------------------------------------------------- skipped all-reduce (custom loop)


@pytest.fixture(scope="module")
def skipped_allreduce(tmp_path_factory):
    """Each copy updated with its own replica's gradient; hand values kept at every step."""
    logdir = str(tmp_path_factory.mktemp("skipped"))
    strategy = mirrored(2)
    keras.utils.set_random_seed(3)  # the same initial weights whatever ran before
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(20, activation="tanh"), keras.layers.Dense(1)]
        )
    lone = tf.Variable(tf.ones([5]), name="lone")  # outside strategy.scope(): one device
    rng = np.random.default_rng(1)
    x = rng.normal(size=(48, 6)).astype("float32")
    y = rng.normal(size=(48, 1)).astype("float32")
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    )
    probe = ReplicaProbe(os.path.join(logdir, "replicas"), strategy, update_freq=1)
    variables = model.variables + [lone]

    @tf.function
    def train_step(batch):
        def step_fn(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(features) - labels))
            return tape.gradient(loss, model.trainable_variables)

        grads = strategy.run(step_fn, args=batch)
        for variable, grad in zip(model.trainable_variables, grads, strict=True):
            local = strategy.experimental_local_results(grad)
            for copy, local_grad in zip(variable.value.values, local, strict=True):
                copy.assign_sub(0.1 * local_grad)
        lone.assign_add(tf.ones([5]))
        probe.observe_variables(variables, exact=True)  # cross-replica, in a tf.function

    copies = []
    for batch in dataset:
        train_step(batch)
        copies.append([[c.numpy() for c in v.value.values] for v in model.variables])
    probe.close()
    return logdir, model, copies


def test_skipped_allreduce_matches_hand_computation(skipped_allreduce):
    logdir, model, copies = skipped_allreduce
    series, _ = only(logdir)
    assert series.steps.tolist() == list(range(len(copies)))
    assert series.exact.all()
    for s, per_variable in enumerate(copies):
        for v, (copy0, copy1) in enumerate(per_variable):
            diff = copy1.astype(np.float64) - copy0.astype(np.float64)
            norm0 = np.linalg.norm(copy0.astype(np.float64))
            true_max_abs = np.abs(diff).max()
            true_rel = np.linalg.norm(diff) / norm0
            # Exact check: to float precision.
            np.testing.assert_allclose(series.exact_max_abs[s, v, 1], true_max_abs, rtol=1e-12)
            np.testing.assert_allclose(series.exact_rel_l2[s, v, 1], true_rel, rtol=1e-9)
            # Default check: the sketches are exactly the hand-computed ones...
            for column, copy in enumerate((copy0, copy1)):
                np.testing.assert_allclose(
                    series.sketch[s, v, column], reference_sketch(copy), rtol=1e-9, atol=1e-12
                )
                np.testing.assert_allclose(
                    series.stats[s, v, column, 3], np.sum(copy.astype(np.float64) ** 2), rtol=1e-12
                )
            # ...so the estimate is the norm of their difference, within the documented bound.
            estimate = series.rel_l2_estimate[s, v, 1]
            if copy0.size <= collector.SKETCH_SIZE:
                np.testing.assert_allclose(estimate, true_rel, rtol=1e-9)
                np.testing.assert_allclose(series.max_abs_lower[s, v, 1], true_max_abs)
            else:
                assert abs(estimate / true_rel - 1) < SKETCH_TOLERANCE, (s, v, estimate, true_rel)
                assert series.max_abs_lower[s, v, 1] <= true_max_abs * (1 + 1e-12)
            assert series.rel_l2[s, v, 1] == series.exact_rel_l2[s, v, 1]  # exact wins
    # Divergence > 0 from the first update, and growing.
    rel = series.exact_rel_l2[:, :4, 1]
    assert np.all(rel > 0)
    distance = np.sqrt(np.sum(np.square(series.exact_l2[:, :4, 1]), axis=1))  # whole model
    assert distance[-1] > distance[0] and distance[len(distance) // 2] > distance[0]


def test_skipped_allreduce_findings_and_unmirrored_variable(skipped_allreduce):
    logdir, model, _ = skipped_allreduce
    series, findings = only(logdir)
    lone = series.variables[-1]
    assert lone["name"] == "lone" and lone["mirrored"] is False
    assert lone["devices"] == ["/job:localhost/replica:0/task:0/device:CPU:0"]
    assert series.present[-1].tolist() == [True, False]
    assert np.isnan(series.rel_l2[:, -1, 1]).all()
    (drift,) = [f for f in findings if f.kind == "variable_drift"]  # one cause: one finding
    assert [i["name"] for i in drift.items] == [v.path for v in model.trainable_variables]
    assert (drift.severity, drift.first_step, drift.replicas) == ("error", 0, [1])
    assert all(i["severity"] == "error" and i["first_step"] == 0 for i in drift.items)
    assert drift.message.startswith("4 trainable variables (") and "and 1 more" in drift.message
    assert "not all-reduced" in drift.message and "not all-reduced" in drift.items[0]["message"]
    (unmirrored,) = [f for f in findings if f.kind == "variable_not_mirrored"]
    assert (unmirrored.name, unmirrored.replicas, unmirrored.severity) == ("lone", [1], "warning")
    assert "strategy.scope()" in unmirrored.message


def test_replica_context_and_update_freq(tmp_path):
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    probe = ReplicaProbe(str(tmp_path / "replicas"), strategy, update_freq=2)
    probe.set_step(10)

    @tf.function
    def train_step(features):
        def step_fn(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            probe.observe_variables(model.variables)  # replica context: merge_call

        strategy.run(step_fn, args=(features,))

    for i in range(5):
        train_step(tf.fill([4, 2], float(i)))
    probe.close()
    series, findings = only(str(tmp_path))
    assert series.steps.tolist() == [10, 12, 14]  # steps 10..14, every 2nd
    assert series.identical.all() and findings == []


def test_failure_warns_and_never_raises(tmp_path):
    probe = ReplicaProbe(str(tmp_path), mirrored(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe.observe_variables([object()])
        probe.observe_variables([object()])
    probe.close()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "could not record variables" in messages[0]


# ----------------------------------------------------------------- pure analysis


def synthetic(rel_values, trainable=True, sync="on_write", hashes=None, version=2, name="w"):
    """A 2-replica, 1-variable series whose copy 1 differs from copy 0 by `rel_values`."""
    placement = {
        "fingerprint": {"version": version},
        "devices": ["/cpu:0", "/cpu:1"],
        "replicas": [0, 1],
        "variables": [
            {
                "name": name,
                "shape": [2],
                "dtype": "float32",
                "trainable": trainable,
                "sync": sync,
                "devices": ["/cpu:0", "/cpu:1"],
                "columns": [0, 1],
                "mirrored": True,
                **({"hash": hashes} if hashes else {}),
            }
        ],
    }

    def fingerprint(values):
        stats = [values.min(), values.max(), values.sum(), (values**2).sum()]
        return np.concatenate([stats, values, np.zeros(collector.SKETCH_SIZE - values.size)])

    hash_points, fingerprints = [], []
    base = np.array([3.0, 4.0])  # norm 5
    for step, rel in enumerate(rel_values):
        other = base + np.array([5.0 * rel, 0.0])
        fingerprints.append((step, np.stack([fingerprint(base), fingerprint(other)])[None]))
        hash_points.append((step, np.array([[7, 7 if rel == 0 else 8]], dtype=np.int64)))
    return variables_read.build_variables_series(
        "run", [(0, placement)], hash_points, fingerprints, []
    )


def test_hashes_of_different_algorithms_are_never_compared():
    # Copy 0 on a CPU (farmhash64), copy 1 on a GPU (mix64): equal hash values mean nothing.
    mixed = synthetic([0.0, 0.0, 1e-3], hashes=["farmhash64", "mix64"])
    assert mixed.hash_comparable.tolist() == [[True, False]]
    assert not mixed.identical[:, 0, 1].any()
    # The sketch decides: identical values give 0 and no finding (bit identity unknown).
    np.testing.assert_allclose(mixed.rel_l2[:, 0, 1], [0.0, 0.0, 1e-3])
    assert any("different algorithm" in note for note in mixed.notes)
    assert [f.kind for f in variables_rules.find_variables(mixed)] == ["variable_drift"]
    assert (
        variables_rules.find_variables(synthetic([0.0, 0.0], hashes=["farmhash64", "mix64"])) == []
    )
    # Logs of version 1 (no "hash" per copy) used mix64 everywhere: comparable.
    old = synthetic([0.0, 1e-8], version=1)
    assert old.hash_comparable.all() and old.identical[:, 0, 1].tolist() == [True, False]


def test_workers_with_different_fingerprint_versions_are_not_merged():
    class Member:
        def __init__(self, series):
            self.variables = series

    notes = []
    workers = [{"name": "worker_0"}, {"name": "worker_1"}]
    same = [Member(synthetic([0.0, 1e-3])), Member(synthetic([0.0, 1e-3]))]
    merged = jobs.merge_all(VariablesMerger, "job", same, workers, notes)
    assert merged.num_replicas == 4 and merged.hash_comparable.all() and notes == []
    assert merged.variables[0]["hash"] == ["mix64"] * 4
    mixed = [Member(synthetic([0.0, 1e-3])), Member(synthetic([0.0, 1e-3], version=1))]
    assert jobs.merge_all(VariablesMerger, "job", mixed, workers, notes) is None
    assert "different versions" in notes[-1]


def test_job_holds_each_row_bit_identical_to_global_replica_0_once():
    class Member:
        def __init__(self, series):
            self.variables = series

    first, second = synthetic([0.0, 0.0, 1e-3]), synthetic([0.0, 0.0, 1e-3])
    second.hash[1] += 1  # at step 1 worker 1's copies agree with each other, not with worker 0's
    second_stats = second.stats.copy()
    workers = [{"name": "worker_0"}, {"name": "worker_1"}]
    merged = jobs.merge_all(VariablesMerger, "job", [Member(first), Member(second)], workers, [])
    # 12 rows were written (3 steps x 4 copies); kept: global replica 0's (3), the drifted copies
    # at step 2 (2) and worker 1's copies at step 1 (2).
    assert len(merged.rows) == 7
    assert merged.identical[:, 0].tolist() == [
        [True, True, True, True],
        [True, True, False, False],
        [True, False, True, False],
    ]
    np.testing.assert_allclose(
        merged.rel_l2[:, 0], [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1e-3, 0, 1e-3]], rtol=1e-9
    )
    # Every copy's fingerprint reads the same values, in the job and in the worker's own series.
    np.testing.assert_array_equal(merged.stats[:, :, 2:], second_stats)
    np.testing.assert_array_equal(second.stats, second_stats)  # the worker's own: untouched
    # A worker that logged a step more: the job has the steps both logged.
    longer = synthetic([0.0, 0.0, 1e-3, 2e-3])
    longer_stats = longer.stats.copy()
    shorter = synthetic([0.0, 0.0, 1e-3])
    merged = jobs.merge_all(VariablesMerger, "job", [Member(shorter), Member(longer)], workers, [])
    assert merged.steps.tolist() == [0, 1, 2] and longer.row_of.shape[0] == 4
    np.testing.assert_array_equal(longer.stats, longer_stats)
    np.testing.assert_array_equal(merged.stats[:, :, 2:], longer_stats[:3])
    # A worker that wrote no fingerprint (its rows [0, 4]) joins: no common step, no error.
    lone, empty = synthetic([0.0]), synthetic([])
    joined = jobs.merge_all(VariablesMerger, "job", [Member(lone), Member(empty)], workers, [])
    assert joined.steps.size == 0 and joined.rows.shape[1] == lone.rows.shape[1]


def test_a_workers_last_step_written_again_keeps_its_rows_in_the_table():
    """A live job's look re-merges each worker's last step (`since`): copies with the hash they
    had keep their rows; only a changed copy adds one (the table does not grow at every look)."""

    class Member:
        def __init__(self, series):
            self.variables = series

    workers = [{"name": "worker_0"}, {"name": "worker_1"}]
    merger = VariablesMerger(2)
    first, second = synthetic([0.0, 0.0, 1e-3]), synthetic([0.0, 0.0, 1e-3])
    merger.add(0, Member(first), None)
    merger.add(1, Member(second), None)
    rows_before, merged = merger.count, merger.result("job", [0, 1], workers, [])
    row_of = merged.row_of.copy()
    for _ in range(3):  # three looks, each re-reading the last step of both workers
        merger.add(0, Member(synthetic([0.0, 0.0, 1e-3])), 2)
        merger.add(1, Member(synthetic([0.0, 0.0, 1e-3])), 2)
    again = merger.result("job", [0, 1], workers, [])
    assert merger.count == rows_before
    np.testing.assert_array_equal(again.row_of, row_of)
    np.testing.assert_array_equal(again.stats, merged.stats)
    # Worker 1's last step written again with another value: its drifted copies get new rows.
    changed = synthetic([0.0, 0.0, 2e-3])
    changed.hash[2] += 1
    merger.add(1, Member(changed), 2)
    assert merger.count == rows_before + 2
    result = merger.result("job", [0, 1], workers, [])
    np.testing.assert_allclose(result.rel_l2[2, 0], [0, 1e-3, 0, 2e-3], rtol=1e-9)


def test_findings_tolerance_bits_and_sync_on_read():
    exact_zero = synthetic([0.0, 0.0])
    assert variables_rules.find_variables(exact_zero) == []
    tiny = synthetic([0.0, 1e-8, 2e-8])
    (info,) = variables_rules.find_variables(tiny)
    assert (info.kind, info.severity, info.first_step) == ("variable_bits_differ", "info", 1)
    drift = synthetic([0.0, 1e-3, 5e-3])
    (error,) = variables_rules.find_variables(drift)
    assert (error.kind, error.severity, error.first_step, error.count) == (
        "variable_drift",
        "error",
        1,
        2,
    )
    np.testing.assert_allclose(error.value, 5e-3)
    assert "from step 1" in error.message
    (warning,) = variables_rules.find_variables(synthetic([0.0, 1e-3], trainable=False))
    assert (warning.kind, warning.severity) == ("variable_drift", "warning")
    assert "non-trainable" in warning.message
    # BatchNormalization moving statistics: known framework behaviour, whatever the difference.
    for rel in ([0.0, 1e-3], [0.0, 1e-8]):
        (known,) = variables_rules.find_variables(
            synthetic(rel, trainable=False, name="bn/moving_mean")
        )
        assert (known.kind, known.severity, known.cause) == (
            "per_replica_statistics",
            "info",
            "bn_moving_statistics",
        )
        assert "synchronized=True" in known.message
    assert variables_rules.find_variables(synthetic([0.0, 1e-3], sync="on_read")) == []
    loose = analysis.Thresholds(variable_drift_rel_l2=1e-2)
    assert [f.kind for f in variables_rules.find_variables(drift, loose)] == [
        "variable_bits_differ"
    ]


# ---------------------------------------------------------------- 4 replicas (demo logs)


def demo_series(demo_logs, run):
    report = tb_replica_plugin.load(demo_logs, run=run)
    return report.runs[run].variables, report.findings[run]


def test_sync_fit_on_4_replicas_is_bit_identical(demo_logs):
    series, findings = demo_series(demo_logs, "balanced/replicas")
    assert series.num_replicas == 4 and series.steps.tolist() == [7, 15, 23]
    assert series.identical.all() and np.all(series.rel_l2 == 0.0)
    assert not [f for f in findings if f.kind.startswith("variable")]
    series, findings = demo_series(demo_logs, "weight_drift/synchronized")
    assert series.steps.tolist() == list(range(12))
    assert series.identical.all() and np.all(series.rel_l2 == 0.0)
    assert np.all(series.exact_max_abs[series.exact] == 0.0)
    assert findings == []


def test_skipped_allreduce_on_4_replicas_drifts_from_the_first_step(demo_logs):
    series, findings = demo_series(demo_logs, "weight_drift/skipped_allreduce")
    assert series.steps.tolist() == list(range(12))
    assert series.exact.tolist() == [s % 4 == 0 for s in range(12)]
    rel = series.rel_l2[:, :, 1:]
    assert np.all(rel > 0) and not series.identical[:, :, 1:].any()
    # ||copy_r - copy_0|| over the whole model, per replica: growing.
    distance = np.sqrt(np.sum(np.square(series.l2_estimate[:, :, 1:]), axis=1))
    assert np.all(distance[-1] > distance[0]) and np.all(distance[6] > distance[0])
    # Default estimate against the exact check where both ran (4 replicas).
    at = series.exact
    estimate, exact = series.rel_l2_estimate[at][:, :, 1:], series.exact_rel_l2[at][:, :, 1:]
    assert np.all(np.abs(estimate / exact - 1) < SKETCH_TOLERANCE)
    assert np.all(series.max_abs_lower[at][:, :, 1:] <= series.exact_max_abs[at][:, :, 1:] + 1e-12)
    (finding,) = findings
    assert finding.kind == "variable_drift" and len(finding.items) == 4
    assert all(i["replicas"] == [1, 2, 3] and i["first_step"] == 0 for i in finding.items)


def test_keras3_batchnorm_moving_statistics_drift(demo_logs):
    series, findings = demo_series(demo_logs, "weight_drift/batchnorm_fit")
    (finding,) = findings
    assert (finding.kind, finding.severity) == ("per_replica_statistics", "info")
    drifting = {i["name"].rsplit("/", 1)[-1] for i in finding.items}
    assert drifting == {"moving_mean", "moving_variance"}
    assert finding.message.startswith("1 BatchNormalization layer (")
    trainable = [i for i, v in enumerate(series.variables) if v["trainable"]]
    assert series.identical[:, trainable].all()


def test_report_text_and_json(demo_logs):
    report = tb_replica_plugin.load(demo_logs, run="weight_drift/*")
    text = report.to_text()
    assert "not all-reduced" in text and "bit-identical on every replica" in text
    runs = {r["run"]: r for r in report.to_json()["runs"]}
    body = runs["weight_drift/skipped_allreduce"]["variables"]
    assert body["steps"] == list(range(12)) and body["exact_steps"] == [0, 4, 8]
    assert len(body["top"]) == 4 and len(body["top"][0]["rel_l2"][0]) == 4
    assert body["top"][0]["rel_l2"][0][0] == 0.0  # replica 0 against itself
    json.dumps(report.to_json())


def test_report_on_weights_gone_nan_prints_no_numpy_warning(tmp_path, capsys):
    """fit with a BatchNormalization layer, a NaN example on replica 1 at step 0: replica 1's
    moving statistics are NaN from step 0 (replica 0's too from step 1, through the NaN
    weights), so every drift of theirs is NaN, and so is replica 1's every gradient norm.
    `tb-replica report` says so without a numpy RuntimeWarning, and `--json` as strict JSON."""
    logdir = str(tmp_path)
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(4),
                keras.layers.BatchNormalization(),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = np.random.default_rng(0).normal(size=(24, 3)).astype("float32")
    x[4 + 1, 2] = np.nan  # step 0 (global batch 8), replica 1's example 1
    callback = ReplicaCallback(logdir, update_freq=1, outputs=False, examples=False, rng=False)
    model.fit(
        x,
        np.zeros((24, 1), "float32"),
        batch_size=8,
        shuffle=False,
        verbose=0,
        callbacks=[callback],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["report", logdir]) == 0
        text = capsys.readouterr().out
        assert cli.main(["report", logdir, "--json"]) == 0
        document = json.loads(capsys.readouterr().out)
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
    series, findings = only(logdir)
    statistics = [i for i, name in enumerate(series.names) if "moving_" in name]
    assert len(statistics) == 2 and np.isnan(series.rel_l2[:, statistics, 1]).all()
    (finding,) = [f for f in findings if f.kind == "per_replica_statistics"]
    assert (finding.replicas, finding.first_step, finding.count) == ([1], 0, 3)
    assert np.isnan(finding.value)
    assert "2 variables differ on replica 1 from step 0, relative L2 up to nan" in text
    assert "replica 1: median norm nan, last nan" in text
    # --json: strict JSON, the NaN value as the string "NaN" (docs/data-format.md).
    (run,) = document["runs"]
    (statistics,) = [f for f in run["findings"] if f["kind"] == "per_replica_statistics"]
    assert statistics["value"] == "NaN"
    assert [item["value"] for item in statistics["items"]] == ["NaN", "NaN"]
    assert [(f["replicas"], f["first_step"]) for f in run["findings"][:2]] == [([1], 0), ([0], 1)]


# ------------------------------------------------------------------------- HTTP route


@pytest.fixture(scope="module", params=[False, True], ids=["python_loader", "rustboard"])
def drift_server(request, skipped_allreduce):
    logdir = skipped_allreduce[0]
    server = TensorBoardServer(logdir, load_fast=request.param)
    try:
        server.wait_for(
            "/data/plugin/replicas/variables?run=replicas",
            lambda status, body: status == 200 and len(json.loads(body)["steps"]) == 6,
        )
        yield server
    finally:
        server.stop()


def test_variables_route(drift_server):
    url = drift_server.url + "/data/plugin/replicas/variables"
    status, body, _ = http_get(url + "?run=replicas&top=2")
    assert status == 200
    body = json.loads(body)
    assert body["steps"] == list(range(6)) and body["downsampled"] is False
    assert [v["name"] for v in body["variables"]][-1] == "lone"
    lone = body["variables"][-1]
    assert (lone["mirrored"], lone["present"], lone["bit_identical"]) == (
        False,
        [True, False],
        None,
    )
    assert len(body["top"]) == 2 and body["top"][0]["max_rel_l2"][-1] > 0
    status, body, _ = http_get(url + "?run=replicas&max_points=2")
    body = json.loads(body)
    assert body["steps"] == [0, 3] and body["downsampled"] is True
    assert http_get(url + "?run=replicas&top=0")[0] == 400
    assert http_get(url)[0] == 400
    assert http_get(url + "?run=nope")[0] == 404
