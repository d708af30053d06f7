"""Compatibility matrix: the same scenarios under Keras 3 (in this process) and tf_keras
(subprocesses, `tests/compat_scenarios.py`), read back through `tb_replica_plugin.load`.

Each README compatibility-table tick names the test here that backs it.
"""

import json
import os
import subprocess
import sys

import compat_scenarios
import numpy as np
import pytest
from conftest import REPO, mirrored

import tb_replica_plugin
from tb_replica_plugin.families.gradients import rules as gradients_rules

FLAVOURS = ("keras3", "tf_keras")
# What every flavour must record: steps, per-replica batch sizes, input names.
EXPECTED = {
    "default_strategy": ([0, 1, 2], [[8], [8], [4]], ["x", "y"]),
    "uneven_last": ([0, 1, 2], [[4, 4], [4, 4], [1, 0]], ["x", "y"]),
    "multi_io_dataset": (
        [0, 1],
        [[4, 4], [4, 4]],
        ["sample_weight", "x/a", "x/b", "y/out_1", "y/out_2"],
    ),
    "class_weight_numpy": ([0, 1], [[4, 4], [2, 2]], ["sample_weight", "x", "y"]),
    "frozen_generator": ([0, 1, 2], [[3, 3]] * 3, ["x", "y"]),
    "mixed_precision": ([0, 1, 2, 3], [[4, 4]] * 4, ["x", "y"]),
    "central_storage": ([0, 1], [[4, 4], [4, 4]], ["x", "y"]),
    "one_device": ([0, 1], [[8], [4]], ["x", "y"]),
}
CPU = "/job:localhost/replica:0/task:0/device:CPU:"
# `traced_once`: a layer's calls in the first fit, one per replica (2) per trace of the step,
# plus one symbolic call by Keras 3's `fit` before it traces the step.
EXPECTED_TRACE_CALLS = {"keras3": 3, "tf_keras": 2}


def _subprocess_scenarios(logdir, flavour, names):
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "tests", "compat_scenarios.py"),
            logdir,
            "--flavour",
            flavour,
            "--scenarios",
            ",".join(names),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.fixture(scope="session")
def keras3_results(tmp_path_factory):
    """Keras 3 runs the common scenarios in this process, on the shared 2-replica strategy."""
    import keras
    import tensorflow as tf

    logdir = str(tmp_path_factory.mktemp("compat_keras3"))
    names = compat_scenarios.COMMON + compat_scenarios.ADAPTER + compat_scenarios.CRASH
    results = compat_scenarios.run(names, keras, tf, mirrored(2), logdir)
    return logdir, results, ""


@pytest.fixture(scope="session")
def tf_keras_results(tmp_path_factory):
    """tf_keras (`TF_USE_LEGACY_KERAS=1`) runs every scenario in one subprocess."""
    pytest.importorskip("tf_keras")
    logdir = str(tmp_path_factory.mktemp("compat_tf_keras"))
    names = (
        compat_scenarios.COMMON
        + compat_scenarios.ADAPTER
        + compat_scenarios.TF_KERAS_ONLY
        + compat_scenarios.CRASH
        + compat_scenarios.CLUSTER
    )
    results, stderr = _subprocess_scenarios(logdir, "tf_keras", names)
    # tf_keras of TensorFlow's minor version (2.21 on the full suite's stack).
    import tensorflow as tf

    tf_minor = tf.__version__.split(".")[:2]
    assert results["_meta"]["keras_version"].split(".")[:2] == tf_minor, results["_meta"]
    return logdir, results, stderr


def _load(request, flavour, scenario):
    logdir, results, stderr = request.getfixturevalue(f"{flavour}_results")
    outcome = results[scenario]
    assert "error" not in outcome, f"{scenario} under {flavour}: {outcome['error']}\n{stderr}"
    report = tb_replica_plugin.load(os.path.join(logdir, scenario))
    (run,) = report.runs
    return report.runs[run].inputs, report.findings[run], outcome["facts"]


def _inputs(series):
    return [
        (event["step"], i["name"], i["dtypes"], i["shapes"])
        for event in series.shape_events
        for i in event["inputs"]
    ]


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_scenario_records_every_replica(request, flavour, scenario):
    series, _, facts = _load(request, flavour, scenario)
    steps, batch_size, names = EXPECTED[scenario]
    assert series.steps.tolist() == steps
    assert series.batch_size.tolist() == batch_size
    assert [i["name"] for i in series.shape_events[0]["inputs"]] == names
    assert series.source == "fit"
    assert facts["warnings"] == []


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_keras3_and_tf_keras_record_the_same(request, scenario):
    keras3, keras3_findings, _ = _load(request, "keras3", scenario)
    tf_keras, tf_keras_findings, _ = _load(request, "tf_keras", scenario)
    assert keras3.steps.tolist() == tf_keras.steps.tolist()
    assert keras3.batch_size.tolist() == tf_keras.batch_size.tolist()
    assert keras3.devices == tf_keras.devices
    assert _inputs(keras3) == _inputs(tf_keras)
    # Inputs findings only: gradient and output findings depend on each flavour's numbers (e.g.
    # which replica's float16 gradients overflow under a loss-scale optimizer, and when; Keras
    # 3.15's loss-scale optimizer lets a NaN reach the weights, so its outputs turn Inf); step
    # time findings depend on the machine's load (a `slow_replica` seen once under load).
    numeric = ("gradients", "watch", "step_time")
    assert [
        (f.kind, f.replicas, f.first_step) for f in keras3_findings if f.view not in numeric
    ] == [(f.kind, f.replicas, f.first_step) for f in tf_keras_findings if f.view not in numeric]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_strategy_devices(request, flavour):
    one_device, _, _ = _load(request, flavour, "one_device")
    assert one_device.devices == [CPU + "1"]
    default, _, _ = _load(request, flavour, "default_strategy")
    assert default.devices == [CPU + "0"]
    central, _, _ = _load(request, flavour, "central_storage")
    assert central.devices == [CPU + "0", CPU + "1"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_frozen_layer_stays_frozen(request, flavour):
    _, _, facts = _load(request, flavour, "frozen_generator")
    assert facts["frozen_unchanged"] and facts["head_changed"]
    assert facts["iterations"] == 3


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_mixed_precision_records_float32_inputs_and_continues_steps(request, flavour):
    series, _, facts = _load(request, flavour, "mixed_precision")
    assert {d for _, _, dtypes, _ in _inputs(series) for d in dtypes} == {"float32"}
    assert facts["compute_dtype"] == "float16"
    assert facts["loss_scaled"] is True
    assert facts["loss_scale"] > 1
    # Where the unscaling happens differs (see tb_replica_plugin.keras.compat.OptimizerInfo).
    assert facts["grads_scaled_at_apply"] is (flavour == "keras3")
    assert facts["iterations_count_skipped_steps"] is (flavour == "tf_keras")
    if flavour == "tf_keras":
        assert facts["iterations"] == 4
    else:
        # Skipped overflow steps do not count: the step axis (0-3) cannot follow iterations.
        assert facts["iterations"] <= 4


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_gradient_hook_gets_local_unscaled_gradients(request, flavour):
    """The adapter gradient collectors build on: per-replica local norms, loss scale removed."""
    _, results, stderr = request.getfixturevalue(f"{flavour}_results")
    outcome = results["gradient_hook"]
    assert "error" not in outcome, outcome["error"] + stderr
    float32, mixed = outcome["facts"]["float32"], outcome["facts"]["mixed_float16"]
    assert mixed["loss_scale"] == 1024.0 and float32["loss_scale"] == 1.0
    assert mixed["grads_scaled_at_apply"] is (flavour == "keras3")
    # Local, before the all-reduce: each replica has its own norm (replica 1's data is ×3).
    assert float32["norms"][1] > 2 * float32["norms"][0] > 0
    assert mixed["norms"] == pytest.approx(float32["norms"], rel=1e-2)
    assert float32["restored"] and mixed["restored"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_step_traced_once_by_the_first_fit_and_not_by_the_second(request, flavour):
    """tf_keras creates the optimizer's slots inside the first trace and TensorFlow then traces
    again; the callback builds the optimizer first, so both flavours trace the step once."""
    _, results, stderr = request.getfixturevalue(f"{flavour}_results")
    outcome = results["traced_once"]
    assert "error" not in outcome, outcome["error"] + stderr
    assert outcome["facts"] == {"first_fit": EXPECTED_TRACE_CALLS[flavour], "second_fit": 0}


def test_tf_keras_first_batch_7_on_2_replicas(request):
    series, findings, facts = _load(request, "tf_keras", "first_batch_7")
    assert series.batch_size.tolist() == [[4, 3], [4, 3], [1, 0]]
    assert series.shape_events[0]["inputs"][0]["shapes"] == [[4, 3], [3, 3]]
    assert [f.kind for f in findings] == ["first_batch_uneven", "uneven_batch", "empty_shard"]
    assert facts["iterations"] == 3 and facts["warnings"] == []


def test_tf_keras_ragged_text_records_exact_rows_per_replica_and_outputs(request):
    """Ragged token ids under fit with an uneven last batch: the recorded batch size is each
    replica's nrows, exactly as iterating the distributed dataset gives them."""
    logdir, _, _ = request.getfixturevalue("tf_keras_results")
    series, findings, facts = _load(request, "tf_keras", "ragged_text")
    expected = facts["expected"]
    assert [step["nrows"] for step in expected] == [[4, 4], [4, 4], [1, 0]]
    assert series.batch_size.tolist() == [step["nrows"] for step in expected]
    events = {event["step"]: event for event in series.shape_events}
    assert sorted(events) == [0, 2]  # row lengths change every step, rows only at step 2
    for step, event in events.items():
        x = event["inputs"][0]
        assert x["name"] == "x" and x["kinds"] == ["ragged", "ragged"]
        assert x["shapes"] == [[rows, -1] for rows in expected[step]["nrows"]]
        assert [s[0] for s in x["structure"]] == expected[step]["values"]  # total tokens
    assert [f.kind for f in findings] == ["empty_shard"]
    assert facts["warnings"] == [] and facts["iterations"] == 3
    run = tb_replica_plugin.load(os.path.join(logdir, "ragged_text")).runs
    (outputs,) = [data.watch.values["outputs"] for data in run.values()]
    assert [leaf["shapes"] for e in outputs.shape_events for leaf in e["leaves"]] == [
        [[4, 1], [4, 1]],
        [[1, 1], [0, 1]],
    ]


def test_tf_keras_steps_per_execution_2_records_every_step(request):
    series, findings, facts = _load(request, "tf_keras", "steps_per_execution_2")
    assert series.steps.tolist() == list(range(10))
    assert series.batch_size.tolist() == [[2, 2]] * 10
    assert series.dense_steps.tolist() == list(range(10))  # update_freq=1
    assert findings == [] and facts["iterations"] == 10


def test_tf_keras_parameter_server_fit_records_each_worker(request):
    """tf_keras `fit` under ParameterServerStrategy records (tests/test_pss.py has the cluster
    of 2 ps and the uneven workers); Keras 3's fit has no such strategy."""
    logdir, results, stderr = request.getfixturevalue("tf_keras_results")
    outcome = results["parameter_server"]
    assert "error" not in outcome, outcome["error"] + stderr
    facts = outcome["facts"]
    assert facts["iterations"] == 4
    # (Probes of the earlier scenarios in this process may warn once that their background
    # flush failed: connecting to the cluster replaces the eager context.)
    assert not [w for w in facts["warnings"] if "records nothing" in w], facts["warnings"]
    assert facts["run_dir_exists"]
    report = tb_replica_plugin.load(os.path.join(logdir, "parameter_server"))
    (data,) = report.runs.values()
    assert data.inputs.strategy == "ParameterServerStrategy"
    steps = data.inputs.steps.tolist()
    assert steps == list(range(len(steps))) and 1 <= len(steps) <= 2  # 4 steps on 2 workers
    assert data.inputs.batch_size.tolist() == [[8, 8]] * len(steps)
    assert len(data.gradients.variables) == 2  # the Dense layer's kernel and bias
    assert data.gradients.steps.tolist() == steps[-1:]  # update_freq="epoch": the last step
    assert (data.gradients.global_norm > 0).all() and np.isfinite(data.gradients.loss).all()


def test_tf_keras_imported_directly_without_legacy_env(tmp_path):
    """`import tf_keras` while `tf.keras` is Keras 3: the callback's Keras 3 base still works."""
    pytest.importorskip("tf_keras")
    results, stderr = _subprocess_scenarios(str(tmp_path), "tf_keras_direct", ["uneven_last"])
    assert "error" not in results["uneven_last"], results["uneven_last"]["error"] + stderr
    report = tb_replica_plugin.load(str(tmp_path / "uneven_last"))
    (data,) = report.runs.values()
    assert data.inputs.batch_size.tolist() == [[4, 4], [4, 4], [1, 0]]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_gradients_recorded_per_replica_in_both_flavours(request, flavour):
    """The gradients family under both flavours: the gradient of each replica's own loss."""
    logdir, results, stderr = request.getfixturevalue(f"{flavour}_results")
    assert "error" not in results["uneven_last"], stderr
    gradients = tb_replica_plugin.load(os.path.join(logdir, "uneven_last")).runs
    (series,) = [run.gradients for run in gradients.values()]
    assert series.scaling == "replica_loss" and series.has_loss
    assert series.steps.tolist() == [2]  # update_freq="epoch": the epoch's last step
    # Step 2 splits [1, 0]: replica 1 has no example, so no gradient.
    assert series.global_norm[0, 0] > 0 and series.global_norm[0, 1] == 0
    mixed = tb_replica_plugin.load(os.path.join(logdir, "mixed_precision")).runs
    (mixed_series,) = [run.gradients for run in mixed.values()]
    assert mixed_series.loss_scaled
    # float16 overflow under a loss-scale optimizer is expected (info) while the loss stays
    # finite; it is an error only when it reached the weights (the loss turned NaN/Inf) — which
    # Keras 3.15 allows when the overflow is not on replica 0 (its check reads replica 0 only).
    for finding in gradients_rules.find_gradients(mixed_series):
        if finding.kind != "nonfinite_gradients":
            continue
        if finding.severity == "error":
            assert "loss NaN/Inf" in finding.message or "after replica" in finding.message
        else:
            assert finding.severity == "info" and "expected" in finding.message


def _seeded_gradients(request, flavour, policy):
    logdir, results, stderr = request.getfixturevalue(f"{flavour}_results")
    outcome = results["seeded_norms"]
    assert "error" not in outcome, f"seeded_norms under {flavour}: {outcome['error']}\n{stderr}"
    report = tb_replica_plugin.load(os.path.join(logdir, "seeded_norms"), run=policy)
    (run,) = report.runs.values()
    return run.gradients


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_recorded_gradient_norms_equal_across_flavours(request, policy):
    """The same seeded fit under Keras 3 and tf_keras records the same per-replica norms."""
    keras3 = _seeded_gradients(request, "keras3", policy)
    tf_keras = _seeded_gradients(request, "tf_keras", policy)
    assert keras3.steps.tolist() == tf_keras.steps.tolist() == [0, 1]
    assert keras3.scaling == tf_keras.scaling == "replica_loss"
    tolerance = 1e-5 if policy == "float32" else 1e-2
    np.testing.assert_allclose(keras3.global_norm, tf_keras.global_norm, rtol=tolerance)
    np.testing.assert_allclose(keras3.variable_norms, tf_keras.variable_norms, rtol=tolerance)
    np.testing.assert_allclose(keras3.loss, tf_keras.loss, rtol=tolerance)
    # Local norms: the two replicas' shards differ, and so do their norms.
    assert np.all(np.abs(keras3.global_norm[:, 0] - keras3.global_norm[:, 1]) > 1e-3)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_mixed_precision_norms_are_unscaled_like_the_float32_twin(request, flavour):
    """Under `mixed_float16` the recorded norms are those of the float32 twin (scale undone)."""
    float32 = _seeded_gradients(request, flavour, "float32")
    mixed = _seeded_gradients(request, flavour, "mixed_float16")
    assert mixed.loss_scaled and not float32.loss_scaled
    assert mixed.nonfinite_steps.size == 0
    np.testing.assert_allclose(mixed.global_norm, float32.global_norm, rtol=1e-2)
    np.testing.assert_allclose(mixed.loss, float32.loss, rtol=1e-2)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_fit_that_crashes_on_replica_1_is_reported_with_step_replica_and_line(request, flavour):
    """`fit` raises `InvalidArgumentError` at step 3 on replica 1: the report's crash finding
    names the error, the step, the replica and the line of the model's assertion; the run's
    status is "crashed", recorded by the callback's train function."""
    logdir, results, stderr = request.getfixturevalue(f"{flavour}_results")
    outcome = results["crash_on_replica_1"]
    assert "error" not in outcome, f"{flavour}: {outcome['error']}\n{stderr}"
    facts = outcome["facts"]
    assert facts["error"] == "InvalidArgumentError"
    report = tb_replica_plugin.load(os.path.join(logdir, "crash_on_replica_1"))
    (run,) = report.runs
    (crash,) = [f for f in report.findings[run] if f.view == "status"]
    assert (crash.kind, crash.severity) == ("training_crashed", "error")
    assert (crash.first_step, crash.replicas) == (compat_scenarios.CRASH_STEP, [1])
    assert crash.message.startswith("Training crashed at step 3 with InvalidArgumentError")
    assert "replica 1" in crash.message
    assert f"compat_scenarios.py:{facts['line']} in call" in crash.message
    end = report.runs[run].status.end
    assert (end["state"], end["how"], end["step"]) == ("crashed", "fit", 3)
    assert end["exception"]["replicas"] == [1]
    assert end["exception"]["node"].startswith("replica_1/")
    assert report.to_json()["runs"][0]["status"]["state"] == "crashed"
