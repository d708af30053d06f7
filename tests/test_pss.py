"""`ParameterServerStrategy` on an in-process cluster (2 workers, 2 ps): each worker is one
replica of the run, written by the coordinator.

The cluster runs in one child process per module (tests/pss_child.py; a cluster changes the
process's eager context for good), with a bounded wait; these tests read what it wrote.
"""

import json
import os
import subprocess
import sys

import pytest

import tb_replica_plugin

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
