"""`ParameterServerStrategy` on an in-process cluster (2 workers, 2 ps): each worker is one
replica of the run, written by the coordinator.

The cluster runs in one child process per module (tests/pss_child.py; a cluster changes the
process's eager context for good), with a bounded wait; these tests read what it wrote.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tb_replica_plugin
from tb_replica_plugin.families.variables import present as variables_present
from tb_replica_plugin.families.variables import ps_balance

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 300


@pytest.fixture(scope="module")
def cluster_runs(tmp_path_factory):
    """`(logdir, results)` of every scenario of tests/pss_child.py, run once."""
    logdir = tmp_path_factory.mktemp("pss")
    out = logdir / "results.json"
    child = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "pss_child.py"), str(logdir), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = child.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        child.kill()
        output, _ = child.communicate()
        pytest.fail(f"the cluster's child did not end in {TIMEOUT} s:\n{output[-4000:]}")
    assert child.returncode == 0 and out.exists(), output[-4000:]
    return logdir, json.loads(out.read_text())


def _scenario(cluster_runs, name):
    logdir, results = cluster_runs
    outcome = results[name]
    assert "error" not in outcome, outcome["error"]
    return os.path.join(logdir, name), outcome


def test_custom_loop_records_each_worker_as_a_replica(cluster_runs):
    run_dir, outcome = _scenario(cluster_runs, "uneven_inputs")
    assert outcome["warnings"] == []
    assert outcome["facts"] == {"results": 12, "finite": True}
    report = tb_replica_plugin.load(run_dir)
    (run,) = report.runs
    inputs = report.runs[run].inputs
    assert inputs.strategy == "ParameterServerStrategy"
    assert inputs.devices == [
        "/job:worker/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:0",
    ]
    assert inputs.replicas == [0, 1]
    # 12 steps scheduled: each worker's k-th step is step k, written once both ran it.
    steps = inputs.steps.tolist()
    assert steps == list(range(len(steps))) and 3 <= len(steps) <= 6
    assert inputs.batch_size.tolist() == [[8, 2]] * len(steps)
    assert inputs.shape_events[0]["inputs"][0]["shapes"] == [[8, 3], [2, 3]]
    kinds = [f.kind for f in report.findings[run]]
    assert kinds == ["uneven_batch"]  # no first_batch_uneven: no Keras 3 fit under PSS
    (finding,) = report.findings[run]
    assert finding.replicas == [1]
    assert finding.message.startswith("Worker 1 got 2 examples per step, worker 0 got 8")
    assert "ParameterServerStrategy" in report.to_text()


def test_step_scheduled_past_the_probe_is_refused_with_one_warning(cluster_runs):
    run_dir, outcome = _scenario(cluster_runs, "direct_schedule")
    (warning,) = outcome["warnings"]
    assert "ParameterServerStrategy" in warning and "probe.schedule(" in warning
    assert len(outcome["facts"]["results"]) == 4  # training went on
    assert not os.path.exists(run_dir)  # nothing written, not a merged replica


def test_unpartitioned_embedding_gives_the_ps_imbalance_finding(cluster_runs):
    run_dir, outcome = _scenario(cluster_runs, "ps_unbalanced")
    assert outcome["warnings"] == []
    assert len(outcome["facts"]["losses"]) == 4
    report = tb_replica_plugin.load(run_dir)
    (run,) = report.runs
    series = report.runs[run].variables
    assert len(series.placement_events) == 1 and series.steps.size == 0
    held = ps_balance.balance(series)
    by_name = {v["name"]: v for v in held["variables"]}
    (embedding,) = [v for name, v in by_name.items() if "embeddings" in name]
    assert embedding["bytes"] == 4000 * 16 * 4 and embedding["shape"] == [4000, 16]
    heavy = embedding["ps"]
    assert [s["device"] for s in held["servers"]] == [
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:ps/replica:0/task:1/device:CPU:0",
    ]
    assert held["total_bytes"] == 4000 * 16 * 4 + 16 * 4 + 4  # embedding, kernel, bias
    assert held["servers"][heavy]["share"] > 0.99
    assert held["servers"][heavy]["largest"] == embedding["name"]
    (finding,) = report.findings[run]
    assert finding.kind == "ps_imbalance" and finding.severity == "warning"
    assert finding.name == embedding["name"] and finding.value > 0.99 and finding.threshold == 0.75
    assert finding.message.startswith(f"Parameter server {heavy} (/job:ps/replica:0/task:{heavy}")
    assert "FixedShardsPartitioner(2)" in finding.message
    text = report.to_text()
    assert f"ps {heavy} (/job:ps/replica:0/task:{heavy}/device:CPU:0): 250 KiB (100.0 %)" in text
    light = held["servers"][1 - heavy]
    assert light["bytes"] == held["total_bytes"] - held["servers"][heavy]["bytes"] <= 68
    body = variables_present.variables_body(series)
    assert body["parameter_servers"]["servers"][heavy]["bytes"] == held["servers"][heavy]["bytes"]


def test_fixed_shards_partitioner_twin_is_balanced(cluster_runs):
    run_dir, outcome = _scenario(cluster_runs, "ps_partitioned")
    assert outcome["warnings"] == []
    report = tb_replica_plugin.load(run_dir)
    (run,) = report.runs
    series = report.runs[run].variables
    assert len(series.placement_events) == 1  # observe_variables wrote it; the step adds none
    held = ps_balance.balance(series)
    shards = [v for v in held["variables"] if "embeddings" in v["name"]]
    assert sorted(v["ps"] for v in shards) == [0, 1]
    assert [v["bytes"] for v in shards] == [2000 * 16 * 4] * 2
    assert all(0.49 < s["share"] < 0.51 for s in held["servers"])
    assert report.findings[run] == []


def _hand_step(batch_index):
    """(global gradient norm, loss) of nan_gradients' model (w = 1, b = 0.5, not updated) on a
    worker's batch `batch_index` (rows i % 7 for i of that batch of 4, 3 equal features)."""
    x = np.array([[i % 7] * 3 for i in range(4 * batch_index, 4 * batch_index + 4)], float)
    pred = x.sum(axis=1) + 0.5
    grad_w = (2 * pred[:, None] * x).mean(axis=0)
    grad_b = (2 * pred).mean()
    return float(np.sqrt((grad_w**2).sum() + grad_b**2)), float((pred**2).mean())


def test_nan_on_one_worker_s_gradients_names_that_worker_and_its_step(cluster_runs):
    run_dir, outcome = _scenario(cluster_runs, "nan_gradients")
    assert outcome["warnings"] == []
    assert outcome["facts"] == {"losses": 12, "nan_losses": 1}
    report = tb_replica_plugin.load(run_dir)
    (run,) = report.runs
    series = report.runs[run].gradients
    assert series.strategy == "ParameterServerStrategy" and series.replicas == [0, 1]
    assert series.variables == ["w", "b"]
    assert series.nonfinite_steps.tolist() == [1]
    # rows: grad NaN, grad Inf, loss NaN, loss Inf; columns: workers 0, 1 (4 NaN: 3 w + 1 b)
    assert series.nonfinite[0].tolist() == [[0, 4], [0, 0], [0, 1], [0, 0]]
    steps = series.steps.tolist()
    assert steps == list(range(len(steps))) and len(steps) >= 2
    for row, step in enumerate(steps):  # each worker's k-th batch is its dataset's k-th
        norm, loss = _hand_step(step)
        expected = [[norm, loss]] * 2 if step != 1 else [[norm, loss], [np.nan, np.nan]]
        got = np.stack([series.global_norm[row], series.loss[row]], axis=1)
        np.testing.assert_allclose(got, expected, rtol=1e-5)
    (finding,) = report.findings[run]
    assert finding.kind == "nonfinite_gradients" and finding.severity == "error"
    assert finding.replicas == [1] and finding.first_step == 1
    assert finding.message.startswith(
        "Worker 1 had non-finite values (4 NaN gradient value(s), loss NaN/Inf at 1 step(s)) "
        "at step 1 while the other workers stayed finite"
    )
    assert "parameter servers" in finding.message


def test_tf_keras_fit_records_each_worker(cluster_runs):
    """tf_keras `fit` with a `DatasetCreator` and `steps_per_execution=2`: two fits (16 steps
    in all), each worker's batches and gradients recorded, steps continued by the second fit."""
    run_dir, outcome = _scenario(cluster_runs, "fit_tf_keras")
    assert outcome["warnings"] == []
    assert outcome["facts"] == {
        "losses": [2, 1],
        "finite": True,
        "keys": ["loss"],  # the record does not reach fit's logs
        "iterations": 16,
        "train_step_restored": True,
    }
    report = tb_replica_plugin.load(run_dir)
    (run,) = report.runs
    data = report.runs[run]
    assert data.inputs.source == "fit" and data.inputs.strategy == "ParameterServerStrategy"
    steps = data.inputs.steps.tolist()
    # Each worker ran whole executions of 2 steps; step k is written once both ran their k-th.
    assert steps == list(range(len(steps))) and len(steps) % 2 == 0 and 2 <= len(steps) <= 8
    assert data.inputs.batch_size.tolist() == [[8, 2]] * len(steps)
    assert data.inputs.shape_events[0]["inputs"][1]["shapes"] == [[8, 1], [2, 1]]  # y
    gradients = data.gradients
    assert gradients.variables == ["head/kernel", "head/bias"]
    assert gradients.steps.tolist() == steps
    assert (gradients.global_norm > 0).all() and np.isfinite(gradients.loss).all()
    placement = ps_balance.balance(data.variables)
    names = sorted(v["name"] for v in placement["variables"])
    assert names == ["SGD/iter", "head/bias", "head/kernel"]  # written once, after epoch 1
    assert len(data.variables.placement_events) == 1
    assert [f.kind for f in report.findings[run]] == ["uneven_batch"]
    assert report.findings[run][0].replicas == [1]


def test_slow_worker_runs_fewer_steps_and_is_named_a_straggler(cluster_runs):
    run_dir, outcome = _scenario(cluster_runs, "slow_worker")
    assert outcome["warnings"] == []
    assert outcome["facts"] == {"results": 40}
    report = tb_replica_plugin.load(run_dir)
    (run,) = report.runs
    data = report.runs[run]
    totals = data.step_time.pss
    assert totals is not None and totals.steps_run.shape == (2,)
    fast, slow = totals.steps_run.tolist()
    # Every scheduled step ran once, counted also beyond the slowest worker's last step.
    assert fast + slow == 40 and fast >= slow + 5 and slow >= 1, (fast, slow)
    seconds = totals.step_seconds()
    # Worker 1's pipeline sleeps 0.06 s a batch (in its step, but for what the distributed
    # iterator's prefetch of one batch did while the worker waited for its next step).
    assert seconds[1] >= 0.03 and seconds[1] > seconds[0] + 0.02, seconds
    assert totals.rate[0] > 1.5 * totals.rate[1]
    np.testing.assert_allclose(totals.busy, seconds * totals.steps_run)
    assert np.all(totals.span >= totals.busy - 1e-6)
    # Written steps: those both workers ran; their windows' step seconds per worker.
    assert data.inputs.steps.tolist() == list(range(slow))
    ready = data.step_time.ready
    assert ready.strategy == "ParameterServerStrategy" and ready.replicas == [0, 1]
    assert ready.steps.tolist() == list(range(slow))
    assert np.all(ready.ready_median[:, 1] >= 0.03), ready.ready_median
    assert np.all(ready.ready_median[:, 1] > ready.ready_median[:, 0] + 0.02)
    assert np.all(ready.wait_median == 0)  # no all-reduce: the workers do not wait
    assert np.all(ready.window_steps == 1)  # update_freq=1: a window per step
    kinds = [f.kind for f in report.findings[run]]
    assert kinds == ["pss_straggler"]  # its slow_replica finding is said in this one
    (finding,) = report.findings[run]
    assert finding.replicas == [1] and finding.count == slow
    assert finding.message.startswith(f"Worker 1 ran {slow} step")
    assert f"while the others ran {fast} at" in finding.message
    assert "asynchronous training its updates fall behind" in finding.message
    text = report.to_text()
    assert "worker 1: ran" in text and "<- pss_straggler" in text


def test_unsharded_pipelines_give_duplicate_examples_naming_the_workers(cluster_runs):
    """Every worker iterates the same pipeline; batches sampled by their content (one in 2), so
    the workers' identical k-th batches are sampled alike and compared: exactly the written
    steps whose batch is sampled (the child computes which; step 0's is)."""
    run_dir, outcome = _scenario(cluster_runs, "unsharded_examples")
    assert outcome["warnings"] == [] and outcome["facts"]["results"] == 12
    sampled = outcome["facts"]["sampled"]
    assert sampled[:1] == [0] and len(sampled) < 12
    report = tb_replica_plugin.load(run_dir)
    (run,) = report.runs
    data = report.runs[run].data
    written = report.runs[run].inputs.steps.tolist()
    steps = [k for k in written if k in sampled]
    assert data.steps.tolist() == steps
    assert data.steps_shared.shape == (len(steps), 2, 2)
    assert data.batch_size.tolist() == [[4, 4]] * len(steps)
    assert data.window_shared[:, 0, 1].tolist() == [4] * len(steps)  # every example, each step
    (finding,) = report.findings[run]
    assert finding.kind == "duplicate_examples" and finding.replicas == [0, 1]
    # "every step" when the compared steps leave no gap (0, 1, ..., n-1), else "every sampled
    # step" (the reader's `DataSeries.sampled`: a window held steps not compared).
    when = "every step" if steps == list(range(len(steps))) else "every sampled step"
    assert finding.message.startswith(
        f"Workers 0 and 1 were fed the same examples at the same step (at {when}; "
        "100% of their examples are also on another worker): under ParameterServerStrategy"
    )
    assert "experimental_get_current_worker_index()" in finding.message


def test_pipelines_sharded_by_worker_share_no_example(cluster_runs):
    run_dir, outcome = _scenario(cluster_runs, "sharded_examples")
    assert outcome["warnings"] == []
    report = tb_replica_plugin.load(run_dir)
    (run,) = report.runs
    data = report.runs[run].data
    steps = data.steps.tolist()
    assert steps == report.runs[run].inputs.steps.tolist()  # examples_every=1: every step
    assert data.window_shared[:, 0, 1].tolist() == [0] * len(steps)
    assert data.window_shared[:, 0, 0].tolist() == [4] * len(steps)
    assert report.findings[run] == []
