"""The status family at its edges: a job that stalled and was then killed, a run without
heartbeats, a worker interrupted by Ctrl-C, a run lost before its heartbeat recorded a step,
a stall without stacks yet, and the stall time a run recorded.

Hand-built series as reader.py gives them (helpers of tests/test_status_read.py), and one real
probe with `heartbeat=False`; the real 2-worker job stalled and then killed is in
tests/test_status_jobs.py.
"""

import json
import os
import time

import pytest
from conftest import mirrored
from error_texts import sigkill_message
from status_loops import loop as _loop
from test_status_read import (
    HOME,
    T0,
    end,
    event,
    fixture_exception,
    heartbeat,
    job_of,
    run_data,
    series_of,
    stacks_event,
    start,
    stepping,
    worker_start,
)

from tb_replica_plugin import ReplicaProbe, load
from tb_replica_plugin.analysis import Thresholds
from tb_replica_plugin.families.status import attribution, present, rules, schema, states


def stalled_then_killed_job(kill_after=30.0):
    """Worker 1 stops before step 5 at T0 + 10 (stacks at T0 + 15, its `stall_secs` 5 s); worker
    0 waits inside step 5 from T0 + 11; both are SIGKILLed `kill_after` s later."""
    beats = int(kill_after // 2)
    waiting = [
        heartbeat(T0 + 11 + 2 * i, 5, active_wall=T0 + 11, in_step=1, pid=100)
        for i in range(beats + 1)
    ]
    stuck = [heartbeat(T0 + 10 + 2 * i, 4, active_wall=T0 + 10, pid=101) for i in range(1, beats)]
    own = {"stall_secs": 5.0}
    worker_0 = (stepping(0, 4, pid=100) + waiting, [_start(0, own)])
    worker_1 = (
        stepping(0, 4, pid=101)[:-1] + stuck,
        [_start(1, own), stacks_event(T0 + 16, T0 + 10, 4)],
    )
    return job_of([worker_0, worker_1])


def _start(index=None, fields=()):
    """A start event (of worker `index`, or of a single run) with some fields changed."""
    _, value = start(T0) if index is None else worker_start(index)
    document = json.loads(value.item()) | dict(fields)
    return event(document.pop("type"), document.pop("wall_time"), **document)


@pytest.mark.parametrize("stall_seconds", [None, 15.0])
def test_a_job_stalled_then_killed_is_silent_and_its_cause_the_worker_that_stopped(
    stall_seconds,
):
    data = stalled_then_killed_job()
    now = T0 + 200  # long after both were killed
    thresholds = Thresholds(stall_seconds=stall_seconds)
    assert rules.run_state(data.status, now, thresholds).state == "silent"
    findings = {(f.kind, f.name): f for f in rules.find(data, thresholds, now=now)}
    stall = findings[("stalled", "worker_1")]
    assert stall.cause == rules.ROOT_CAUSE and stall.replicas == [1]
    message = stall.message
    assert "then the workers stopped sending heartbeats" in message, message
    assert "while the workers still heartbeat" not in message
    assert "SIGUSR1" not in message
    assert "worker_0 (replica 0) waited inside step 5" in message
    assert f"its main thread at {HOME}/train.py:88 in wait_here, then stopped" in message
    assert "look at why it did not go on with step 5 (that line," in message
    assert stall.threshold == (5.0 if stall_seconds is None else 15.0)
    assert findings[("stopped_without_end", "worker_0")].cause is None
    assert findings[("stopped_without_end", "worker_1")].cause is None
    cause = rules.root_cause(data.status, now, thresholds)
    assert (cause["kind"], cause["worker"], cause["wall_time"]) == ("stalled", "worker_1", T0 + 10)
    (line,) = present.report_text(data, thresholds, now=now)
    assert line == (
        "  status: silent — worker_0 and worker_1 stopped sending heartbeats with no end record; "
        "root cause: worker_1 never entered step 5"
    )
    # While they still heartbeat (before the kill), it is stalled as before.
    assert rules.run_state(data.status, T0 + 40, thresholds).state == "stalled"


def test_a_job_killed_together_during_a_short_stall_blames_the_worker_behind():
    """A stall shorter than the stall time, then both killed at once: their last heartbeats'
    order is chance; the worker behind, which had stopped progressing, is the root cause."""
    data = stalled_then_killed_job()
    now = T0 + 200
    thresholds = Thresholds(stall_seconds=300)
    assert not [f for f in rules.find(data, thresholds, now=now) if f.kind == "stalled"]
    cause = rules.root_cause(data.status, now, thresholds)
    assert (cause["kind"], cause["worker"]) == ("stopped_without_end", "worker_1")
    assert (
        "It had made no progress for 28 s before (less than the stall time), behind "
        in (cause["message"])
    )
    # A worker behind that was still progressing when the job was killed is not picked.
    waiting = [heartbeat(T0 + 11 + 2 * i, 5, active_wall=T0 + 11, in_step=1) for i in range(3)]
    moving = (stepping(0, 4, wall=T0 + 8, pid=101), [worker_start(1)])  # last T0 + 16, step 4
    data = job_of([(stepping(0, 4, pid=100) + waiting, [worker_start(0)]), moving])
    assert rules.root_cause(data.status, now, thresholds)["worker"] == "worker_0"


def test_a_single_run_stalled_then_killed_gives_no_signal_advice():
    stuck = [heartbeat(T0 + 10 + 2 * i, 4, active_wall=T0 + 10) for i in range(1, 201)]
    events = [start(T0), stacks_event(T0 + 320, T0 + 10, 4)]
    series = series_of(stepping(0, 4) + stuck, events)  # last heartbeat T0 + 410
    now = T0 + 600
    assert rules.run_state(series, now).state == "silent"
    found = {f.kind: f for f in rules.find(run_data(series), now=now)}
    assert set(found) == {"stalled", "stopped_without_end"}
    message = found["stalled"].message
    assert message.startswith(
        "No progress for 400 s at step 4, then the process stopped sending heartbeats (190 s "
        "ago) with no end record (killed or lost): the main thread was in Python"
    )
    assert f"Look at {HOME}/train.py:88 in wait_here." in message
    assert "SIGUSR1" not in message
    assert rules.root_cause(series, now)["kind"] == "stalled"


def test_heartbeat_off_is_running_until_its_end_record_never_silent():
    events = [_start(fields={"heartbeat_secs": None, "stall_secs": None})]
    series = series_of([], events)
    for now in (T0 + 5, T0 + 61, T0 + 100_000):
        assert rules.run_state(series, now) == ("running", None)
        assert rules.find(run_data(series), now=now) == []
    assert present.report_text(run_data(series), now=T0 + 100_000) == [
        "  status: running (no heartbeats: heartbeat=False; whether it still runs is unknown "
        "until its end record)"
    ]
    ended = series_of([], events + [end(T0 + 700, "crashed", 9)])
    assert rules.run_state(ended, T0 + 800).state == "crashed"
    # An older run whose start event has no "heartbeat_secs" at all is judged as before.
    document = json.loads(start(T0)[1].item())
    older = {k: v for k, v in document.items() if k not in ("heartbeat_secs", "stall_secs")}
    older.pop("type"), older.pop("wall_time")
    series = series_of([], [event(schema.EVENT_START, T0, **older)])
    assert rules.run_state(series, T0 + 61).state == "silent"


def test_a_real_probe_without_heartbeats_reads_running_not_lost(tmp_path):
    strategy = mirrored(2)
    logdir = str(tmp_path)
    probe = ReplicaProbe(
        os.path.join(logdir, "loop"), strategy, update_freq=1, flush_secs=0.1, heartbeat=False
    )
    _loop(probe, strategy, steps=2)
    time.sleep(0.3)  # a flush: the run's data is on disk, training still open
    later = time.time() + 600  # ten minutes on, no heartbeat ever
    report = load(logdir, now=later)
    status = report.runs["loop"].status
    assert status.end is None and status.start["heartbeat_secs"] is None
    assert rules.run_state(status, later).state == "running"
    assert report.findings["loop"] == []
    probe.close()
    assert rules.run_state(load(logdir).runs["loop"].status, later).state == "finished"


def interrupted_job():
    """Worker 1 is interrupted (Ctrl-C) in step 5 at T0 + 12; worker 0 raises UnavailableError
    naming it at T0 + 21 (the coordination service's text is the same for any lost worker)."""
    parsed = attribution.parse_error_text(sigkill_message())
    unavailable = {
        "class": "UnavailableError",
        "module": "tensorflow.python.framework.errors_impl",
        "message": sigkill_message(),
        "frames": [],
        "tasks": parsed["tasks"],
        "unhealthy_tasks": parsed["unhealthy_tasks"],
        "step": 5,
    }
    waiting = [heartbeat(T0 + 11 + 2 * i, 5, active_wall=T0 + 11, in_step=1) for i in range(5)]
    worker_0 = (
        stepping(0, 4, pid=100) + waiting,
        [worker_start(0), end(T0 + 21, "crashed", 5, exception=unavailable, how="exception")],
    )
    interrupt = {"class": "KeyboardInterrupt", "module": "builtins", "message": "", "step": 5}
    worker_1 = (
        stepping(0, 5, pid=101),
        [worker_start(1), end(T0 + 12, "interrupted", 5, exception=interrupt)],
    )
    return job_of([worker_0, worker_1])


def test_a_worker_interrupted_by_ctrl_c_is_the_root_cause_not_the_crash_it_caused():
    data = interrupted_job()
    now = T0 + 500
    findings = {f.kind: f for f in rules.find(data, now=now)}
    assert set(findings) == {"training_crashed", "training_interrupted"}
    interrupted = findings["training_interrupted"]
    assert (interrupted.name, interrupted.replicas, interrupted.severity) == (
        "worker_1",
        [1],
        "warning",
    )
    assert interrupted.cause == rules.ROOT_CAUSE
    assert interrupted.message.startswith(
        "Root cause (first observed failure): Worker worker_1 (replica 1) was interrupted at "
        "step 5 (KeyboardInterrupt"
    )
    crash = findings["training_crashed"]
    assert crash.cause is None
    assert "worker_1 was interrupted (KeyboardInterrupt: Ctrl-C or SIGINT) before" in crash.message
    assert "dmesg" not in crash.message and "OOM" not in crash.message
    cause = rules.root_cause(data.status, now)
    assert (cause["kind"], cause["worker"]) == ("training_interrupted", "worker_1")
    (line,) = present.report_text(data, now=now)
    assert line.endswith("; root cause: worker_1 was interrupted at step 5"), line
    # A whole job interrupted (no other worker failed): no finding, no root cause.
    both = job_of(
        [
            (stepping(0, 5, pid=100 + i), [worker_start(i), end(T0 + 12, "interrupted", 5)])
            for i in range(2)
        ]
    )
    assert rules.find(both, now=now) == [] and rules.root_cause(both.status, now) is None


def test_a_run_lost_before_its_heartbeat_recorded_a_step_says_what_is_known():
    series = series_of([heartbeat(T0, -1)], [start(T0)])  # the early first heartbeat, then killed
    now = T0 + 100
    (lost,) = rules.find(run_data(series), now=now)
    assert "before the first step" not in lost.message
    assert lost.message.startswith(
        "The run stopped sending heartbeats after a last heartbeat that recorded no step (100 s "
        "ago) with no end record"
    )
    assert present.report_text(run_data(series), now=now) == [
        "  status: silent 100 s after a last heartbeat that recorded no step — no end record "
        "(killed or lost)"
    ]


def test_a_stall_without_stacks_yet_says_when_they_come():
    """The reader's stall time (20 s) is below the run's `stall_secs` (60 s): stalled, no stacks
    yet; the finding quotes no line and says when the stacks will be there."""
    stuck = [heartbeat(T0 + 10 + 2 * i, 4, active_wall=T0 + 10) for i in range(1, 16)]
    events = [_start(fields={"stall_secs": 60.0})]
    series = series_of(stepping(0, 4) + stuck, events)  # 30 s without progress at T0 + 40
    now = T0 + 41
    assert rules.run_state(series, now).state == "running"  # its own 60 s: not yet
    (stall,) = rules.find(run_data(series), Thresholds(stall_seconds=20), now=now)
    assert "Look at" not in stall.message and "that line" not in stall.message
    assert (
        "No stack of the run yet: its probe writes every thread's stack after 60 s without "
        "progress (its `stall_secs`), or at once on SIGUSR1 to process 100." in stall.message
    )
    # A job's cause without stacks: the advice quotes no line.
    waiting = [heartbeat(T0 + 11 + 2 * i, 5, active_wall=T0 + 11, in_step=1) for i in range(15)]
    job = job_of(
        [
            (stepping(0, 4, pid=100) + waiting, [worker_start(0)]),
            (stepping(0, 4, pid=101)[:-1] + stuck, [worker_start(1)]),
        ]
    )
    (stall,) = rules.find(job, Thresholds(stall_seconds=20), now=now)
    assert "(that line," not in stall.message
    assert (
        "No stack of worker_1 (replica 1) yet: its probe writes every thread's stack after 300 s "
        "without progress" in stall.message
    )


def test_a_run_is_judged_by_the_stall_time_it_recorded_unless_the_reader_says_otherwise():
    stuck = [heartbeat(T0 + 10 + 2 * i, 4, active_wall=T0 + 10) for i in range(1, 21)]
    for recorded, state in ((30.0, "stalled"), (60.0, "running"), (None, "running")):
        events = [_start(fields={"stall_secs": recorded})]
        series = series_of(stepping(0, 4) + stuck, events)  # 40 s without progress
        now = T0 + 51
        assert rules.run_state(series, now).state == state, recorded
        assert states.stall_limit(series, Thresholds()) == (recorded or 300.0)
        assert rules.run_state(series, now, Thresholds(stall_seconds=35)).state == "stalled"
        assert rules.run_state(series, now, Thresholds(stall_seconds=45)).state == "running"
    assert Thresholds.from_overrides(["stall_seconds=15"]).stall_seconds == 15.0
    assert Thresholds.from_overrides(["min_identical_rng_steps=2"]).min_identical_rng_steps == 2


def test_a_crash_quotes_a_line_only_when_it_has_one():
    """The crash finding's advice names "that line" only when the message quotes a frame of the
    user's code; the status line of an exception without a class (a `fit` that stopped without
    returning) says its message, not "an exception"; an earlier stretch of the same process is
    not called an earlier process."""
    now = T0 + 100
    framed = fixture_exception(3)
    bare = {"class": "InvalidArgumentError", "message": framed["message"], "frames": [], "step": 3}
    for exception, tail in ((framed, " and at that line."), (bare, " per replica).")):
        series = series_of(
            stepping(0, 3), [start(T0), end(T0 + 9, "crashed", 3, exception=exception)]
        )
        (crash,) = rules.find(run_data(series), now=now)
        assert crash.message.endswith(tail), crash.message
    unknown = {"class": None, "message": "fit stopped at step 3 without returning\nmore", "step": 3}
    series = series_of(stepping(0, 3), [start(T0), end(T0 + 9, "crashed", 3, exception=unknown)])
    (crash,) = rules.find(run_data(series), now=now)
    assert crash.message == (
        "Training crashed at step 3 with an exception: fit stopped at step 3 without "
        "returning. Look at the full message and traceback in the status view."
    )
    assert present.report_text(run_data(series), now=now) == [
        "  status: crashed at step 3 — fit stopped at step 3 without returning"
    ]
    # Two stretches of process 100 (two fits), then a third of process 200.
    events = [
        start(T0, pid=100),
        end(T0 + 9, "crashed", 3, exception=unknown),
        start(T0 + 10, pid=100),
        end(T0 + 19, "crashed", 3, exception=bare),
        start(T0 + 20, pid=100),
    ]
    series = series_of(stepping(0, 3), events)
    lines = present.report_text(run_data(series), now=T0 + 21)
    assert lines[1:] == [
        "    an earlier stretch of this process: crashed at step 3: fit stopped at step 3 "
        "without returning",
        "    an earlier stretch of this process: crashed at step 3: InvalidArgumentError: "
        + attribution.first_line(bare["message"]),
    ]
    series = series_of(stepping(0, 3), events[:4] + [start(T0 + 20, pid=200)])
    lines = present.report_text(run_data(series), now=T0 + 21)
    assert [line.split(":")[0] for line in lines[1:]] == ["    an earlier process of this run"] * 2
