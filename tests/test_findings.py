"""Every demo scenario gives its expected findings and its clean twin none (issue: findings).

The demo is trained once per session by conftest's `demo_logs` (4 replicas, subprocess). Each
scenario's expected findings are (kind, severity, replicas, first step) — exact values, so a rule
that stops firing, fires on a clean run or blames the wrong replica fails here.
"""

import json
import subprocess
import sys

import pytest
from conftest import REPO

import tb_replica_plugin

# run → sorted [(kind, severity, replicas, first_step)]; an empty list is a clean twin.
WALL_CLOCK = "a timed step"
EXPECTED = {
    "balanced/replicas": [],
    "empty_last_shard/replicas": [("empty_shard", "warning", [2, 3], 2)],
    "batch_not_divisible/replicas": [
        ("first_batch_uneven", "error", [3], 0),
        ("uneven_batch", "warning", [3], 0),
    ],
    "batch_not_divisible/inspect_dataset": [
        ("first_batch_uneven", "error", [3], 0),
        ("uneven_batch", "warning", [3], 0),
    ],
    "shape_mismatch/replicas": [("shape_mismatch", "error", [2], 0)],
    "dropout_fit/replicas": [("identical_rng_streams", "warning", [0, 1, 2, 3], 0)],
    "generator_loop/replicas": [],
    "unsharded_pipeline/replicas": [("duplicate_examples", "warning", [0, 1, 2, 3], 0)],
    "sharded_pipeline/replicas": [],
    # ParameterServerStrategy (demo/pss.py: 2 workers, 2 ps): the embedding table whole on ps 0
    # (no replica: a server's finding), worker 1 batching 2 ids where worker 0 batches 8.
    "pss_unbalanced/replicas": [
        ("ps_imbalance", "warning", [], 0),
        ("uneven_batch", "warning", [1], 0),
    ],
    # Multi-worker jobs (2 worker processes, one replica each; demo/multiworker.py).
    "mw_clean/replicas": [],
    "mw_fit_tf_keras/replicas": [],
    # Measured in wall-clock time: the first slow step is any timed step (2..7), see below.
    "mw_straggler/replicas": [("straggler", "warning", [1], WALL_CLOCK)],
    "mw_drift/replicas": [("variable_drift", "error", [1], 0)],
    "mw_uneven_shard/replicas": [
        ("first_batch_uneven", "error", [1], 0),
        ("uneven_batch", "warning", [1], 0),
    ],
    # Both workers' pipelines ignore the input context: found from the example sketches.
    "mw_unsharded/replicas": [("duplicate_examples", "warning", [0, 1], 0)],
    # One finding for the 4 trainable variables (one cause), with the 4 as its items.
    "weight_drift/skipped_allreduce": [("variable_drift", "error", [1, 2, 3], 0)],
    "weight_drift/synchronized": [],
    # Keras 3 BatchNormalization moving statistics, checked at epoch ends (8 steps per epoch).
    "weight_drift/batchnorm_fit": [("per_replica_statistics", "info", [1, 2, 3], 7)],
    "gradient_outlier/replicas": [("gradient_norm_outlier", "warning", [2], 0)],
    "gradient_outlier/clean": [],
    "nan_replica/replicas": [("nonfinite_gradients", "error", [1], 5)],
    "nan_replica/clean": [],
    # Replicas return [4, 12] / [4, 10] (even / odd): the per-step logits from step 0, the
    # returned PerReplica watched after the loop with explain=True; a tie names every replica.
    "gather_mismatch/replicas": [
        ("gather_would_fail", "warning", [0, 1, 2, 3], 0),
        ("gather_would_fail", "warning", [0, 1, 2, 3], 3),
        ("per_replica_result", "info", [0, 1, 2, 3], 3),
    ],
    "gather_mismatch/clean": [("per_replica_result", "info", [0, 1, 2, 3], 3)],
    # 18 ragged sentences, global batch 16: the last batch gives [1, 1, 0, 0] rows.
    "ragged_text/replicas": [("empty_shard", "warning", [2, 3], 1)],
    # Replica 1 runs ~20 ms of extra ops per step: slow from the first logged window (step 7).
    "slow_replica/replicas": [("slow_replica", "warning", [1], 7)],
    # fit raises on replica 1 at step 3 (a layer asserts its inputs are finite).
    "crash/replicas": [("training_crashed", "error", [1], 3)],
    # Worker 1 stops before step 5 (for 20 s, past its 5 s stall_secs) and dies; worker 0's
    # UnavailableError names it: the root cause is worker 1's stall (it never entered step 5),
    # then its loss at its last step (4); worker 0's crash names worker 1's replica.
    "mw_stall/replicas": [
        ("stalled", "error", [1], 5),
        ("stopped_without_end", "error", [1], 4),
        ("training_crashed", "error", [1], 5),
    ],
}
# The runs whose training ends badly on purpose; every other demo run ends "finished".
ENDED_BADLY = {"crash/replicas": "crashed", "mw_stall/replicas": "crashed"}


@pytest.fixture(scope="module")
def demo_report(demo_logs):
    return tb_replica_plugin.load(demo_logs)


def test_every_demo_run_is_covered(demo_report):
    assert sorted(demo_report.runs) == sorted(EXPECTED)


@pytest.mark.parametrize("run", sorted(EXPECTED))
def test_demo_scenario_gives_its_expected_findings(demo_report, run):
    found = sorted(
        (f.kind, f.severity, f.replicas, f.first_step) for f in demo_report.findings[run]
    )
    if any(expected[3] == WALL_CLOCK for expected in EXPECTED[run]):
        # A straggler's first slow step depends on the host's load at that step (worker 0 may
        # be slow once too); steps 0 and 1 are never timed (no period; warm-up).
        assert all(f[3] in range(2, 8) for f in found), found
        found = [(*f[:3], WALL_CLOCK) for f in found]
    assert found == sorted(EXPECTED[run])
    for finding in demo_report.findings[run]:
        assert finding.run == run
        assert finding.message.endswith(".") and len(finding.message) > 40
        assert finding.view


def test_every_demo_run_ends_finished_but_the_crash_and_the_stall(demo_report):
    states = {
        name: demo_report.to_json()["runs"][index]["status"]["state"]
        for index, name in enumerate(demo_report.runs)
    }
    assert states == {name: ENDED_BADLY.get(name, "finished") for name in EXPECTED}
    stall = demo_report.runs["mw_stall/replicas"].status
    assert [w["name"] for w in stall.workers] == ["worker_0", "worker_1"]
    assert stall.members[1].end is None  # killed without an end record (os._exit)
    (root,) = [f for f in demo_report.findings["mw_stall/replicas"] if f.cause == "root_cause"]
    assert (root.kind, root.name) == ("stalled", "worker_1")
    assert "; then worker_1 stopped sending heartbeats with no end record" in root.message


def _report(*args):
    return subprocess.run(
        [sys.executable, "-m", "tb_replica_plugin.cli", "report", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("run", "fail_on", "status"),
    [
        ("balanced/*", "info", 0),
        ("empty_last_shard/*", "error", 0),
        ("empty_last_shard/*", "warning", 1),
        ("empty_last_shard/*", "info", 1),
        ("shape_mismatch/*", "error", 1),
        ("mw_straggler/*", "error", 0),
        ("mw_straggler/*", "warning", 1),
    ],
)
def test_report_exit_status_follows_fail_on(demo_logs, run, fail_on, status):
    done = _report(demo_logs, "--run", run, "--fail-on", fail_on)
    assert done.returncode == status, done.stdout + done.stderr


def test_threshold_override_changes_findings_as_documented(demo_logs):
    run = "batch_not_divisible/replicas"  # [8, 8, 8, 6]: imbalance 8/6 = 1.33
    strict = _report(demo_logs, "--run", run, "--json", "--threshold", "max_imbalance_ratio=1.3")
    loose = _report(demo_logs, "--run", run, "--json", "--threshold", "max_imbalance_ratio=1.34")
    kinds = [
        [f["kind"] for f in json.loads(d.stdout)["runs"][0]["findings"]] for d in (strict, loose)
    ]
    assert kinds == [["first_batch_uneven", "uneven_batch"], ["first_batch_uneven"]]
    uneven = json.loads(strict.stdout)["runs"][0]["findings"][1]
    assert uneven["value"] == pytest.approx(8 / 6) and uneven["threshold"] == 1.3


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # Every family adds thresholds, so only the start of the list is checked.
        ("nope=1", "unknown threshold 'nope'; known thresholds: "),
        ("max_imbalance_ratio=high", "threshold max_imbalance_ratio needs a number, got 'high'"),
        ("max_imbalance_ratio", "is not NAME=VALUE"),
    ],
)
def test_bad_threshold_is_refused_with_exit_status_2(demo_logs, override, message):
    done = _report(demo_logs, "--threshold", override)
    assert done.returncode == 2 and message in done.stderr


def test_bad_process_count_is_refused_with_exit_status_2(demo_logs):
    done = _report(demo_logs, "--processes", "0")
    assert done.returncode == 2
    assert "argument --processes: expected a whole number >= 1, got '0'" in done.stderr


def test_a_reading_process_that_dies_is_reported_with_what_to_do(demo_logs, monkeypatch, capsys):
    from concurrent.futures.process import BrokenProcessPool

    from tb_replica_plugin import cli
    from tb_replica_plugin import report as report_lib

    def die(*args, **kwargs):
        assert kwargs["processes"] == 3
        raise BrokenProcessPool("A child process terminated abruptly")

    monkeypatch.setattr(report_lib, "load", die)
    assert cli.main(["report", demo_logs, "--processes", "3"]) == 2
    assert capsys.readouterr().err == (
        "tb-replica: error: a process reading the log dir (3 at once) stopped abruptly, most "
        "likely out of memory: run again with fewer, e.g. --processes 1\n"
    )


def test_gradient_threshold_override(demo_logs):
    run = "gradient_outlier/replicas"  # replica 2's shard ×100: ratios in the thousands
    loose = _report(demo_logs, "--run", run, "--json", "--threshold", "max_grad_norm_ratio=1e9")
    strict = _report(demo_logs, "--run", run, "--json")
    kinds = [
        [f["kind"] for f in json.loads(d.stdout)["runs"][0]["findings"]] for d in (strict, loose)
    ]
    assert kinds == [["gradient_norm_outlier"], []]
    outlier = json.loads(strict.stdout)["runs"][0]["findings"][0]
    assert outlier["replicas"] == [2] and outlier["value"] > 100 and outlier["threshold"] == 10.0
