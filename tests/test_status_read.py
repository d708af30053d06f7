"""The status family's read side, pure numpy: the reader, the rules (states, findings, the root
cause of a job) and the presenter (attribution of TensorFlow's error texts:
tests/test_status_attribution.py).

Samples are built as `reader.py` gives them (`{tag: [(step, numpy value), ...]}`): heartbeats
float64 [8] at wall-clock-millisecond steps, events 0-d arrays of JSON bytes. Every rule gets
an explicit `now`. The real texts are in tests/status_texts/ (see its README).
"""

import json
import threading
import types

import numpy as np
import pytest
from error_texts import HOME, keras_crash, sigkill_message
from hypothesis import given, settings
from hypothesis import strategies as st

from tb_replica_plugin.analysis import Thresholds
from tb_replica_plugin.families.status import attribution, present, read, rules, schema

T0 = 1_800_000_000.0  # wall time of the runs' starts


# --- samples as reader.py gives them ----------------------------------------------------------


def heartbeat(wall, step, step_wall=None, active_wall=None, in_step=0, completed=-1, pid=100):
    """One `status/heartbeat` sample: `(wall ms, float64 [8])`; progress at `wall` by default."""
    row = np.full(schema.HEARTBEAT_FIELDS, -1.0)
    row[schema.HB_WALL] = wall
    row[schema.HB_STEP] = step
    row[schema.HB_STEP_WALL] = wall if step_wall is None else step_wall
    row[schema.HB_ACTIVE_WALL] = wall if active_wall is None else active_wall
    row[schema.HB_IN_STEP] = in_step
    row[schema.HB_COMPLETED] = completed
    row[schema.HB_INTERVAL] = 2.0
    row[schema.HB_PID] = pid
    return int(wall * 1000), row


def event(kind, wall, **fields):
    """One `status/event` sample: `(wall ms, 0-d array of JSON bytes)`."""
    document = {"type": kind, "wall_time": wall, **fields}
    return int(wall * 1000), np.array(json.dumps(document).encode())


def start(wall, replicas=(0, 1), pid=100, worker=None, **thread):
    devices = [f"/job:localhost/replica:0/task:0/device:CPU:{r}" for r in replicas]
    return event(
        schema.EVENT_START,
        wall,
        pid=pid,
        host="host-a",
        source="fit",
        replicas=list(replicas),
        devices=devices,
        worker=worker,
        heartbeat_secs=2.0,
        stall_secs=300.0,
        **thread,
    )


def end(wall, state, step, exception=None, how="fit"):
    return event(
        schema.EVENT_END,
        wall,
        state=state,
        how=how,
        step=step,
        exception=exception,
        findings=[],
    )


def samples(heartbeats, events):
    return {schema.TAG_HEARTBEAT: sorted(heartbeats), schema.TAG_EVENT: sorted(events)}


def series_of(heartbeats, events, run="run", notes=None):
    return read.from_samples(run, samples(heartbeats, events), [] if notes is None else notes)


def run_data(status, run="run", workers=()):
    return types.SimpleNamespace(run=run, status=status, workers=list(workers))


def stepping(first_step, last_step, wall=T0 + 1, pid=100, **fields):
    """Heartbeats every 2 s, one step per heartbeat."""
    return [
        heartbeat(wall + 2 * i, step, pid=pid, **fields)
        for i, step in enumerate(range(first_step, last_step + 1))
    ]


def fixture_exception(step=3):
    """The EXCEPTION object the write side records for the Keras crash (traceback frames)."""
    crash = keras_crash()
    parsed = attribution.parse_error_text(crash["message"])
    return {
        "class": crash["class"],
        "module": crash["module"],
        "message": attribution.cut_message(crash["message"]),
        "frames": [attribution.make_frame(*frame) for frame in crash["traceback"]],
        "defined_at": parsed["defined_at"],
        "node": parsed["node"],
        "replicas": parsed["local_replicas"],
        "devices": parsed["devices"],
        "tasks": parsed["tasks"],
        "unhealthy_tasks": parsed["unhealthy_tasks"],
        "step": step,
    }


# --- reader, rules and presenter on single runs ---------------------------------------------


def _body_is_strict_json(data, now):
    body = present.status_body(data, now, Thresholds())
    json.dumps(body, allow_nan=False)
    json.dumps(present.report_json(data, Thresholds(), now=now), allow_nan=False)
    return body


def test_clean_finish_is_finished_with_no_finding():
    series = series_of(stepping(0, 10), [start(T0), end(T0 + 22, "finished", 10)])
    now = T0 + 10_000  # long after: an ended run is never silent
    assert series.step.tolist() == list(range(11))
    assert series.start["host"] == "host-a" and series.end["state"] == "finished"
    assert rules.run_state(series, now) == ("finished", pytest.approx(now - (T0 + 21)))
    data = run_data(series)
    assert rules.find(data, Thresholds(), now=now) == []
    assert present.report_text(data, Thresholds(), now=now) == ["  status: finished"]
    assert present.live_fields(data, now)["status"]["state"] == "finished"
    assert present.live_fields(data, now)["status"]["worst"] is None
    (row,) = _body_is_strict_json(data, now)["workers"]
    assert (row["name"], row["state"], row["step"], row["replicas"]) == (
        "run",
        "finished",
        10,
        [0, 1],
    )
    assert (row["stalled_for_s"], row["exception"], row["stack"]) == (None, None, None)


def crashed_series():
    events = [start(T0), end(T0 + 9, "crashed", 3, exception=fixture_exception(3), how="fit")]
    return series_of(stepping(0, 3), events)


def test_crash_in_fit_on_replica_1_at_step_3():
    data = run_data(crashed_series())
    now = T0 + 100
    (finding,) = rules.find(data, Thresholds(), now=now)
    assert (finding.kind, finding.severity, finding.view) == ("training_crashed", "error", "status")
    assert (finding.first_step, finding.replicas, finding.name) == (3, [1], None)
    for words in (
        "Training crashed at step 3 with InvalidArgumentError: input not finite",
        "names replica 1 (node `replica_1/sequential_1/check_1/VerifyFinite/CheckNumerics`)",
        "created in your code at /tmp/exp/crash2.py:9 in call",
        "NaN or Inf",
    ):
        assert words in finding.message
    assert finding.cause is None  # a single run has no root-cause marking
    assert present.report_text(data, Thresholds(), now=now) == [
        "  status: crashed at step 3 — InvalidArgumentError on replica 1 (at crash2.py:9 in call)"
    ]
    body = _body_is_strict_json(data, now)
    assert body["state"] == "crashed"
    exception = body["workers"][0]["exception"]
    assert exception["node"].startswith("replica_1/")
    # What the tab's status panel shows of it: the report's first line and user frame.
    assert exception["first_line"] == "input not finite : Tensor had NaN values"
    assert (exception["user_frame"]["file"], exception["user_frame"]["line"]) == (
        "/tmp/exp/crash2.py",
        9,
    )
    assert body["root_cause"]["kind"] == "training_crashed"
    assert body["root_cause"]["replicas"] == [1]
    assert body["events"][-1]["summary"].startswith("crashed at step 3: InvalidArgumentError")
    worst = present.live_fields(data, now)["status"]["worst"]
    assert worst.startswith("Training crashed at step 3")


def test_a_stretch_a_notebook_cell_ended_says_so():
    def summary(*args, **kwargs):
        return present.event_summary(json.loads(end(T0, *args, **kwargs)[1].item()))

    assert summary("finished", 4, how="cell") == "finished at step 4 (notebook cell)"
    crashed = summary("crashed", 2, fixture_exception(2), how="cell")
    assert crashed.startswith("crashed at step 2 (notebook cell): InvalidArgumentError")
    assert summary("finished", 4, how="close") == "finished at step 4"


def test_crash_without_defined_at_falls_back_to_the_traceback_user_frame():
    exception = fixture_exception(3) | {"defined_at": []}
    events = [start(T0), end(T0 + 9, "crashed", 3, exception=exception)]
    (finding,) = rules.find(run_data(series_of(stepping(0, 3), events)), now=T0 + 10)
    assert "raised from your code at /tmp/exp/crash2.py:17 in <module>" in finding.message


def silent_series():
    return series_of(stepping(0, 5), [start(T0)])  # last heartbeat T0 + 11 at step 5


@pytest.mark.parametrize(
    ("after", "state", "kinds"),
    [
        (1, "running", []),
        (59, "running", []),  # silent_seconds 60 > 3 heartbeat intervals of 2 s
        (61, "silent", ["stopped_without_end"]),
        (600, "silent", ["stopped_without_end"]),
    ],
)
def test_silent_run_depends_on_now(after, state, kinds):
    series = silent_series()
    now = T0 + 11 + after
    assert rules.run_state(series, now) == (state, pytest.approx(after))
    findings = rules.find(run_data(series), now=now)
    assert [f.kind for f in findings] == kinds
    if kinds:
        assert findings[0].first_step == 5
        assert findings[0].value == pytest.approx(after)
        assert findings[0].threshold == 60.0
        assert "stopped sending heartbeats at step 5" in findings[0].message
        assert "no end record" in findings[0].message
        text = present.report_text(run_data(series), now=now)
        assert text == [f"  status: silent {after} s after step 5 — no end record (killed or lost)"]
    else:
        text = present.report_text(run_data(series), now=now)
        assert text == [f"  status: running at step 5 (last heartbeat {after} s ago)"]


def stacks_event(wall, active_wall, step, user_line=88, function="wait_here", trainer=None):
    """A stall's stacks: the main thread waits at `train.py:user_line` in `function`; with
    `trainer` (a name), that thread does, marked "training", and the main thread is in `main`."""
    main = [
        attribution.make_frame(f"{HOME}/train.py", 30, "<module>"),
        attribution.make_frame(f"{HOME}/train.py", user_line, function),
        attribution.make_frame(threading.__file__, 320, "wait"),
    ]
    helper = [attribution.make_frame(threading.__file__, 1002, "_bootstrap")]
    threads = [
        {"name": "MainThread", "ident": 1, "main": True, "daemon": False, "frames": main},
        {"name": "heartbeat", "ident": 2, "main": False, "daemon": True, "frames": helper},
    ]
    if trainer is not None:
        joining = [attribution.make_frame(f"{HOME}/train.py", 40, "main")]
        threads = [
            {**threads[0], "frames": joining, "training": False},
            {**threads[1], "training": False},
            {"name": trainer, "ident": 3, "main": False, "training": True, "frames": main},
        ]
    return event(
        schema.EVENT_STACKS,
        wall,
        reason="stall",
        step=step,
        active_wall=active_wall,
        threads=threads,
    )


def test_stalled_single_run_names_the_main_thread_line():
    stuck = [heartbeat(T0 + 10 + 2 * i, 4, active_wall=T0 + 10) for i in range(1, 201)]
    events = [start(T0), stacks_event(T0 + 320, T0 + 10, 4)]
    series = series_of(stepping(0, 4) + stuck, events)
    now = T0 + 411
    assert rules.run_state(series, now) == ("stalled", pytest.approx(1.0))
    (finding,) = rules.find(run_data(series), now=now)
    assert (finding.kind, finding.first_step, finding.value) == ("stalled", 4, 400.0)
    assert finding.threshold == 300.0
    assert "No progress for 400 s at step 4" in finding.message
    assert f"at {HOME}/train.py:88 in wait_here" in finding.message
    assert "SIGUSR1 to process 100" in finding.message
    assert present.report_text(run_data(series), now=now) == [
        "  status: stalled 400 s in step 4 — at train.py:88 in wait_here"
    ]
    row = _body_is_strict_json(run_data(series), now)["workers"][0]
    assert row["stalled_for_s"] == 400.0 and row["stack"][1]["line"] == 88
    assert rules.find(run_data(series), Thresholds(stall_seconds=500), now=now) == []


def test_a_stall_of_a_run_trained_in_another_thread_quotes_that_thread():
    """The stretch began in thread `trainer` (its start event's "thread", its stacks marked
    "training"): the finding, the report and the events quote that thread, not the main one,
    which waits in `join` meanwhile."""
    stuck = [heartbeat(T0 + 10 + 2 * i, 4, active_wall=T0 + 10) for i in range(1, 201)]
    stacks = stacks_event(T0 + 320, T0 + 10, 4, trainer="trainer")
    series = series_of(stepping(0, 4) + stuck, [start(T0, thread="trainer"), stacks])
    now = T0 + 411
    (finding,) = rules.find(run_data(series), now=now)
    assert "the thread `trainer` is in Python, outside any step, at " in finding.message
    assert f"at {HOME}/train.py:88 in wait_here" in finding.message
    assert present.report_text(run_data(series), now=now) == [
        "  status: stalled 400 s in step 4 — at train.py:88 in wait_here"
    ]
    row = _body_is_strict_json(run_data(series), now)["workers"][0]
    assert row["stack"][1]["function"] == "wait_here"
    assert present.event_summary(json.loads(stacks[1].item())) == (
        "stacks written (stall at step 4): thread `trainer` at train.py:88 in wait_here"
    )
    # Older runs: no mark, no start "thread": the main thread.
    older = json.loads(stacks_event(T0 + 320, T0 + 10, 4)[1].item())
    assert present.event_summary(older) == (
        "stacks written (stall at step 4): main thread at train.py:88 in wait_here"
    )


def test_a_run_that_ended_cleanly_is_never_stalled():
    stuck = [heartbeat(T0 + 10 + 2 * i, 4, active_wall=T0 + 10) for i in range(1, 201)]
    series = series_of(stuck, [start(T0), end(T0 + 412, "finished", 4)])
    assert rules.run_state(series, T0 + 413).state == "finished"
    assert rules.find(run_data(series), now=T0 + 413) == []


def test_rerun_segment_decides_the_state_and_keeps_the_old_crash_listed():
    first = [heartbeat(T0 + 1 + 2 * i, i, pid=100) for i in range(4)]
    second = [heartbeat(T0 + 101 + 2 * i, i, pid=200) for i in range(11)]
    events = [
        start(T0, pid=100),
        end(T0 + 9, "crashed", 3, exception=fixture_exception(3)),
        start(T0 + 100, pid=200),
        end(T0 + 125, "finished", 10),
    ]
    series = series_of(first + second, events)
    assert series.start["pid"] == 200 and series.end["state"] == "finished"
    assert series.in_segment.tolist() == [False] * 4 + [True] * 11
    assert series.last_heartbeat()["step"] == 10
    assert [e["state"] for e in series.earlier_crashes] == ["crashed"]
    data = run_data(series)
    now = T0 + 1000
    assert rules.run_state(series, now).state == "finished"
    assert rules.find(data, now=now) == []
    assert present.report_text(data, now=now) == [
        "  status: finished",
        "    an earlier process of this run: crashed at step 3: InvalidArgumentError: input not "
        "finite : Tensor had NaN values",
    ]
    body = _body_is_strict_json(data, now)
    assert [e["earlier_process"] for e in body["events"]] == [True, True, False, False]
    assert not any(e["earlier_stretch"] for e in body["events"])  # pids 100 and 200
    assert [c["same_process"] for c in body["earlier_crashes"]] == [False]


def test_thread_crash_is_a_warning_and_the_run_goes_on():
    died = {
        "class": "ValueError",
        "module": "builtins",
        "message": "bad record 17",
        "frames": [attribution.make_frame(f"{HOME}/loader.py", 12, "load")],
        "step": 2,
    }
    events = [start(T0)] + [
        event(schema.EVENT_EXCEPTION, T0 + 5 + i, thread="loader", exception=died) for i in (0, 1)
    ]
    series = series_of(stepping(0, 5), events)
    now = T0 + 12
    assert rules.run_state(series, now).state == "running"
    (finding,) = rules.find(run_data(series), now=now)
    assert (finding.kind, finding.severity, finding.name, finding.count) == (
        "thread_crashed",
        "warning",
        "loader",
        2,
    )
    assert "Thread `loader` died of ValueError: bad record 17 (2 times)." in finding.message
    assert f"At {HOME}/loader.py:12 in load." in finding.message


def test_malformed_samples_are_noted_not_raised():
    bad_events = [
        (int((T0 + 2) * 1000), np.array(b"{not json")),
        (int((T0 + 3) * 1000), np.array(b'{"type": "bogus"}')),
        (int((T0 + 4) * 1000), np.array(b"\xff\xfe")),
        (int((T0 + 5) * 1000), np.array([b"a", b"b"])),
        (int((T0 + 6) * 1000), np.array(b"[1, 2]")),
    ]
    bad_heartbeat = (int((T0 + 7) * 1000), np.zeros(3))
    notes = []
    series = series_of(stepping(0, 2) + [bad_heartbeat], [start(T0)] + bad_events, notes=notes)
    assert [e["type"] for e in series.events] == ["start"]
    assert series.step.tolist() == [0, 1, 2]
    assert len(notes) == 2
    assert notes[0].startswith("1 status heartbeat(s) skipped: fewer than 8 numbers")
    assert notes[1].startswith("5 status event(s) skipped: not a JSON object with a known type")
    assert rules.run_state(series, T0 + 6).state == "running"


def test_events_without_wall_time_take_their_step():
    notes = []
    points = [(int(T0 * 1000), np.array(json.dumps({"type": "start", "pid": 7}).encode()))]
    (parsed,) = read.parse_events(points, notes)
    assert parsed["wall_time"] == T0 and notes == []


def test_run_without_status_tags_has_no_state_and_no_finding():
    other = {"inputs/batch_size": [(0, np.zeros((3, 2)))]}
    assert read.from_samples("run", other, []) is None
    assert read.from_samples("run", {schema.TAG_EVENT: [], schema.TAG_HEARTBEAT: []}, []) is None
    data = run_data(None)
    now = T0
    assert rules.run_state(None, now) == (None, None)
    assert rules.find(data, now=now) == []
    assert rules.root_cause(None, now) is None
    assert present.report_text(data, now=now) == []
    assert present.report_json(data, now=now) == {"status": None}
    assert present.live_fields(data, now) == {
        "status": {"state": None, "age_s": None, "worst": None}
    }
    body = present.status_body(data, now)
    assert (body["state"], body["workers"], body["events"]) == (None, [], [])


def test_thresholds_have_the_status_fields():
    assert (Thresholds().stall_seconds, Thresholds().silent_seconds) == (None, 60.0)
    assert Thresholds.from_overrides(["stall_seconds=15"]).stall_seconds == 15.0
    assert set(rules.FINDING_KINDS) == {
        "training_crashed",
        "stalled",
        "stopped_without_end",
        "thread_crashed",
        "training_interrupted",
        "worker_failed",
    }
    assert rules.FINDING_KINDS["stalled"]["thresholds"] == ("stall_seconds",)


# --- multi-worker jobs ---------------------------------------------------------------------


def job_workers(count=2):
    return [
        {
            "run": f"job/worker_{i}",
            "name": f"worker_{i}",
            "task_type": "worker",
            "task_index": i,
            "worker": i,
            "replicas": [i],
            "devices": [f"/job:worker/replica:0/task:{i}/device:CPU:0"],
        }
        for i in range(count)
    ]


def job_of(per_worker, notes=None):
    """The job's `RunData`-like: its `JobStatus` from each worker's `(heartbeats, events)` (None
    for a worker without status data)."""
    workers = job_workers(len(per_worker))
    member_runs = [
        types.SimpleNamespace(
            run=w["run"], status=None if data is None else series_of(*data, run=w["run"])
        )
        for w, data in zip(workers, per_worker, strict=True)
    ]
    notes = [] if notes is None else notes
    return run_data(read.merge_status("job", member_runs, workers, notes), "job", workers)


def worker_start(index, wall=T0):
    return start(wall, replicas=(index,), pid=100 + index, worker={"task_index": index})


def stalled_job():
    """Worker 1 stops before step 5 (in `wait_here`, line 88); worker 0 waits inside step 5."""
    waiting = [
        heartbeat(T0 + 11 + 2 * i, 5, active_wall=T0 + 11, in_step=1, pid=100) for i in range(201)
    ]
    stuck = [heartbeat(T0 + 10 + 2 * i, 4, active_wall=T0 + 10, pid=101) for i in range(1, 202)]
    worker_0 = (stepping(0, 4, pid=100) + waiting, [worker_start(0)])
    worker_1 = (
        stepping(0, 4, pid=101)[:-1] + stuck,
        [worker_start(1), stacks_event(T0 + 320, T0 + 10, 4)],
    )
    return job_of([worker_0, worker_1])


def test_stalled_job_names_the_worker_that_never_entered_the_step():
    data = stalled_job()
    now = T0 + 413
    assert rules.run_state(data.status, now).state == "stalled"
    (finding,) = rules.find(data, Thresholds(), now=now)
    assert (finding.kind, finding.name, finding.replicas, finding.first_step) == (
        "stalled",
        "worker_1",
        [1],
        5,
    )
    assert finding.cause == rules.ROOT_CAUSE
    message = finding.message
    assert message.startswith(
        "Root cause (first observed failure): No progress for 402 s in step 5"
    )
    assert "worker_0 (replica 0) waits inside step 5 (at the all-reduce)" in message
    assert "worker_1 (replica 1) never entered step 5 (its last step is 4)" in message
    assert f"its main thread at {HOME}/train.py:88 in wait_here" in message
    assert "worker_1 (replica 1) is the cause" in message
    assert present.report_text(data, now=now) == [
        "  status: stalled 402 s in step 5 — worker_1 never entered step 5 (waits at train.py:88 "
        "in wait_here); worker_0 waits inside step 5"
    ]
    cause = rules.root_cause(data.status, now)
    assert (cause["kind"], cause["worker"], cause["step"]) == ("stalled", "worker_1", 5)
    assert cause["wall_time"] == T0 + 10
    rows = _body_is_strict_json(data, now)["workers"]
    assert [(r["name"], r["state"], r["step"], r["in_step"]) for r in rows] == [
        ("worker_0", "stalled", 5, True),
        ("worker_1", "stalled", 4, False),
    ]
    assert rows[0]["stack"] is None and rows[1]["stack"][1]["function"] == "wait_here"
    assert rules.find(data, Thresholds(stall_seconds=500), now=now) == []


def sigkilled_job():
    """Worker 1 SIGKILLed in step 5 (last heartbeat T0 + 11); worker 0 raises UnavailableError
    naming it 10 s later."""
    parsed = attribution.parse_error_text(sigkill_message())
    unavailable = {
        "class": "UnavailableError",
        "module": "tensorflow.python.framework.errors_impl",
        "message": sigkill_message(),
        "frames": [attribution.make_frame("/tmp/exp/mw.py", 47, "<module>")],
        "defined_at": parsed["defined_at"],
        "node": parsed["node"],
        "replicas": [],
        "devices": parsed["devices"],
        "tasks": parsed["tasks"],
        "unhealthy_tasks": parsed["unhealthy_tasks"],
        "step": 5,
    }
    waiting = [heartbeat(T0 + 11 + 2 * i, 5, active_wall=T0 + 11, in_step=1) for i in range(5)]
    worker_0 = (
        stepping(0, 4, pid=100) + waiting,
        [worker_start(0), end(T0 + 21, "crashed", 5, exception=unavailable, how="exception")],
    )
    worker_1 = (stepping(0, 5, pid=101), [worker_start(1)])  # last heartbeat T0 + 11
    return job_of([worker_0, worker_1])


@pytest.mark.parametrize("now", [T0 + 25, T0 + 500])  # worker 1 named by worker 0, or silent
def test_sigkilled_worker_is_the_root_cause(now):
    data = sigkilled_job()
    assert rules.run_state(data.status, now).state == "crashed"
    lost, crash = rules.find(data, now=now)
    assert (lost.kind, lost.name, lost.replicas, lost.first_step) == (
        "stopped_without_end",
        "worker_1",
        [1],
        5,
    )
    assert lost.cause == rules.ROOT_CAUSE
    assert lost.message.startswith(
        "Root cause (first observed failure): Worker worker_1 (replica 1) stopped sending "
        "heartbeats at step 5"
    )
    assert "worker_0's error lists it among the tasks that stopped sending heartbeats" in (
        lost.message
    )
    assert (crash.kind, crash.name, crash.cause, crash.replicas) == (
        "training_crashed",
        "worker_0",
        None,
        [1],
    )
    assert crash.message.startswith("Worker worker_0 (replica 0) crashed at step 5 with Unavail")
    assert "It says worker_1 stopped sending heartbeats: this crash follows from that one" in (
        crash.message
    )
    cause = rules.root_cause(data.status, now)
    assert (cause["worker"], cause["kind"], cause["wall_time"]) == (
        "worker_1",
        "stopped_without_end",
        T0 + 11,
    )
    assert present.report_text(data, now=now) == [
        "  status: crashed at step 5 — worker_0: UnavailableError naming worker_1 (at mw.py:37 in "
        "step); root cause: worker_1 stopped sending heartbeats at step 5 with no end record"
    ]
    body = _body_is_strict_json(data, now)
    assert [r["state"] for r in body["workers"]] == ["crashed", "silent"]
    # Time without progress is a heartbeating process's: none for the ended and the lost one.
    assert [r["stalled_for_s"] for r in body["workers"]] == [None, None]
    assert body["root_cause"]["worker"] == "worker_1"
    worst = present.live_fields(data, now)["status"]["worst"]
    assert worst.startswith("Root cause (first observed failure): Worker worker_1")


def test_job_crash_before_the_kill_is_the_root_cause():
    """The earliest failure wins: a worker that crashed before another was lost."""
    exception = fixture_exception(3) | {"replicas": [0]}
    worker_0 = (stepping(0, 3, pid=100), [worker_start(0), end(T0 + 5, "crashed", 3, exception)])
    worker_1 = (stepping(0, 5, pid=101), [worker_start(1)])
    data = job_of([worker_0, worker_1])
    findings = rules.find(data, now=T0 + 600)
    assert [(f.kind, f.name, f.cause) for f in findings] == [
        ("training_crashed", "worker_0", rules.ROOT_CAUSE),  # step 3, first
        ("stopped_without_end", "worker_1", None),
    ]
    assert rules.root_cause(data.status, T0 + 600)["wall_time"] == T0 + 5
    assert present.report_text(data, now=T0 + 600) == [
        "  status: crashed at step 3 — worker_0: InvalidArgumentError on replica 0 (at crash2.py:9 "
        "in call)"
    ]


def test_worker_without_status_is_unknown_and_never_a_finding():
    notes = []
    finished = (stepping(0, 10, pid=100), [worker_start(0), end(T0 + 22, "finished", 10)])
    data = job_of([finished, None], notes)
    now = T0 + 10_000
    assert [s is None for s in data.status.members] == [False, True]
    assert notes == [
        "Workers worker_1 recorded no status (heartbeats and end records): their state is "
        "unknown (written by an older version of this plugin?)."
    ]
    assert rules.run_state(data.status, now).state == "finished"
    assert rules.find(data, now=now) == []
    rows = _body_is_strict_json(data, now)["workers"]
    assert [(r["name"], r["state"], r["step"]) for r in rows] == [
        ("worker_0", "finished", 10),
        ("worker_1", "unknown", None),
    ]
    assert present.report_text(data, now=now) == ["  status: finished"]
    members = [types.SimpleNamespace(run=w["run"], status=None) for w in job_workers()]
    assert read.merge_status("job", members, job_workers(), []) is None


def test_crash_before_the_first_step_says_so():
    died = {"class": "ValueError", "module": "builtins", "message": "bad shape", "step": None}
    series = series_of([], [start(T0), end(T0 + 3, "crashed", None, exception=died)])
    now = T0 + 5
    (finding,) = rules.find(run_data(series), now=now)
    assert finding.message.startswith(
        "Training crashed before the first step with ValueError: bad shape."
    )
    assert finding.first_step == 0
    assert rules.root_cause(series, now)["step"] is None
    assert present.report_text(run_data(series), now=now) == [
        "  status: crashed before the first step — ValueError"
    ]
    row = _body_is_strict_json(run_data(series), now)["workers"][0]
    assert (row["step"], row["last_heartbeat"], row["age_s"]) == (None, None, None)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
_ODD_EVENT = st.fixed_dictionaries(
    {"type": st.sampled_from(schema.EVENT_TYPES)},
    optional={
        key: _JSON
        for key in (
            "state",
            "step",
            "exception",
            "threads",
            "replicas",
            "findings",
            "pid",
            "heartbeat_secs",
            "active_wall",
            "thread",
            "reason",
        )
    },
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_ODD_EVENT, max_size=4), st.lists(_ODD_EVENT, max_size=4))
def test_rules_and_presenter_never_raise_on_odd_events(first, second):
    """Events of the right type whose fields hold anything JSON can: every view still answers
    (strict JSON) for a run and a job."""

    def points(documents):
        return [
            (int((T0 + 1 + i) * 1000), np.array(json.dumps(d).encode()))
            for i, d in enumerate(documents)
        ]

    stuck = [heartbeat(T0 + 2 + i, 2, active_wall=T0 + 1, in_step=i % 2) for i in range(3)]
    single = run_data(series_of(stuck, points(first)))
    job = job_of([(stuck, points(first)), (stepping(0, 1), points(second))])
    for data in (single, job):
        for now in (T0 + 3, T0 + 10_000):
            rules.find(data, Thresholds(stall_seconds=0.5), now=now)
            _body_is_strict_json(data, now)
            present.report_text(data, now=now)
            present.live_fields(data, now)
