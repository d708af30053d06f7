"""The status family's write side on real strategies: how a custom loop ends (`with` block,
`close`, `halt_on`, an uncaught exception, interpreter exit, a notebook cell), heartbeats, a
stall's stacks, `SIGUSR1`, a dying thread, and that none of it can break training.

`fit` crashes are in tests/test_compat.py (both Keras flavours); hung and killed multi-worker jobs
in tests/test_status_jobs.py.
"""

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, mirrored
from status_loops import loop as _loop

from tb_replica_plugin import ReplicaProbe, load
from tb_replica_plugin.families.status import present, schema
from tb_replica_plugin.families.status import record as status_record
from tb_replica_plugin.probe import ReplicaFaultError


def _status(logdir, run="loop"):
    report = load(logdir)
    return report, report.runs[run].status


def test_a_with_block_records_the_exception_its_replica_and_step(tmp_path):
    strategy = mirrored(2)
    logdir = str(tmp_path)
    probe = ReplicaProbe(os.path.join(logdir, "loop"), strategy, update_freq=1)
    with pytest.raises(tf.errors.InvalidArgumentError), probe:
        _loop(probe, strategy, steps=5, fail_at=2)
    report, status = _status(logdir)
    end = status.end
    assert (end["state"], end["how"]) == ("crashed", "context")
    assert end["exception"]["class"] == "InvalidArgumentError"
    assert end["exception"]["replicas"] == [1]
    # The step it recorded last: 2 (steps 0, 1 ran; step 2's inputs were observed, then failed).
    assert end["step"] == 2
    frames = [(f["function"], f["user"]) for f in end["exception"]["frames"]]
    assert ("test_a_with_block_records_the_exception_its_replica_and_step", True) in frames
    (crash,) = report.findings["loop"]
    assert (crash.kind, crash.replicas, crash.first_step) == ("training_crashed", [1], 2)
    assert report.to_json()["runs"][0]["status"]["state"] == "crashed"


def test_close_and_halt_on_end_the_run_finished_or_halted(tmp_path):
    strategy = mirrored(2)
    logdir = str(tmp_path)
    probe = ReplicaProbe(os.path.join(logdir, "loop"), strategy, update_freq=1)
    _loop(probe, strategy, steps=3)
    probe.close()
    probe.close()  # a second close writes no second end
    report, status = _status(logdir)
    assert [e["type"] for e in status.events] == ["start", "end"]
    assert (status.end["state"], status.end["how"], status.end["step"]) == ("finished", "close", 2)
    assert report.findings["loop"] == []
    last = status.last_heartbeat()
    assert (last["step"], last["in_step"], last["interval"]) == (2, False, 5.0)

    # A fault that `raise_faults` raises inside the `with` block: halted, with its finding.
    halted = os.path.join(logdir, "halted")
    probe = ReplicaProbe(halted, strategy, update_freq=1)
    variable = tf.Variable([0.0, 0.0])

    @tf.function
    def nan_on_replica_1():
        def step_fn():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            grads = tf.fill([2], tf.where(replica == 1, float("nan"), 1.0))
            probe.observe_gradients([grads], [variable])

        strategy.run(step_fn)

    with pytest.raises(ReplicaFaultError), probe:
        nan_on_replica_1()
        probe.raise_faults()
    end = load(logdir).runs["halted"].status.end
    assert (end["state"], end["how"]) == ("halted", "context")
    assert [f["kind"] for f in end["findings"]] == ["nonfinite_gradients"]


def test_heartbeats_and_the_stacks_of_a_stall(tmp_path):
    """Heartbeats every 0.2 s; the main thread then waits 1.5 s in `waits_here`, past the 0.5 s
    stall time: one stacks event (once per stall) showing that line, and the heartbeats say
    no progress since."""
    strategy = mirrored(2)
    logdir = str(tmp_path)
    probe = ReplicaProbe(
        os.path.join(logdir, "loop"), strategy, update_freq=1, flush_secs=0.2, stall_secs=0.5
    )
    _loop(probe, strategy, steps=3)

    def waits_here():
        time.sleep(1.5)

    waits_here()
    probe.close()
    _, status = _status(logdir)
    assert [e["type"] for e in status.events] == ["start", "stacks", "end"]
    stacks = status.events[1]
    assert (stacks["reason"], stacks["step"]) == ("stall", 2)
    (main,) = [t for t in stacks["threads"] if t["main"]]
    assert main["frames"][-1]["function"] == "waits_here" and main["frames"][-1]["user"]
    assert any(t["name"] == "tb_replica_plugin-flush" for t in stacks["threads"])
    assert status.wall.size >= 5
    assert np.all(np.diff(status.wall) > 0)
    waiting = status.wall > stacks["wall_time"]
    assert np.all(status.step[waiting] == 2) and not np.any(status.in_step[waiting])
    # The last heartbeat before the stacks saw no progress for more than the stall time.
    before = status.wall <= stacks["wall_time"]
    assert status.wall[before][-1] - status.active_wall[before][-1] > 0.5


def test_sigusr1_writes_every_thread_stack_at_once(tmp_path):
    strategy = mirrored(2)
    logdir = str(tmp_path)
    probe = ReplicaProbe(os.path.join(logdir, "loop"), strategy, update_freq=1, flush_secs=30)
    _loop(probe, strategy, steps=2)
    assert status_record.STACKS_SIGNAL == signal.SIGUSR1  # installed: pytest leaves it free
    os.kill(os.getpid(), signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not probe.recorder("status").stacks_written:
        time.sleep(0.05)
    probe.close()
    _, status = _status(logdir)
    (stacks,) = [e for e in status.events if e["type"] == "stacks"]
    assert stacks["reason"] == "signal"
    (main,) = [t for t in stacks["threads"] if t["main"]]
    names = [f["function"] for f in main["frames"]]
    assert "test_sigusr1_writes_every_thread_stack_at_once" in names


def test_heartbeat_off_writes_no_heartbeat_but_the_end(tmp_path):
    strategy = mirrored(2)
    logdir = str(tmp_path)
    probe = ReplicaProbe(
        os.path.join(logdir, "loop"), strategy, update_freq=1, flush_secs=0.1, heartbeat=False
    )
    _loop(probe, strategy, steps=2)
    time.sleep(0.4)
    probe.close()
    report, status = _status(logdir)
    assert status.wall.size == 0
    assert [e["type"] for e in status.events] == ["start", "end"]
    assert status.start["heartbeat_secs"] is None
    assert report.to_json()["runs"][0]["status"]["state"] == "finished"
    with pytest.raises(ValueError, match="`stall_secs` must be a number > 0. Received: 0"):
        ReplicaProbe(os.path.join(logdir, "x"), strategy, stall_secs=0)


def test_a_failure_of_the_status_family_never_reaches_training(tmp_path, monkeypatch):
    """The exception record cannot be built: one warning; the training's own exception goes on
    unchanged and the other families' data is written."""
    strategy = mirrored(2)
    logdir = str(tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("broken attribution")

    monkeypatch.setattr(status_record.attribution, "exception_record", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe = ReplicaProbe(os.path.join(logdir, "loop"), strategy, update_freq=1)
        with pytest.raises(tf.errors.InvalidArgumentError), probe:
            _loop(probe, strategy, steps=3, fail_at=1)
    messages = [str(w.message) for w in caught if "tb_replica_plugin" in str(w.message)]
    assert messages == [
        "tb_replica_plugin: could not record status, training goes on without it: "
        "RuntimeError: broken attribution"
    ]
    report = load(logdir)
    assert report.runs["loop"].inputs.steps.tolist() == [0, 1]


CHILD = os.path.join(REPO, "tests", "status_child.py")


def _child(*args, script=CHILD):
    return subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )


def test_an_uncaught_exception_and_a_dying_thread_are_recorded(tmp_path):
    """A child process: a thread dies (the run goes on: `thread_crashed`), then the main thread
    raises a `ValueError` nobody catches: `sys.excepthook` records it (chained: Python still
    prints the traceback and the process exits 1)."""
    logdir = str(tmp_path)
    result = _child("uncaught", logdir)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "ValueError: the loader gave up" in result.stderr  # the previous hook still ran
    report = load(logdir)
    status = report.runs["loop"].status
    assert (status.end["state"], status.end["how"]) == ("crashed", "exception")
    assert status.end["exception"]["class"] == "ValueError"
    assert status.end["step"] == 2
    functions = [f["function"] for f in status.end["exception"]["frames"]]
    assert functions[-1] == "load_more" and "main" in functions
    (died,) = status.thread_exceptions
    assert died["thread"] == "prefetcher" and died["exception"]["class"] == "OSError"
    kinds = sorted(f.kind for f in report.findings["loop"])
    assert kinds == ["thread_crashed", "training_crashed"]


def test_a_loop_in_a_thread_of_its_own_is_watched_there_and_ends_with_its_exception(tmp_path):
    """A child process trains in thread `trainer`, which stalls 1.5 s in `waits_here`, then dies
    of a `ValueError`: that thread is the training thread (the start event names it, the stall's
    stacks mark it), and its exception ends the stretch crashed, not a `thread_crashed` warning
    beside a run left open."""
    logdir = str(tmp_path)
    result = _child("thread", logdir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ValueError: the trainer gave up" in result.stderr  # the previous hook still ran
    report = load(logdir)
    status = report.runs["loop"].status
    assert status.start["thread"] == "trainer"
    types = [e["type"] for e in status.events]
    # One stacks event for the wait; under load a slow step may stall long enough for another.
    assert types[0] == "start" and types[-1] == "end" and set(types[1:-1]) == {"stacks"}, types

    def trainer_frames(event):
        return {t["name"]: t for t in event["threads"]}["trainer"]["frames"]

    waited = [e for e in status.events[1:-1] if trainer_frames(e)[-1]["function"] == "waits_here"]
    assert len(waited) == 1, [trainer_frames(e)[-1] for e in status.events[1:-1]]
    threads = {t["name"]: t for t in waited[0]["threads"]}
    assert threads["trainer"]["training"] and not threads["MainThread"]["training"]
    assert (status.end["state"], status.end["how"], status.end["step"]) == (
        "crashed",
        "exception",
        2,
    )
    assert status.end["exception"]["class"] == "ValueError"
    assert status.thread_exceptions == []
    assert [f.kind for f in report.findings["loop"]] == ["training_crashed"]
    # While it waited, the heartbeats watched the trainer: outside a step, no progress.
    stacks_wall = waited[0]["wall_time"]
    before = status.wall <= stacks_wall
    assert status.wall[before][-1] - status.active_wall[before][-1] > 0.5
    assert not status.in_step[before][-1]
    assert status.wall[-1] <= status.end["wall_time"]  # no heartbeat after the end


def test_interpreter_exit_with_the_probe_open_ends_the_run_finished(tmp_path):
    logdir = str(tmp_path)
    result = _child("exit_open", logdir)
    assert result.returncode == 0, result.stderr[-3000:]
    status = load(logdir).runs["loop"].status
    assert (status.end["state"], status.end["how"], status.end["step"]) == ("finished", "exit", 2)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"closed": False}


FIT_CHILD = os.path.join(REPO, "tests", "fit_end_child.py")


def test_a_fit_stopped_outside_its_step_and_caught_by_the_script_is_not_finished(tmp_path):
    """A child process (tests/fit_end_child.py `caught`): three fits stopped at the end of step
    60 of 400 by another callback, each caught by the script; `on_train_end` never ran. A real
    SIGINT (Ctrl-C while the main thread runs fit's Python, the script saves the model and
    exits 0): interrupted at step 60, with the frames where it landed. A `ValueError`, caught,
    then a second fit with the same callback: the first stretch crashed at 60 (its exception's
    type is unknowable), the second finished. A KeyboardInterrupt raised without a signal, then
    exit: crashed at 60, saying what is known."""
    from fit_end_child import STOP_AT

    logdir = str(tmp_path)
    result = _child("caught", logdir, script=FIT_CHILD)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["iterations"] == {"sigint": STOP_AT + 1, "error": STOP_AT + 21, "keyboard": 61}
    report = load(logdir)
    runs = {e["run"]: e["status"] for e in report.to_json()["runs"]}

    status = report.runs["sigint"].status
    end = status.end
    assert (end["state"], end["how"], end["step"]) == ("interrupted", "exit", STOP_AT)
    assert end["exception"]["class"] == "KeyboardInterrupt"
    assert end["exception"]["message"] == (
        f"SIGINT (Ctrl-C) at step {STOP_AT}: fit stopped without returning (on_train_end never "
        "ran); the script caught the KeyboardInterrupt, then exited normally"
    )
    frames = end["exception"]["frames"]  # where the signal landed: the stopping callback
    assert (frames[-1]["function"], frames[-1]["user"]) == ("on_train_batch_end", True)
    assert "caught" in [f["function"] for f in frames]
    assert runs["sigint"]["state"] == "interrupted"
    assert report.findings["sigint"] == []

    status = report.runs["error"].status
    (crash,) = status.earlier_crashes
    assert (crash["state"], crash["how"], crash["step"]) == ("crashed", "fit", STOP_AT)
    assert crash["exception"]["class"] is None
    assert crash["exception"]["message"] == (
        f"fit stopped at step {STOP_AT} without returning (on_train_end never ran): an "
        "exception left fit and the script caught it, then began another fit"
    )
    assert [e["type"] for e in status.events] == ["start", "end", "start", "end"]
    # The same process wrote both stretches: an earlier stretch, not an earlier process.
    stopped = (
        f"fit stopped at step {STOP_AT} without returning (on_train_end never ran): an exception "
        "left fit and the script caught it, then began another fit"
    )
    assert present.report_text(report.runs["error"]) == [
        "  status: finished",
        f"    an earlier stretch of this process: crashed at step {STOP_AT}: {stopped}",
    ]
    body = runs["error"]
    assert [c["same_process"] for c in body["earlier_crashes"]] == [True]
    assert [(e["earlier_process"], e["earlier_stretch"]) for e in body["events"]] == [
        (False, True),
        (False, True),
        (False, False),
        (False, False),
    ]
    end = status.end
    assert (end["state"], end["how"], end["step"], end["exception"]) == (
        "finished",
        "fit",
        STOP_AT + 20,
        None,
    )

    end = report.runs["keyboard"].status.end
    assert (end["state"], end["how"], end["step"]) == ("crashed", "exit", STOP_AT)
    assert end["exception"]["message"] == (
        f"fit stopped at step {STOP_AT} without returning (on_train_end never ran): an "
        "exception left fit and the script exited normally (it caught the exception, or the "
        "exception was SystemExit)"
    )
    (finding,) = report.findings["keyboard"]
    assert (finding.kind, finding.first_step) == ("training_crashed", STOP_AT)
    assert finding.message.startswith(
        f"Training crashed at step {STOP_AT} with an exception: fit stopped at step {STOP_AT} "
        "without returning"
    )
    # No frame of the user's code: no "that line" to look at.
    assert finding.message.endswith(
        "SystemExit). Look at the full message and traceback in the status view."
    ), finding.message
    assert "that line" not in finding.message
    # The status line says what the message says, not "an exception".
    assert present.report_text(report.runs["keyboard"]) == [
        f"  status: crashed at step {STOP_AT} — {end['exception']['message']}"
    ]


def test_a_fit_killed_in_its_first_seconds_says_which_step_it_reached(tmp_path):
    """A child process fits with `flush_secs=5` (20 ms steps) and is SIGKILLed once it printed
    step 100, within its first seconds: the heartbeats at its first completed step and 1, 2, 4
    s later say which step it reached (at most about a second behind), not "before the first
    step"."""
    logdir = str(tmp_path)
    child = subprocess.Popen(
        [sys.executable, FIT_CHILD, "kill", logdir],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    seen = []  # (monotonic time the parent read it, step)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and (not seen or seen[-1][1] < 100):
            line = child.stdout.readline()
            assert line, "the child stopped before it was killed"
            if line.startswith("step "):
                seen.append((time.monotonic(), int(line.split()[1])))
        killed_at = time.monotonic()
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    assert seen[-1][1] >= 100
    report = load(logdir, now=time.time() + 3600)
    status = report.runs["replicas"].status
    assert status.end is None
    last = status.last_heartbeat()["step"]
    # Every step printed more than 1.5 s before the kill (the widest gap of the first
    # heartbeats, 1 s, and the flush and the pipe) is in a heartbeat; nothing is invented.
    must_have = max([step for t, step in seen if t <= killed_at - 1.5], default=1)
    assert max(1, must_have) <= last <= seen[-1][1] + 2
    (finding,) = report.findings["replicas"]
    assert finding.kind == "stopped_without_end"
    assert f"at step {last}" in finding.message and "before the first step" not in finding.message


def test_a_custom_loop_in_a_notebook_ends_with_each_cell_and_says_how(tmp_path):
    """A child process runs a custom loop cell by cell in a real IPython shell (as a Jupyter
    kernel does): a cell's exception never reaches `sys.excepthook` and the kernel lives on
    between cells. Each cell that ran steps ends the run with `how` "cell": finished when its
    loop returned, crashed at a failing step (replica 1, step 2), interrupted by a `SIGINT`; a
    `NameError` outside training ends nothing; the next cell's steps begin a new stretch (the
    run reads running while they go on). A loop trained in a thread of its own is left alone by
    the cells until its thread has returned."""
    logdir = str(tmp_path)
    result = _child(logdir, script=os.path.join(REPO, "tests", "notebook_child.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    errors = [None, None, "NameError", "InvalidArgumentError", None, "KeyboardInterrupt", None]
    assert got["errors"] == [*errors, None, None, None, None]
    ends = [state["end"] for state in got["states"]]
    interrupted_at = ends[5][2]
    assert interrupted_at >= 5  # steps 5.. ran in that cell
    assert ends == [
        None,  # the set-up: no step yet, no stretch
        ["finished", "cell", 1],
        ["finished", "cell", 1],  # the NameError ended nothing
        ["crashed", "cell", 2],
        ["finished", "cell", 4],
        ["interrupted", "cell", interrupted_at],
        ["finished", "cell", interrupted_at + 1],
        ["finished", "cell", interrupted_at + 1],  # close: nothing open
        *[["finished", "cell", interrupted_at + 1]] * 3,  # the next cells: another run's
    ]
    assert [state["starts"] for state in got["states"]] == [0, 1, 1, 2, 3, 4, 5, 5, 5, 5, 5]
    assert [state["state"] for state in got["states"]][3:6] == [
        "crashed",
        "finished",
        "interrupted",
    ]
    crashed = [state["findings"] for state in got["states"]]
    assert crashed[3] == ["training_crashed"] and crashed[4] == []  # later: an earlier crash
    assert got["while_training"]["state"] == "running"
    assert (got["while_training"]["end"], got["while_training"]["starts"]) == (None, 4)
    # A loop trained in thread `trainer` while the cells run: not theirs to end; the first cell
    # after its thread returned ends it.
    background = got["background"]
    assert [state["state"] for state in background] == [None] * 8 + ["running"] * 2 + ["finished"]
    assert [state["end"] for state in background[8:10]] == [None, None]
    (state, how, last) = background[10]["end"]
    assert (state, how) == ("finished", "cell") and last >= 1
    assert [state["starts"] for state in background[8:]] == [1, 1, 1]
    status = load(logdir).runs["background"].status
    assert status.start["thread"] == "trainer"
    status = load(logdir).runs["loop"].status
    assert status.start["thread"] is None  # the main thread: the cells'
    (crash,) = status.earlier_crashes
    assert crash["exception"]["class"] == "InvalidArgumentError"
    assert crash["exception"]["replicas"] == [1]


def test_a_cell_error_counts_as_training_s_through_tensorflow_frames_or_its_cause():
    from tb_replica_plugin.families.status import notebook

    try:
        try:
            tf.debugging.assert_all_finite(tf.constant([np.nan]), "not finite")
        except tf.errors.InvalidArgumentError as error:
            raise RuntimeError("the loader wraps it") from error
    except RuntimeError as wrapped:
        assert notebook.raised_in_training(wrapped)  # through its cause's TensorFlow frames
        assert not notebook.raised_in_training(wrapped, depth=1)  # its own frames: this test's
    try:
        print(undefined_in_a_plotting_cell)  # noqa: F821
    except NameError as own:
        assert not notebook.raised_in_training(own)


def test_end_states_match_the_schema():
    from tb_replica_plugin.write import lifecycle

    assert lifecycle.STATES == schema.END_STATES
