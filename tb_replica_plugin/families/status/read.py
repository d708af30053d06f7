"""The status family read side: a run's heartbeats and events, and a job's per worker.

A run's `status/heartbeat` samples (float64 [8], the `schema.HB_*` slots) become arrays, its
`status/event` samples (one JSON object each) parsed dicts in time order. A process that writes
into a run dir that already holds a run starts a new *segment* with its "start" event: only the
latest segment decides how the run is going (`rules.run_state`); earlier segments' crashes stay
listed. A job keeps one series per worker (`JobStatus`); nothing is merged on a step axis.
Imports no TensorFlow.
"""

import dataclasses
import json

import numpy as np

from tb_replica_plugin.core import jobs
from tb_replica_plugin.families.status import schema

# A heartbeat this many seconds before its segment's "start" event still belongs to it (the
# heartbeat thread and the start event are written at about the same time).
SEGMENT_SLACK_SECONDS = 1.0
# Heartbeat slots read as integers.
_INTEGER_SLOTS = {"step": schema.HB_STEP, "completed": schema.HB_COMPLETED, "pid": schema.HB_PID}


@dataclasses.dataclass
class StatusSeries:
    """One run's heartbeats and status events.

    Attributes:
      run: the run name.
      wall: float64 [H], wall time of each heartbeat (seconds since the epoch), ascending.
      step: int64 [H], the last training step recorded (-1 before any).
      step_wall: float64 [H], wall time when `step` last changed.
      active_wall: float64 [H], wall time of the main thread's last sign of progress.
      in_step: bool [H], the main thread was inside a TensorFlow function call (a step).
      completed: int64 [H], the last step the host saw return (-1 where unknown).
      interval: float64 [H], seconds between heartbeats (the probe's `flush_secs`).
      pid: int64 [H], the writing process id (-1 where unknown).
      in_segment: bool [H], the heartbeat belongs to the latest segment.
      events: the parsed event dicts (each with "type" and a float "wall_time"), in time order.
      segment_index: index in `events` of the latest "start" event (0 when there is none).
    """

    run: str
    wall: np.ndarray
    step: np.ndarray
    step_wall: np.ndarray
    active_wall: np.ndarray
    in_step: np.ndarray
    completed: np.ndarray
    interval: np.ndarray
    pid: np.ndarray
    in_segment: np.ndarray
    events: list
    segment_index: int

    @property
    def start(self):
        """The latest "start" event (worker, replicas, devices, source, pid, host,
        heartbeat_secs, stall_secs), or None when the run has none."""
        events = self.segment_events
        return events[0] if events and events[0]["type"] == schema.EVENT_START else None

    @property
    def segment_events(self):
        """The events of the latest segment (from its "start" event on)."""
        return self.events[self.segment_index :]

    @property
    def end(self):
        """The latest segment's "end" event, or None while it runs (or when it was killed)."""
        return _last_of(self.segment_events, schema.EVENT_END)

    @property
    def stacks(self):
        """The latest segment's latest "stacks" event, or None."""
        return _last_of(self.segment_events, schema.EVENT_STACKS)

    @property
    def thread_exceptions(self):
        """The latest segment's "exception" events (threads other than the main one died)."""
        return [e for e in self.segment_events if e["type"] == schema.EVENT_EXCEPTION]

    @property
    def worker_failures(self):
        """The latest segment's worker failures under `ParameterServerStrategy` (the
        coordinator's "worker_failed" events), each with the worker's next recovery.

        Returns:
          `[{"worker", "device", "wall_time", "step", "error_class", "error", "put_back"
          (scheduled steps the coordinator put back in this outage: one per failure event),
          "retried" (the running count then), "recovered_wall", "recovered_step" (None while
          it had not come back)}]`, in time order; a failure event of a worker already down
          adds to that outage.
        """
        outages, down = [], {}
        for event in self.segment_events:
            worker = event.get("worker")
            if not _is_int(worker):
                continue
            if event["type"] == schema.EVENT_WORKER_FAILED:
                outage = down.get(worker)
                if outage is None:
                    outage = down[worker] = _outage(event)
                    outages.append(outage)
                else:
                    outage["put_back"] += 1
                outage["retried"] = event.get("retried")
            elif event["type"] == schema.EVENT_WORKER_RECOVERED and worker in down:
                outage = down.pop(worker)
                outage["recovered_wall"] = event["wall_time"]
                outage["recovered_step"] = event.get("step")
        return outages

    @property
    def earlier_crashes(self):
        """The "end" events of earlier segments whose state is crashed (time order)."""
        return [
            e
            for e in self.events[: self.segment_index]
            if e["type"] == schema.EVENT_END and e.get("state") == schema.END_CRASHED
        ]

    def last_heartbeat(self):
        """The latest segment's last heartbeat as a dict of its slots, or None if it has none.

        Returns:
          `{"wall", "step", "step_wall", "active_wall", "in_step", "completed", "interval",
          "pid"}` (floats, ints and a bool).
        """
        rows = np.flatnonzero(self.in_segment)
        if not rows.size:
            return None
        i = rows[-1]
        return {
            "wall": float(self.wall[i]),
            "step": int(self.step[i]),
            "step_wall": float(self.step_wall[i]),
            "active_wall": float(self.active_wall[i]),
            "in_step": bool(self.in_step[i]),
            "completed": int(self.completed[i]),
            "interval": float(self.interval[i]),
            "pid": int(self.pid[i]),
        }


@dataclasses.dataclass
class JobStatus:
    """The status of a multi-worker job: each worker's own series, side by side.

    Attributes:
      run: the job name.
      workers: the job's worker dicts (`RunData.workers`: "run", "name", "task_type",
        "task_index", "worker", "replicas", "devices"), in worker order.
      members: one `StatusSeries` per worker, or None for a worker without status data
        (written before this family): its state is unknown and it causes no finding.
    """

    run: str
    workers: list
    members: list


def _outage(event):
    """A `worker_failures` entry from its first "worker_failed" event."""
    return {
        "worker": event["worker"],
        "device": event.get("device"),
        "wall_time": event["wall_time"],
        "step": event.get("step"),
        "error_class": event.get("error_class"),
        "error": event.get("error"),
        "put_back": 1,
        "retried": event.get("retried"),
        "recovered_wall": None,
        "recovered_step": None,
    }


def _last_of(events, kind):
    for event in reversed(events):
        if event["type"] == kind:
            return event
    return None


def _event_document(value):
    """The JSON object of one `status/event` value (a 0-d array of bytes, or a string).

    Raises:
      ValueError: if it is not one UTF-8 JSON object with a known "type".
    """
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError("not a scalar")
    item = array.reshape(()).item()
    if isinstance(item, bytes):
        item = item.decode("utf-8")
    if not isinstance(item, str):
        raise ValueError("not a string")
    document = json.loads(item)
    if not isinstance(document, dict) or document.get("type") not in schema.EVENT_TYPES:
        raise ValueError("not an event object")
    return document


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, int | float) and not isinstance(value, bool)


def _ints(value):
    """The ints of a list (anything else dropped)."""
    return [v for v in value if _is_int(v)] if isinstance(value, list) else []


def _frames(value):
    """The FRAME dicts of a list: entries without a str file, an int line and a str function
    dropped, "user" a bool or left out (then judged from the file)."""
    if not isinstance(value, list):
        return []
    frames = []
    for frame in value:
        if not isinstance(frame, dict):
            continue
        file, line, function = frame.get("file"), frame.get("line"), frame.get("function")
        if isinstance(file, str) and _is_int(line) and isinstance(function, str):
            user = frame.get("user")
            kept = {"file": file, "line": line, "function": function}
            frames.append(kept | ({"user": user} if isinstance(user, bool) else {}))
    return frames


def _tasks(value):
    """The `{"task_type": str, "task_index": int}` dicts of a list."""
    if not isinstance(value, list):
        return []
    return [
        {"task_type": t["task_type"], "task_index": t["task_index"]}
        for t in value
        if isinstance(t, dict)
        and isinstance(t.get("task_type"), str)
        and _is_int(t.get("task_index"))
    ]


def _exception_object(value):
    """An EXCEPTION dict with fields of the schema's types, or None when it is not a dict."""
    if not isinstance(value, dict):
        return None
    text = {key: value.get(key) for key in ("class", "module", "node")}
    return {
        **{key: v if isinstance(v, str) else None for key, v in text.items()},
        "message": value.get("message") if isinstance(value.get("message"), str) else "",
        "frames": _frames(value.get("frames")),
        "defined_at": _frames(value.get("defined_at")),
        "replicas": _ints(value.get("replicas")),
        "devices": [d for d in value.get("devices") or [] if isinstance(d, str)]
        if isinstance(value.get("devices"), list)
        else [],
        "tasks": _tasks(value.get("tasks")),
        "unhealthy_tasks": _tasks(value.get("unhealthy_tasks")),
        "step": value.get("step") if _is_int(value.get("step")) else None,
    }


_SCALAR_FIELDS = {
    "step": _is_int,
    "pid": _is_int,
    "heartbeat_secs": _is_number,
    "stall_secs": _is_number,
    "active_wall": _is_number,
    "state": lambda value: isinstance(value, str),
}

# The fields of the coordinator's events about a worker (`schema.EVENT_WORKER_FAILED`, ...).
_WORKER_EVENTS = (schema.EVENT_WORKER_FAILED, schema.EVENT_WORKER_RECOVERED)
_WORKER_FIELDS = {
    "worker": _is_int,
    "retried": _is_int,
    "device": lambda value: isinstance(value, str),
    "error_class": lambda value: isinstance(value, str),
    "error": lambda value: isinstance(value, str),
}


def clean_event(document):
    """An event dict whose fields have the schema's types, so that the rules read them without
    checks: "exception" an EXCEPTION or None, a worker event's "worker" and "retried" ints and
    "device", "error_class" and "error" strs (or None), "threads" thread dicts with FRAME lists,
    "replicas" ints, "findings" dicts, "step" and "pid" ints or None, "heartbeat_secs",
    "stall_secs" and "active_wall" numbers or None, "state" a str or None."""
    document = dict(document)
    if "exception" in document:
        document["exception"] = _exception_object(document["exception"])
    if "threads" in document:
        threads = document["threads"] if isinstance(document["threads"], list) else []
        document["threads"] = [
            {**t, "main": t.get("main") is True, "frames": _frames(t.get("frames"))}
            for t in threads
            if isinstance(t, dict)
        ]
    if "replicas" in document:
        document["replicas"] = _ints(document["replicas"])
    if "findings" in document:
        findings = document["findings"] if isinstance(document["findings"], list) else []
        document["findings"] = [f for f in findings if isinstance(f, dict)]
    for key, valid in _SCALAR_FIELDS.items():
        if key in document and not valid(document[key]):
            document[key] = None
    if document.get("type") in _WORKER_EVENTS:
        for key, valid in _WORKER_FIELDS.items():
            document[key] = document.get(key) if valid(document.get(key)) else None
    return document


def parse_events(points, notes):
    """The status events of a run's `status/event` samples, in time order.

    Each event gets a float "wall_time" (from its TensorBoard step, wall-clock milliseconds,
    when it has none) and nested fields of the schema's types (`clean_event`). A sample that
    is not a JSON object with a known "type" is skipped; one note counts them.

    Args:
      points: `[(step, value), ...]` of the tag.
      notes: the run's notes list (appended to).

    Returns:
      A list of event dicts, sorted by "wall_time" (stable).

    Example:
      >>> parse_events([(1700000000000, np.array(b'{"type": "end", "state": "finished"}'))], [])
      [{'type': 'end', 'state': 'finished', 'wall_time': 1700000000.0}]
    """
    events, malformed = [], 0
    for step, value in points:
        try:
            document = _event_document(value)
        except (ValueError, UnicodeDecodeError):
            malformed += 1
            continue
        wall = document.get("wall_time")
        finite = _is_number(wall) and np.isfinite(wall)
        document["wall_time"] = float(wall) if finite else step / 1000.0
        events.append(clean_event(document))
    if malformed:
        notes.append(
            f"{malformed} status event(s) skipped: not a JSON object with a known type (a "
            "damaged event file, or written by a newer version of this plugin)."
        )
    return sorted(events, key=lambda e: e["wall_time"])


def heartbeat_table(points, notes):
    """float64 [H, HEARTBEAT_FIELDS] of a run's `status/heartbeat` samples, by wall time.

    A value with fewer than `schema.HEARTBEAT_FIELDS` numbers is skipped (one note counts
    them); extra trailing numbers (a newer layout) are ignored. NaN in a slot reads as -1.
    """
    rows, malformed = [], 0
    for _, value in points:
        row = np.asarray(value, dtype=np.float64).reshape(-1)
        if row.size < schema.HEARTBEAT_FIELDS:
            malformed += 1
            continue
        rows.append(row[: schema.HEARTBEAT_FIELDS])
    if malformed:
        notes.append(f"{malformed} status heartbeat(s) skipped: fewer than 8 numbers.")
    if not rows:
        return np.zeros((0, schema.HEARTBEAT_FIELDS))
    table = np.nan_to_num(np.stack(rows), nan=-1.0, posinf=-1.0, neginf=-1.0)
    return table[np.argsort(table[:, schema.HB_WALL], kind="stable")]


def _segment_mask(table, start):
    """bool [H]: the heartbeats written by the latest segment's process."""
    if start is None:
        return np.ones(len(table), dtype=bool)
    after = table[:, schema.HB_WALL] >= start["wall_time"] - SEGMENT_SLACK_SECONDS
    pid = start.get("pid")
    if pid is not None and pid >= 0:
        heartbeat_pid = table[:, schema.HB_PID]
        after &= (heartbeat_pid == pid) | (heartbeat_pid < 0)
    return after


def from_samples(run, samples, notes, needed=None):
    """The run's `StatusSeries`, or None when it has no status data.

    Args:
      run: the run name.
      samples: `{tag: [(step, numpy value), ...]}` sorted by step (as `reader.build_run` gives).
      notes: the run's notes list (malformed samples are skipped with a note).
      needed: unused (the status family reads no other family).

    Returns:
      A `StatusSeries`, or None when the run has no readable status sample (a run written
      before this family).

    Example:
      >>> from_samples("run", {"status/heartbeat": [(1700000000000, heartbeat)]}, []).step
      array([4])
    """
    table = heartbeat_table(samples.get(schema.TAG_HEARTBEAT, []), notes)
    events = parse_events(samples.get(schema.TAG_EVENT, []), notes)
    if not len(table) and not events:
        return None
    starts = [i for i, e in enumerate(events) if e["type"] == schema.EVENT_START]
    segment_index = starts[-1] if starts else 0
    start = events[segment_index] if starts else None
    integer = {name: table[:, slot].astype(np.int64) for name, slot in _INTEGER_SLOTS.items()}
    return StatusSeries(
        run=run,
        wall=table[:, schema.HB_WALL],
        step=integer["step"],
        step_wall=table[:, schema.HB_STEP_WALL],
        active_wall=table[:, schema.HB_ACTIVE_WALL],
        in_step=table[:, schema.HB_IN_STEP] == 1.0,
        completed=integer["completed"],
        interval=table[:, schema.HB_INTERVAL],
        pid=integer["pid"],
        in_segment=_segment_mask(table, start),
        events=events,
        segment_index=segment_index,
    )


def worker_identity(series):
    """`{"worker", "replicas", "devices"}` of a worker's run (its latest start event), else None.

    `registry.Family.worker_of`: a worker killed before any other family's first write is still
    known to be one (the start event is flushed at once).
    """
    start = None if series is None else series.start
    if not start or not isinstance(start.get("worker"), dict):
        return None
    return {
        "worker": start["worker"],
        "replicas": list(start.get("replicas") or []),
        "devices": list(start.get("devices") or []),
    }


STATUS_ABSENT_NOTE = (
    "Workers {names} recorded no status (heartbeats and end records): their state is unknown "
    "(written by an older version of this plugin?)."
)


def merge_status(job, member_runs, workers, notes):
    """The `JobStatus` of a multi-worker job: each worker's `StatusSeries` (or None).

    Args:
      job: the job name.
      member_runs: the workers' `RunData` (each with `.status` and `.run`).
      workers: the job's worker dicts (`RunData.workers`), in worker order.
      notes: the job's notes list (a note names the workers without status data).

    Returns:
      A `JobStatus` with one entry per worker of `workers`, or None when no worker has status
      data.

    Example:
      >>> [s is None for s in merge_status("job", members, workers, []).members]
      [False, False]
    """
    by_run = {member.run: member.status for member in member_runs}
    members = [by_run.get(worker["run"]) for worker in workers]
    have = [series is not None for series in members]
    if jobs.note_workers_without(workers, have, notes, STATUS_ABSENT_NOTE) is None:
        return None
    return JobStatus(run=job, workers=list(workers), members=members)
