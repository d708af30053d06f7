"""A multi-worker job that hangs, read while it hangs, then killed (both workers, or worker 1);
a job whose worker 1 is stopped by Ctrl-C.

Real 2-worker MultiWorkerMirroredStrategy jobs on localhost (`demo/multiworker.py`'s `mw_stall`
and `mw_fit_stall`): worker 1 stops before step 5 and waits (for longer than the test, which
reads the job meanwhile) while worker 0 waits inside step 5 at the all-reduce. Every wait here is
bounded, and the test ends the processes it started, by pid (a process blocked in the all-reduce
ignores SIGTERM; `stop_worker` sends SIGKILL after 10 s). `mw_interrupt`: worker 1 sends itself
SIGINT before step 5 and worker 0 fails in step 5 (about 20 s in all).
"""

import json
import os
import signal
import subprocess
import tempfile
import time

import pytest
from conftest import REPO, VENV_BIN

from demo import multiworker
from tb_replica_plugin import analysis, load
from tb_replica_plugin.families.status import present, rules

STALL = {"stall_seconds": 15}
# Worker 1 waits this long before it dies on its own: longer than any test needs.
WORKER_WAIT_SECONDS = "300"


def _start(logdir, scenario, log_dir):
    logs = [
        open(os.path.join(log_dir, f"worker_{i}.log"), "w+")  # noqa: SIM115
        for i in range(2)
    ]
    env = dict(multiworker.WORKER_ENV, **{multiworker.STALL_SECONDS_ENV: WORKER_WAIT_SECONDS})
    return multiworker.start_workers(logdir, [scenario], logs, env), logs


def _logs_tail(logs):
    tails = []
    for index, log in enumerate(logs):
        log.flush()
        log.seek(0)
        tails.append(f"--- worker {index}:\n{log.read()[-3000:]}")
    return "\n".join(tails)


def _wait_for(condition, timeout, processes, logs, what):
    """Polls `condition()` every 2 s until it returns something, for at most `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if any(p.poll() is not None for p in processes):
            break
        time.sleep(2.0)
    pytest.fail(f"no {what} within {timeout} s\n{_logs_tail(logs)}")


def _stall_finding(logdir, job):
    if not os.path.isdir(logdir):
        return None  # the workers have not written yet
    report = load(logdir, thresholds=analysis.Thresholds(**STALL))
    found = [f for f in report.findings.get(job, []) if f.kind == "stalled"]
    return found[0] if found else None


def _report_json(logdir):
    command = [os.path.join(VENV_BIN, "tb-replica"), "report", logdir, "--json"]
    command += [f"--threshold=stall_seconds={STALL['stall_seconds']}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode in (0, 1), result.stderr[-3000:]  # 1: findings of severity error
    return json.loads(result.stdout)


def _job_entry(document, job):
    (entry,) = [run for run in document["runs"] if run["run"] == job]
    return entry


def _assert_stall_names_worker_1(entry, step=multiworker.STALL_STEP):
    (stalled,) = [f for f in entry["findings"] if f["kind"] == "stalled"]
    assert stalled["severity"] == "error"
    assert stalled["first_step"] == step
    assert stalled["replicas"] == [1]  # the cause: worker 1's replica
    message = stalled["message"]
    assert f"worker_1 (replica 1) never entered step {step}" in message, message
    assert f"worker_0 (replica 0) waits inside step {step}" in message, message
    assert "wait_for_a_lock" in message, message  # the top of worker 1's main-thread stack
    rows = {row["name"]: row for row in entry["status"]["workers"]}
    assert (rows["worker_0"]["step"], rows["worker_0"]["in_step"]) == (step, True)
    assert (rows["worker_1"]["step"], rows["worker_1"]["in_step"]) == (step - 1, False)
    frames = [(frame["function"], frame["user"]) for frame in rows["worker_1"]["stack"]]
    assert ("wait_for_a_lock", True) in frames
    return stalled


@pytest.mark.parametrize("scenario", ["mw_stall", "mw_fit_stall"])
def test_a_hung_job_names_the_worker_that_never_entered_the_step(tmp_path, scenario):
    logdir, job = str(tmp_path / "logs"), f"{scenario}/replicas"
    with tempfile.TemporaryDirectory(prefix="tb_replica_status_") as log_dir:
        processes, logs = _start(logdir, scenario, log_dir)
        try:
            _wait_for(lambda: _stall_finding(logdir, job), 150, processes, logs, "stall finding")
            # While both processes still run: the report's stall finding and status rows.
            assert all(p.poll() is None for p in processes), _logs_tail(logs)
            entry = _job_entry(_report_json(logdir), job)
            _assert_stall_names_worker_1(entry)
            assert entry["status"]["state"] == "stalled"
            if scenario == "mw_fit_stall":
                _kill_worker_1_and_read_worker_0(logdir, job, processes, logs)
            else:
                _kill_both_and_read(logdir, job, processes)
        finally:
            for process in processes:
                multiworker.stop_worker(process)
            for log in logs:
                log.close()


def _kill_both_and_read(logdir, job, processes):
    """Both workers SIGKILLed while the job hangs: read 2 minutes later, it is silent, and its
    root cause stays worker 1, which stopped progressing: its stall (judged by the run's own
    `stall_secs`, 5 s, or by 15 s), or its loss when the stall time is longer than the stall."""
    for process in processes:
        os.kill(process.pid, signal.SIGKILL)
    for process in processes:
        process.wait(timeout=30)
    later = time.time() + 120
    for stall_seconds in (None, STALL["stall_seconds"], 300):
        thresholds = analysis.Thresholds(stall_seconds=stall_seconds)
        report = load(logdir, thresholds=thresholds, now=later)
        (root,) = [f for f in report.findings[job] if f.cause == "root_cause"]
        assert (root.name, root.replicas) == ("worker_1", [1]), root.message
        (line,) = present.report_text(report.runs[job], thresholds, now=later)
        assert line.startswith("  status: silent — worker_0 and worker_1 stopped sending "), line
        assert "SIGUSR1" not in root.message and "still heartbeat" not in root.message
        if stall_seconds == 300:  # a stall shorter than the stall time: worker 1's loss
            assert root.kind == "stopped_without_end", root.message
            assert "the workers were killed together, and it is the one that had stopped" in (
                root.message
            )
            continue
        assert root.kind == "stalled", root.message
        assert "then the workers stopped sending heartbeats" in root.message
        assert "worker_1 (replica 1) never entered step 5 (its last step is 4)" in root.message
        assert "wait_for_a_lock, then stopped sending heartbeats" in root.message
        assert line.endswith("; root cause: worker_1 never entered step 5"), line


def _kill_worker_1_and_read_worker_0(logdir, job, processes, logs):
    """Worker 1 SIGKILLed while worker 0 waits in step 5: worker 0's `UnavailableError` is
    recorded (it names worker 1) and the job's root cause is worker 1."""
    os.kill(processes[1].pid, signal.SIGKILL)
    processes[1].wait(timeout=30)
    try:
        processes[0].wait(timeout=120)  # TensorFlow's coordination service gives up on worker 1
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker 0 still waits 120 s after worker 1 was killed\n{_logs_tail(logs)}")
    report = load(logdir)
    status = report.runs[job].status
    worker_0, worker_1 = status.members
    end = worker_0.end
    assert (end["state"], end["how"]) == ("crashed", "fit")
    assert end["exception"]["class"] == "UnavailableError"
    assert end["exception"]["unhealthy_tasks"] == [{"task_type": "worker", "task_index": 1}]
    assert end["step"] == multiworker.STALL_STEP
    assert worker_1.end is None  # killed: no end record
    findings = {f.kind: f for f in report.findings[job]}
    # Worker 1 stopped progressing before step 5 (for longer than its `stall_secs`, 5 s), then
    # was killed: its stall is the first observed failure, its loss is listed too.
    root = findings["stalled"]
    assert root.cause == "root_cause" and root.replicas == [1] and root.name == "worker_1"
    assert "; then worker_1 stopped sending heartbeats with no end record" in root.message
    assert "SIGUSR1" not in root.message
    lost = findings["stopped_without_end"]
    assert lost.cause is None and lost.replicas == [1]
    assert lost.message.startswith("Worker worker_1 (replica 1) stopped sending heartbeats")
    crashed = findings["training_crashed"]
    assert crashed.replicas == [1]  # the replicas its error names: worker 1's
    assert crashed.message.startswith("Worker worker_0 (replica 0) crashed at step 5 with ")
    assert "UnavailableError" in crashed.message and "names worker_1" in crashed.message


def test_a_worker_stopped_by_ctrl_c_is_the_root_cause_of_the_job(tmp_path):
    """`mw_interrupt`: worker 1 gets a real SIGINT before step 5 (its KeyboardInterrupt not
    caught); worker 0, inside step 5 at the all-reduce, gets TensorFlow's `UnavailableError`
    naming worker 1. The root cause is worker 1's interruption, and no finding points at the
    OOM killer."""
    logdir, job = str(tmp_path / "logs"), "mw_interrupt/replicas"
    step = multiworker.STALL_STEP
    multiworker.launch(logdir, scenarios=["mw_interrupt"], timeout=90, allow_failure=True)
    report = load(logdir)
    worker_0, worker_1 = report.runs[job].status.members
    end_1 = worker_1.end
    assert (end_1["state"], end_1["how"], end_1["step"]) == ("interrupted", "exception", step - 1)
    assert end_1["exception"]["class"] == "KeyboardInterrupt"
    assert end_1["exception"]["frames"][-1]["function"] == "before_step"
    end_0 = worker_0.end
    assert (end_0["state"], end_0["step"]) == ("crashed", step)
    assert end_0["exception"]["class"] == "UnavailableError"
    assert end_0["exception"]["unhealthy_tasks"] == [{"task_type": "worker", "task_index": 1}]
    assert end_1["wall_time"] < end_0["wall_time"]
    findings = {f.kind: f for f in report.findings[job]}
    assert set(findings) == {"training_interrupted", "training_crashed"}
    root = findings["training_interrupted"]
    assert (root.cause, root.name, root.replicas, root.first_step) == (
        "root_cause",
        "worker_1",
        [1],
        step - 1,
    )
    assert root.message.startswith(
        "Root cause (first observed failure): Worker worker_1 (replica 1) was interrupted at "
        f"step {step - 1} (KeyboardInterrupt: Ctrl-C or SIGINT to its process), and worker_0 "
        "failed without it"
    ), root.message
    crashed = findings["training_crashed"]
    assert crashed.cause is None
    assert crashed.message.startswith(f"Worker worker_0 (replica 0) crashed at step {step} with ")
    assert "worker_1 was interrupted (KeyboardInterrupt: Ctrl-C or SIGINT) before" in (
        crashed.message
    )
    for finding in findings.values():
        assert "dmesg" not in finding.message and "OOM" not in finding.message, finding.message
    later = worker_0.end["wall_time"] + 600
    cause = rules.root_cause(report.runs[job].status, later)
    assert (cause["kind"], cause["worker"]) == ("training_interrupted", "worker_1")
    (line,) = present.report_text(report.runs[job], now=later)
    assert line.endswith(f"; root cause: worker_1 was interrupted at step {step - 1}"), line
