"""Multi-worker jobs: a real 2-worker MultiWorkerMirroredStrategy job on localhost, read as one job.

The job is the demo's (`demo/multiworker.py`, launched once by the `demo_logs` fixture: 2 worker
processes with `TF_CONFIG`, every scenario in sequence), so the suite starts workers once.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import REPO, TensorBoardServer, http_get

from demo import multiworker
from tb_replica_plugin import analysis, reader
from tb_replica_plugin.report import load

PLUGIN = "/data/plugin/replicas"
DEVICE = "/job:worker/replica:0/task:{}/device:CPU:0"


@pytest.fixture(scope="module")
def report(demo_logs):
    return load(demo_logs, "mw_*")


def test_workers_write_their_own_runs(demo_logs):
    for scenario in multiworker.SCENARIOS:
        runs = sorted(os.listdir(os.path.join(demo_logs, scenario, "replicas")))
        assert runs == ["worker_0", "worker_1"], (scenario, runs)


def test_one_job_view_with_every_global_replica(report):
    assert sorted(report.runs) == [f"{s}/replicas" for s in sorted(multiworker.SCENARIOS)]
    job = report.runs["mw_clean/replicas"]
    assert job.is_job
    assert [(w["name"], w["task_type"], w["task_index"], w["replicas"]) for w in job.workers] == [
        ("worker_0", "worker", 0, [0]),
        ("worker_1", "worker", 1, [1]),
    ]
    inputs = job.inputs
    assert inputs.replicas == [0, 1]
    assert inputs.devices == [DEVICE.format(0), DEVICE.format(1)]
    assert inputs.source == "custom_loop"
    # 64 examples, global batch 8 over 2 workers of 1 replica: 8 steps of [4, 4].
    assert inputs.steps.tolist() == list(range(8))
    assert inputs.batch_size.tolist() == [[4, 4]] * 8
    assert [e["inputs"][0]["shapes"] for e in inputs.shape_events] == [[[4, 4], [4, 4]]]
    assert inputs.dense.shape == (8, 3, 2)
    assert report.findings["mw_clean/replicas"] == []
    # Each worker's own run keeps its local view and its place in the job.
    worker = job.worker_runs["mw_clean/replicas/worker_1"].inputs
    assert worker.replicas == [1]
    assert worker.worker["task_index"] == 1 and worker.worker["num_workers"] == 2
    other = job.worker_runs["mw_clean/replicas/worker_0"].inputs.worker
    assert worker.worker["job"] == other["job"]


def test_tf_keras_fit_job(report):
    """tf_keras `fit` with ReplicaCallback under the 2-worker job: one job, every step."""
    job = report.runs["mw_fit_tf_keras/replicas"]
    assert [w["name"] for w in job.workers] == ["worker_0", "worker_1"]
    assert job.inputs.source == "fit"
    assert job.inputs.replicas == [0, 1]
    assert job.inputs.devices == [DEVICE.format(0), DEVICE.format(1)]
    # 64 examples, global batch 8, 2 epochs: 16 steps of [4, 4] (the step axis continues
    # across epochs from the optimizer's iterations).
    assert job.inputs.steps.tolist() == list(range(16))
    assert job.inputs.batch_size.tolist() == [[4, 4]] * 16
    assert report.findings["mw_fit_tf_keras/replicas"] == []
    # update_freq=1: a step time at every step, on every worker.
    assert job.step_time.steps.tolist() == list(range(16))


def test_clean_job_has_zero_cross_worker_drift(report):
    for run in ("mw_clean/replicas", "mw_straggler/replicas", "mw_uneven_shard/replicas"):
        variables = report.runs[run].variables
        assert variables.replicas == [0, 1]
        assert variables.steps.tolist() == report.runs[run].inputs.steps.tolist()
        # Every copy on worker 1 is bit-identical to worker 0's at every logged step.
        assert variables.identical.all(), run
        assert (variables.rel_l2 == 0).all() and (variables.max_abs == 0).all()
        assert all(v["mirrored"] for v in variables.variables)
        assert [v["columns"] for v in variables.variables] == [[0, 1]] * len(variables.variables)


def test_perturbed_worker_drifts_from_the_others(report):
    """Worker 1 adds PERTURBATION to its kernel copy after each update: only it drifts."""
    job = report.runs["mw_drift/replicas"]
    variables = job.variables
    kernel = next(i for i, v in enumerate(variables.variables) if v["name"].endswith("kernel"))
    steps = variables.steps
    assert steps.tolist() == list(range(8))
    # The kernel has 4 elements (fewer than the 64 sketch buckets), so its fingerprint is exact:
    # after step s worker 1's copy is worker 0's + (s + 1) * PERTURBATION in every element.
    drift = multiworker.PERTURBATION * (steps + 1)
    np.testing.assert_allclose(variables.max_abs[:, kernel, 1], drift, rtol=1e-3)
    np.testing.assert_allclose(variables.l2_estimate[:, kernel, 1], 2 * drift, rtol=1e-3)
    assert (variables.max_abs[:, kernel, 0] == 0).all()
    others = [i for i in range(len(variables.variables)) if i != kernel]
    assert variables.identical[:, others].all()
    found = [f for f in report.findings["mw_drift/replicas"] if f.kind == "variable_drift"]
    assert [(f.replicas, f.first_step, f.severity) for f in found] == [([1], 0, "error")]
    assert found[0].name == variables.variables[kernel]["name"]
    assert found[0].message.endswith(" On worker_1.")
    # Each worker's own run compares its own copies only: no drift inside a worker.
    for run, own in job.worker_runs.items():
        assert own.variables.replicas == [int(run[-1])]
        assert own.variables.identical.all()
        assert not analysis.find_variables(own.variables)


def test_uneven_shard_across_workers(report):
    job = report.runs["mw_uneven_shard/replicas"]
    assert job.inputs.batch_size.tolist() == [[4, 3]] * 4
    shapes = job.inputs.shape_events[0]["inputs"]
    assert [(i["name"], i["shapes"], i["mismatch"]) for i in shapes] == [
        ("x", [[4, 4], [3, 4]], False),
        ("y", [[4, 1], [3, 1]], False),
    ]
    uneven = [f for f in report.findings["mw_uneven_shard/replicas"] if f.kind == "uneven_batch"]
    assert len(uneven) == 1 and uneven[0].replicas == [1]
    assert " On worker_1." in uneven[0].message
    assert "worker_0: 4, worker_1: 3 per replica" in uneven[0].message


def test_slowed_worker_is_the_straggler(report):
    job = report.runs["mw_straggler/replicas"]
    timing = job.step_time
    assert timing.workers == ["worker_0", "worker_1"]
    assert timing.steps.tolist() == list(range(8))
    assert np.isnan(timing.period[0]).all() and np.isfinite(timing.period[1:]).all()
    # Worker 1 sleeps STRAGGLER_SLEEP on the host before each step: it arrives that much later
    # and worker 0 waits for it, so the periods agree but the busy times do not.
    lateness = np.median(timing.lateness[2:], axis=0)
    assert lateness[0] == 0.0
    assert abs(lateness[1] - multiworker.STRAGGLER_SLEEP) < 0.05
    busy = np.median(timing.busy[2:], axis=0)
    assert busy[1] >= multiworker.STRAGGLER_SLEEP * 0.95
    assert busy[0] < busy[1] / 2
    # (from step 2: at step 1 worker 0 still carries its early start at step 0)
    np.testing.assert_allclose(timing.period[2:, 0], timing.period[2:, 1], atol=0.05)
    stragglers = [f for f in report.findings["mw_straggler/replicas"] if f.kind == "straggler"]
    assert len(stragglers) == 1
    straggler = stragglers[0]
    assert (straggler.name, straggler.replicas, straggler.view) == ("worker_1", [1], "step_time")
    middle = np.median(busy)
    assert straggler.value == pytest.approx(busy[1] / middle, rel=1e-3)
    assert straggler.threshold == analysis.Thresholds().straggler_factor
    # No straggler when the workers are in step, and none above a looser factor.
    for run, findings in report.findings.items():
        if run != "mw_straggler/replicas":
            assert not [f for f in findings if f.kind == "straggler"], run
    loose = analysis.Thresholds(straggler_factor=3.0)
    assert not analysis.find_stragglers(timing, job.workers, loose)


@pytest.fixture(scope="module")
def server(demo_logs):
    # RustBoard (the Python loader serves the same job in tests/test_browser.py).
    tb = TensorBoardServer(demo_logs, load_fast=True)
    try:
        tb.wait_for(
            PLUGIN + "/runs",
            lambda status, body: (
                status == 200
                and sum(len(r["workers"]) == 2 for r in json.loads(body)["runs"])
                == len(multiworker.SCENARIOS)
            ),
        )
        yield tb
    finally:
        tb.stop()


def get_json(server, path):
    status, body, _ = http_get(server.url + path)
    return status, json.loads(body)


def test_routes_show_the_job(server):
    _, body = get_json(server, PLUGIN + "/runs")
    runs = {r["run"]: r for r in body["runs"]}
    assert not [name for name in runs if "/worker_" in name]
    job = runs["mw_straggler/replicas"]
    assert job["replicas"] == [0, 1]
    assert [w["name"] for w in job["workers"]] == ["worker_0", "worker_1"]
    assert job["findings"] == {"error": 0, "warning": 1, "info": 0}

    status, inputs = get_json(server, PLUGIN + "/inputs?run=mw_uneven_shard/replicas")
    assert status == 200
    assert inputs["batch_size"] == [[4, 3]] * 4
    assert [w["replicas"] for w in inputs["workers"]] == [[0], [1]]

    status, timing = get_json(server, PLUGIN + "/step_time?run=mw_straggler/replicas")
    assert status == 200
    assert timing["steps"] == list(range(8))
    assert timing["busy"][0] == ["NaN", "NaN"]
    assert timing["median_busy"][1] >= multiworker.STRAGGLER_SLEEP * 0.95
    status, small = get_json(server, PLUGIN + "/step_time?run=mw_straggler/replicas&max_points=2")
    assert small["downsampled"] is True and small["steps"] == [0, 4]

    _, findings = get_json(server, PLUGIN + "/findings?run=mw_straggler/replicas")
    assert [(f["kind"], f["name"]) for f in findings["findings"]] == [("straggler", "worker_1")]
    # A worker's own run stays readable by its name.
    status, own = get_json(server, PLUGIN + "/inputs?run=mw_clean/replicas/worker_1")
    assert status == 200 and own["replicas"] == [1] and own["workers"] == []
    assert get_json(server, PLUGIN + "/step_time?run=nope")[0] == 404
    assert get_json(server, PLUGIN + "/step_time")[0] == 400
    # A single-worker run has no step times.
    _, single = get_json(server, PLUGIN + "/step_time?run=balanced/replicas")
    assert single["steps"] == [] and single["workers"] == []


def test_report_json_and_text(report):
    document = report.to_json()
    runs = {r["run"]: r for r in document["runs"]}
    straggler = runs["mw_straggler/replicas"]
    assert [w["name"] for w in straggler["workers"]] == ["worker_0", "worker_1"]
    assert straggler["step_time"]["busy"][0] == [None, None]
    assert straggler["step_time"]["median_busy"][1] >= multiworker.STRAGGLER_SLEEP * 0.95
    text = report.to_text()
    assert "multi-worker job: 2 workers" in text
    assert "worker_1 (replicas 1): busy" in text


# ----------------------------------------------------------------- pure (no TensorFlow job)


def _member(run, worker, replicas, sizes, steps, times=None):
    series = reader.build_inputs_series(
        run,
        [
            {
                "step": steps[0],
                "inputs": [
                    {
                        "name": "x",
                        "dtypes": ["float32"] * len(replicas),
                        "shapes": [[s, 3] for s in sizes],
                        "mismatch": False,
                        "mismatch_dims": [],
                    }
                ],
                "devices": [DEVICE.format(worker) for _ in replicas],
                "replicas": replicas,
                "source": "custom_loop",
                "worker": {
                    "task_type": "worker",
                    "task_index": worker,
                    "worker": worker,
                    "num_workers": 3,
                    "job": "abc",
                },
            }
        ],
        [(s, np.array([sizes, sizes, sizes])) for s in steps],
    )
    samples = {}
    if times is not None:
        samples[reader.TAG_TIME] = [(s, np.array(t)) for s, t in zip(steps, times, strict=True)]
    return reader.RunData(run=run, inputs=series, samples=samples, notes=[])


def test_merge_job_orders_workers_and_notes_a_missing_one():
    times_0 = [[10.0, np.nan, np.nan], [10.5, 0.5, 0.5]]
    times_2 = [[10.2, np.nan, np.nan], [10.5, 0.3, 0.3]]
    members = [
        _member("j/worker_2", 2, [4, 5], [3, 3], [0, 1], times_2),
        _member("j/worker_0", 0, [0, 1], [4, 4], [0, 1], times_0),
    ]
    job = reader.merge_job("j", members)
    assert [w["name"] for w in job.workers] == ["worker_0", "worker_2"]
    assert job.inputs.replicas == [0, 1, 4, 5]
    assert job.inputs.batch_size.tolist() == [[4, 4, 3, 3], [4, 4, 3, 3]]
    assert job.inputs.dense.shape == (2, 3, 4)
    assert any("Only 2 of the job's 3 workers" in note and "[1]" in note for note in job.notes)
    timing = job.step_time
    np.testing.assert_allclose(timing.lateness, [[0.0, 0.2], [0.0, 0.0]])
    # busy = period - (latest arrival - own arrival)
    np.testing.assert_allclose(timing.busy[1], [0.5, 0.3])


def test_straggler_thresholds():
    steps = np.arange(5)
    busy = np.array([[np.nan] * 3] + [[0.10, 0.11, 0.30]] * 4)
    timing = reader.StepTimeSeries(
        run="j",
        workers=["worker_0", "worker_1", "worker_2"],
        steps=steps,
        arrival=np.zeros((5, 3)),
        period=np.full((5, 3), 0.3),
        window_mean=np.full((5, 3), 0.3),
        lateness=np.zeros((5, 3)),
        busy=busy,
    )
    workers = [{"name": f"worker_{i}", "replicas": [i]} for i in range(3)]
    found = analysis.find_stragglers(timing, workers)
    assert [(f.name, f.value, f.first_step, f.count) for f in found] == [
        ("worker_2", round(0.30 / 0.11, 3), 2, 3)
    ]
    assert not analysis.find_stragglers(timing, workers, analysis.Thresholds(straggler_factor=3))
    # Millisecond steps: a 2x slower worker within timer noise is not reported.
    tiny = reader.StepTimeSeries(**{**timing.__dict__, "busy": busy / 100})
    assert not analysis.find_stragglers(tiny, workers)


def test_launcher_stops_workers_on_timeout(tmp_path):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out") as error:
        multiworker.launch(str(tmp_path), num_workers=2, timeout=0.5)
    assert time.monotonic() - start < 30
    for pid in error.value.pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_report_threshold_turns_the_straggler_off(demo_logs):
    def report(*extra):
        return subprocess.run(
            [sys.executable, "-m", "tb_replica_plugin.cli", "report", demo_logs]
            + ["--run", "mw_straggler/*", "--fail-on", "warning", *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )

    strict = report()
    assert strict.returncode == 1 and "straggler: Worker worker_1" in strict.stdout
    assert report("--threshold", "straggler_factor=3").returncode == 0


def test_single_worker_probe_keeps_its_log_dir(tmp_path):
    """Under MirroredStrategy (one worker) the probe writes log_dir itself, local replica ids."""
    import tensorflow as tf
    from conftest import mirrored

    from tb_replica_plugin import ReplicaProbe
    from tb_replica_plugin.probe import worker_info

    strategy = mirrored(2)
    assert worker_info(strategy) is None
    assert worker_info(tf.distribute.get_strategy()) is None
    probe = ReplicaProbe(str(tmp_path / "run"), strategy, update_freq=1)
    strategy.run(lambda: probe.observe_inputs({"x": tf.zeros([3, 2])}))
    probe.close()
    assert probe.run_dir == str(tmp_path / "run") and probe.worker is None
    data = load(str(tmp_path))
    assert list(data.runs) == ["run"]
    assert data.runs["run"].inputs.replicas == [0, 1] and not data.runs["run"].workers
    assert data.runs["run"].step_time is None
