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
from tb_replica_plugin.families.status import record as status_record
from tb_replica_plugin.families.status import schema
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
    assert [e["type"] for e in status.events] == ["start", "stacks", "end"]
    threads = {t["name"]: t for t in status.events[1]["threads"]}
    assert threads["trainer"]["training"] and not threads["MainThread"]["training"]
    assert threads["trainer"]["frames"][-1]["function"] == "waits_here"
    assert (status.end["state"], status.end["how"], status.end["step"]) == (
        "crashed",
        "exception",
        2,
    )
    assert status.end["exception"]["class"] == "ValueError"
    assert status.thread_exceptions == []
    assert [f.kind for f in report.findings["loop"]] == ["training_crashed"]
    # While it waited, the heartbeats watched the trainer: outside a step, no progress.
    stacks_wall = status.events[1]["wall_time"]
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
