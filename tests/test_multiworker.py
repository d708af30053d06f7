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
from tb_replica_plugin import analysis
from tb_replica_plugin.families.examples import rules as examples_rules
from tb_replica_plugin.families.gradients import rules as gradients_rules
from tb_replica_plugin.families.rng import rules as rng_rules
from tb_replica_plugin.families.step_time import rules as step_time_rules
from tb_replica_plugin.families.variables import rules as variables_rules
from tb_replica_plugin.report import load

PLUGIN = "/data/plugin/replicas"
DEVICE = "/job:worker/replica:0/task:{}/device:CPU:0"


@pytest.fixture(scope="module")
def report(demo_logs):
    return load(demo_logs, "mw_*")


@pytest.fixture(scope="module")
def worker_runs(demo_logs):
    """Each worker's own run of the demo's jobs (a pattern naming them, not their jobs)."""
    return load(demo_logs, "mw_*/worker_*").runs


def test_workers_write_their_own_runs(demo_logs):
    for scenario in multiworker.SCENARIOS:
        runs = sorted(os.listdir(os.path.join(demo_logs, scenario, "replicas")))
        assert runs == ["worker_0", "worker_1"], (scenario, runs)


def test_one_job_view_with_every_global_replica(report, worker_runs):
    jobs = sorted((*multiworker.SCENARIOS, "mw_stall"))  # the demo runs mw_stall on its own
    assert sorted(report.runs) == [f"{s}/replicas" for s in jobs]
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
    worker = worker_runs["mw_clean/replicas/worker_1"].inputs
    assert worker.replicas == [1]
    assert worker.worker["task_index"] == 1 and worker.worker["num_workers"] == 2
    other = worker_runs["mw_clean/replicas/worker_0"].inputs.worker
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
    # And each replica's ready time (fit's steps are timed step scopes): every step a window of
    # one step, merged on the job's global replica axis with the worker of each replica.
    ready = job.step_time.ready
    assert (ready.replicas, ready.workers) == ([0, 1], ["worker_0", "worker_1"])
    assert ready.devices == [DEVICE.format(0), DEVICE.format(1)]
    assert ready.steps.tolist() == list(range(16))
    assert ready.ready_median.shape == ready.ready_max.shape == (16, 2)
    assert (ready.window_steps == 1).all()
    # One replica per worker: the median is the step's own time, nobody to wait for.
    assert np.array_equal(ready.ready_median, ready.ready_max)
    assert (ready.ready_median >= 0).all() and (ready.ready_median < 5).all()
    assert (np.median(ready.ready_median, axis=0) > 0).all()
    assert (ready.wait_median == 0).all()


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


def test_perturbed_worker_drifts_from_the_others(report, worker_runs):
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
    for worker in job.workers:
        own = worker_runs[worker["run"]]
        assert own.variables.replicas == [int(worker["run"][-1])]
        assert own.variables.identical.all()
        assert not variables_rules.find_variables(own.variables)


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
    # (from step 2: at step 1 worker 0 still carries its early start at step 0). A step's end
    # on one worker can come late by the host's load and the next one early, so the medians.
    period = np.median(timing.period[2:], axis=0)
    assert abs(period[0] - period[1]) < 0.05
    assert period[1] >= multiworker.STRAGGLER_SLEEP
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
    assert not step_time_rules.find_stragglers(timing, job.workers, loose)


def test_custom_loop_step_scopes_time_each_worker_s_replicas(report):
    """`mw_straggler`'s step function is a `probe.step()` block under MultiWorkerMirroredStrategy
    (`mw_clean`'s the same loop without one): each worker's replica gets its ready time at each
    of the job's steps, and every family keeps one step per step."""
    job = report.runs["mw_straggler/replicas"]
    ready = job.step_time.ready
    assert (ready.replicas, ready.workers) == ([0, 1], ["worker_0", "worker_1"])
    assert ready.devices == [DEVICE.format(0), DEVICE.format(1)]
    assert ready.steps.tolist() == list(range(8))
    assert (ready.window_steps == 1).all() and ready.ready_median.shape == (8, 2)
    # Worker 1 sleeps on the host before each step, outside the block: not in its ready time.
    medians = np.median(ready.ready_median, axis=0)
    # (At least 0: a replica can be ready as the block ends, seen once under load.)
    assert (medians >= 0).all() and (medians < multiworker.STRAGGLER_SLEEP / 4).all()
    # One replica per worker: no replica of a worker waits for another of its worker.
    assert (ready.wait_median == 0).all()
    assert not [f for f in report.findings["mw_straggler/replicas"] if f.kind == "slow_replica"]
    assert report.runs["mw_clean/replicas"].step_time.ready is None
    # The other families at the same steps as without a step scope.
    assert job.inputs.steps.tolist() == list(range(8))
    assert job.inputs.batch_size.tolist() == [[4, 4]] * 8
    assert job.gradients.steps.tolist() == list(range(8))
    assert job.variables.steps.tolist() == list(range(8))


def test_unsharded_job_duplicates_across_workers(report, worker_runs):
    """Both workers' pipelines ignore the input context: the sketches show the same examples."""
    job = report.runs["mw_unsharded/replicas"]
    data = job.data
    assert data.replicas == [0, 1]
    assert data.steps.tolist() == list(range(4))
    # 4 examples per replica (at most the 16 of a sketch): the cross-worker count is exact, and
    # every example of each replica is also on the other worker's replica.
    assert data.batch_size.tolist() == [[4, 4]] * 4
    assert data.shared[:, 0, 1].tolist() == data.batch_size[:, 0].tolist()
    assert data.shared[:, 1, 0].tolist() == [4] * 4
    assert data.duplicated.tolist() == [[4, 4]] * 4
    assert data.steps_shared[:, 0, 1].tolist() == [1] * 4
    np.testing.assert_array_equal(data.sketch[:, 0], data.sketch[:, 1])
    found = [f for f in report.findings["mw_unsharded/replicas"] if f.kind == "duplicate_examples"]
    assert [(f.replicas, f.first_step, f.value) for f in found] == [([0, 1], 0, 1.0)]
    assert "On worker_0, worker_1." in found[0].message
    assert "input_context.input_pipeline_id" in found[0].message
    # Each worker alone sees nothing: one replica per worker, no duplicate inside a worker.
    for worker in job.workers:
        own = worker_runs[worker["run"]]
        assert own.data.num_replicas == 1 and not examples_rules.find_data(own.data)


def test_clean_jobs_share_no_example_across_workers(report):
    for run in ("mw_clean/replicas", "mw_straggler/replicas", "mw_fit_tf_keras/replicas"):
        data = report.runs[run].data
        assert data.replicas == [0, 1], run
        assert data.steps.tolist() == report.runs[run].inputs.steps.tolist()
        assert (data.shared[:, 0, 1] == 0).all() and (data.duplicated == 0).all(), run
        assert data.shared[:, 0, 0].tolist() == data.batch_size[:, 0].tolist()
        assert not [f for f in report.findings[run] if f.kind == "duplicate_examples"]


def test_job_gradients_are_the_workers_norms_on_one_axis(report, worker_runs):
    for run in ("mw_clean/replicas", "mw_fit_tf_keras/replicas"):
        job = report.runs[run]
        grads = job.gradients
        assert grads.replicas == [0, 1]
        assert grads.steps.tolist() == job.inputs.steps.tolist()
        assert [name.rsplit("/", 1)[-1] for name in grads.variables] == ["kernel", "bias"]
        assert grads.nonfinite_steps.size == 0 and grads.nonfinite.shape == (0, 4, 2)
        for w, worker in enumerate(job.workers):
            own = worker_runs[worker["run"]].gradients
            assert own.replicas == [w]
            np.testing.assert_array_equal(grads.global_norm[:, w], own.global_norm[:, 0])
            np.testing.assert_array_equal(grads.loss[:, w], own.loss[:, 0])
            np.testing.assert_array_equal(
                grads.variable_norms[:, :, w], own.variable_norms[:, :, 0]
            )
        # Different shards: the two replicas' norms differ, and no outlier is reported.
        assert (grads.global_norm[:, 0] != grads.global_norm[:, 1]).all()
        assert not gradients_rules.find_gradients(grads)
    # Same examples on both workers, identical weights: identical local gradients.
    unsharded = report.runs["mw_unsharded/replicas"].gradients
    np.testing.assert_array_equal(unsharded.global_norm[:, 0], unsharded.global_norm[:, 1])


def test_tf_keras_job_random_streams(report, worker_runs):
    """A tf.random.Generator created under the scope: one state, one stream per global replica."""
    job = report.runs["mw_fit_tf_keras/replicas"]
    rng = job.rng
    assert [(g["name"], g["kind"], g["mirrored"]) for g in rng.generators] == [
        ("noise", "tf.random.Generator", True)
    ]
    assert rng.replicas == [0, 1] and rng.steps.tolist() == list(range(16))
    assert rng.devices == [DEVICE.format(0), DEVICE.format(1)]
    for w, worker in enumerate(job.workers):
        own = worker_runs[worker["run"]].rng
        np.testing.assert_array_equal(rng.fingerprint[:, :, w], own.fingerprint[:, :, 0])
    # The state is mirrored across workers, the streams differ (the global replica id is folded
    # into the key): no identical streams, no desync.
    np.testing.assert_array_equal(rng.state[:, :, 0], rng.state[:, :, 1])
    assert (rng.fingerprint[:, 0, 0] != rng.fingerprint[:, 0, 1]).all()
    assert not rng_rules.find_rng(rng)


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
                == len(multiworker.SCENARIOS) + 1  # and mw_stall
            ),
        )
        yield tb
    finally:
        tb.stop()


def get_json(server, path):
    """`(status, body)`: the JSON answer, or the text of an error (TensorBoard's own)."""
    status, body, _ = http_get(server.url + path)
    return status, json.loads(body) if status < 400 else body.decode()


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
    # The job's gradients, rng and data routes serve the merged families.
    status, data = get_json(server, PLUGIN + "/data?run=mw_unsharded/replicas")
    assert status == 200 and data["replicas"] == [0, 1]
    assert data["share"] == [[1.0, 1.0], [1.0, 1.0]] and data["steps_shared"][0][1] == 4
    status, grads = get_json(server, PLUGIN + "/gradients?run=mw_clean/replicas")
    assert status == 200 and grads["replicas"] == [0, 1] and grads["steps"] == list(range(8))
    status, rng = get_json(server, PLUGIN + "/rng?run=mw_fit_tf_keras/replicas")
    assert status == 200 and rng["replicas"] == [0, 1]
    assert rng["generators"][0]["match"] == [[1.0, 0.0], [0.0, 1.0]]
    _, findings = get_json(server, PLUGIN + "/findings?run=mw_unsharded/replicas")
    assert [f["kind"] for f in findings["findings"]] == ["duplicate_examples"]
    # A worker's own run stays readable by its name.
    status, own = get_json(server, PLUGIN + "/inputs?run=mw_clean/replicas/worker_1")
    assert status == 200 and own["replicas"] == [1] and own["workers"] == []
    assert get_json(server, PLUGIN + "/step_time?run=nope")[0] == 404
    assert get_json(server, PLUGIN + "/step_time")[0] == 400
    # Each worker's replica's ready times, on the job's replica axis.
    _, fit = get_json(server, PLUGIN + "/step_time?run=mw_fit_tf_keras/replicas")
    ready = fit["ready"]
    assert (ready["replicas"], ready["workers"]) == ([0, 1], ["worker_0", "worker_1"])
    assert ready["steps"] == list(range(16)) and ready["warm_up"] is True
    assert np.array(ready["median"]).shape == (16, 2) and np.array(ready["wait"]).shape == (16, 2)
    assert all(t > 0 for t in ready["median_ready"]) and ready["median_wait"] == [0, 0]
    assert [w["name"] for w in fit["workers"]] == ["worker_0", "worker_1"]
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
    unsharded = runs["mw_unsharded/replicas"]
    assert unsharded["data"]["share"] == [[1.0, 1.0], [1.0, 1.0]]
    assert unsharded["gradients"] is not None
    assert runs["mw_fit_tf_keras/replicas"]["rng"]["generators"][0]["name"] == "noise"
    text = report.to_text()
    assert "multi-worker job: 2 workers" in text
    assert "worker_1 (replicas 1): busy" in text
    fit = runs["mw_fit_tf_keras/replicas"]["replica_time"]
    assert (fit["replicas"], fit["workers"]) == ([0, 1], ["worker_0", "worker_1"])
    assert fit["windows"] == 15 and fit["slow_replicas"] == []  # the first (warm-up) left out
    assert all(t > 0 for t in fit["median_ready"]) and fit["median_wait"] == [0, 0]
    assert "    replica 1 (CPU:0 on worker_1): ready " in text


def test_report_read_by_two_processes_is_the_same(demo_logs):
    """`processes=2`: new processes list the runs, read the runs outside jobs and each job's
    workers: the same report."""
    pattern = "[mb]*"  # every job, and the runs of the scenarios starting with "b"
    now = time.time()  # both judge the runs' status at the same time
    report = load(demo_logs, pattern, now=now)
    parallel = load(demo_logs, pattern, processes=2, now=now)
    alone = sorted(name for name in report.runs if not report.runs[name].workers)
    assert alone == [
        "balanced/replicas",
        "batch_not_divisible/inspect_dataset",
        "batch_not_divisible/replicas",
    ]
    assert sorted(parallel.runs) == sorted(report.runs)
    assert json.dumps(parallel.to_json(), sort_keys=True) == json.dumps(
        report.to_json(), sort_keys=True
    )
    assert parallel.to_text() == report.to_text()
    straggler = parallel.runs["mw_straggler/replicas"]
    assert [w["name"] for w in straggler.workers] == ["worker_0", "worker_1"]
    # The job is held merged: its series, not its workers' own (read them by their names).
    assert straggler.samples == {} and straggler.step_time.busy.shape == (8, 2)


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


@pytest.fixture(scope="module")
def halt_logs(tmp_path_factory):
    """The `halt_on` scenarios (`multiworker.HALT_SCENARIOS`), one 2-worker job for all."""
    logdir = str(tmp_path_factory.mktemp("mw_halt"))
    seconds = multiworker.launch(logdir, scenarios=multiworker.HALT_SCENARIOS, timeout=300)
    assert seconds < 300  # launch raises on a hang (timeout) or a failed worker
    return logdir


def stopped_workers(logdir, scenario):
    """What each worker of `scenario` wrote when it stopped (`stopped_worker_<i>.json`)."""
    stopped = []
    for task in (0, 1):
        with open(os.path.join(logdir, scenario, f"stopped_worker_{task}.json")) as result:
            stopped.append(json.load(result))
    return stopped


def test_halt_on_stops_every_worker_at_the_same_step(halt_logs):
    """tf_keras `fit`, `halt_on="error"`, one NaN example in worker 1's batch at step 5: the
    fault flag is all-reduced in the step, so both workers stop after step 5 (2 processes)."""
    logdir = halt_logs
    stopped = stopped_workers(logdir, "mw_halt")
    step = multiworker.HALT_STEP
    assert [s["iterations"] for s in stopped] == [step + 1, step + 1]  # steps 0..5, no more
    # Worker 1 names its replica (global id 1); worker 0 stopped on the all-reduced flag.
    assert stopped[1]["stopped_by"] == [
        {"kind": "nonfinite_gradients", "replicas": [1], "first_step": step}
    ]
    assert stopped[0]["stopped_by"] == [
        {"kind": "nonfinite_gradients", "replicas": [], "first_step": step}
    ]
    job = load(logdir).runs["mw_halt/replicas"]
    assert job.inputs.steps.tolist() == list(range(step + 1))
    own = load(logdir, "mw_halt/replicas/worker_*").runs
    for name in ("worker_0", "worker_1"):
        assert own[f"mw_halt/replicas/{name}"].inputs.steps[-1] == step
    # Only worker 1's replica is captured, with the NaN example at the injected index.
    (captured,) = job.gradients.batches
    assert (captured.step, captured.replica) == (step, 1)
    assert captured.nonfinite_examples == {"x": [multiworker.HALT_EXAMPLE]}


def test_halt_on_in_cross_replica_context_stops_every_worker_at_the_same_step(halt_logs):
    """A custom loop calls `observe_gradients` outside `strategy.run`, on what it returned
    (one device per worker: plain tensors) with the PerReplica batch, and `probe.faults()`
    after each step; worker 1's batch holds a NaN at step 5: both workers stop after step 5."""
    step = multiworker.HALT_STEP
    stopped = stopped_workers(halt_logs, "mw_halt_loop")
    assert [s["steps"] for s in stopped] == [step + 1, step + 1]  # of 16
    assert stopped[1]["stopped_by"] == [
        {"kind": "nonfinite_gradients", "replicas": [1], "first_step": step}
    ]
    assert stopped[0]["stopped_by"] == [
        {"kind": "nonfinite_gradients", "replicas": [], "first_step": step}
    ]
    job = load(halt_logs).runs["mw_halt_loop/replicas"]
    grads = job.gradients
    assert grads.replicas == [0, 1] and grads.steps.tolist() == list(range(step + 1))
    assert grads.nonfinite_steps.tolist() == [step]
    assert grads.nonfinite[0, 2:].tolist() == [[0, 1], [0, 0]]  # replica 1's loss is NaN
    (captured,) = grads.batches
    assert (captured.step, captured.replica) == (step, 1)
    assert captured.nonfinite_examples == {"0": [multiworker.HALT_EXAMPLE]}


def test_check_time_finding_at_an_expected_overflow_step_stops_at_that_check(halt_logs):
    """tf_keras `fit` under mixed precision whose loss scale overflows at every step (a fault
    the job does not stop on), `halt_on="error"`, `update_freq=1`: each worker's outputs hold
    a NaN at step 0 (`nonfinite_values`, decided at checks): both stop at the step-0 check."""
    stopped = stopped_workers(halt_logs, "mw_halt_overflow")
    assert [s["steps"] for s in stopped] == [1, 1]  # of 8
    for task, result in enumerate(stopped):
        assert result["stopped_by"] == [
            {"kind": "nonfinite_values", "replicas": [task], "first_step": 0}
        ]
    grads = load(halt_logs, "mw_halt_overflow/*").runs["mw_halt_overflow/replicas"].gradients
    assert grads.loss_scaled and grads.nonfinite_steps.tolist() == [0]
    assert (grads.nonfinite[0, 2:] == 0).all()  # finite losses: an overflow, not a fault
