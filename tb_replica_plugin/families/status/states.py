"""How a run of the status family is going: its state, and each process of a run or job.

`run_state` decides a run's or job's state from its `read.StatusSeries` or `read.JobStatus` at a
given time; `members` gives the rules and the presenter one `Member` per process (a run, or each
worker of a job) with its state, last heartbeat and the workers that say it stopped. Also the
small helpers both use (steps and frames in words). Pure Python and numpy.
"""

import dataclasses
import os
from typing import NamedTuple

from tb_replica_plugin.analysis import Thresholds, replica_list_text
from tb_replica_plugin.families.status import attribution, schema
from tb_replica_plugin.families.status.read import JobStatus

# The stall time of a run that recorded none (heartbeat off, or written before `stall_secs` was
# recorded), when the reader sets none (`Thresholds.stall_seconds` None).
UNRECORDED_STALL_SECONDS = 300.0

RUNNING = "running"
STALLED = "stalled"
SILENT = "silent"
UNKNOWN = "unknown"
# The states of a run, worst first (a job's state is its worst worker's).
STATES = (
    schema.END_CRASHED,
    STALLED,
    SILENT,
    schema.END_HALTED,
    schema.END_INTERRUPTED,
    RUNNING,
    schema.END_FINISHED,
)


class RunState(NamedTuple):
    """A run's state ("running", "finished", "halted", "crashed", "interrupted", "stalled",
    "silent"; None without status data) and the age of its last heartbeat in seconds."""

    state: str | None
    age_s: float | None


@dataclasses.dataclass
class Member:
    """One process of a run or job as the rules see it.

    Attributes:
      name: the worker name in a job, None for a single run.
      replicas: its global replica ids.
      task: `(task_type, task_index)` in a job, else None.
      series: its `read.StatusSeries`, or None (no status data: state "unknown").
      state: its state (`run_state`), "unknown" without series.
      age_s: seconds since its last heartbeat (None without one).
      heartbeat: its last heartbeat (`StatusSeries.last_heartbeat`), or None.
      lost_per: names of the workers whose exception lists it as unhealthy.
      stalled: whether its last heartbeat (no end record) shows no progress for longer than its
        `stall_limit`: true for a stalled process, and for a silent one that stalled before its
        heartbeats stopped.
    """

    name: str | None
    replicas: list
    task: tuple | None
    series: object
    state: str
    age_s: float | None
    heartbeat: dict | None
    lost_per: list = dataclasses.field(default_factory=list)
    stalled: bool = False

    @property
    def label(self):
        """ "worker_1 (replica 1)", or "the run"."""
        if self.name is None:
            return "the run"
        if not self.replicas:
            return self.name
        plural = "s" if len(self.replicas) > 1 else ""
        return f"{self.name} (replica{plural} {replica_list_text(self.replicas)})"


def stalled_for(heartbeat):
    """Seconds without progress at a heartbeat (its wall minus its last sign of progress)."""
    if heartbeat is None or heartbeat["active_wall"] < 0:
        return 0.0
    return max(0.0, heartbeat["wall"] - heartbeat["active_wall"])


def stall_limit(series, thresholds):
    """Seconds without progress after which a run is stalled: `thresholds.stall_seconds` when the
    reader sets it, else the `stall_secs` the run recorded in its start event (when its probe
    writes the stacks), else `UNRECORDED_STALL_SECONDS`."""
    if thresholds.stall_seconds is not None:
        return float(thresholds.stall_seconds)
    recorded = (series.start or {}).get("stall_secs") if series is not None else None
    if isinstance(recorded, int | float) and not isinstance(recorded, bool) and recorded > 0:
        return float(recorded)
    return UNRECORDED_STALL_SECONDS


def heartbeat_off(series):
    """Whether a run's latest segment was written with `heartbeat=False`: its start event says
    so (`heartbeat_secs` null) and it holds no heartbeat. Its liveness is unknown until its end
    record: the absence of heartbeats proves nothing."""
    start = series.start if series is not None else None
    if not start or "heartbeat_secs" not in start or start["heartbeat_secs"] is not None:
        return False
    return series.last_heartbeat() is None


def stalled_at_last_heartbeat(series, heartbeat, thresholds):
    """Whether a run without end record showed no progress for longer than its `stall_limit` at
    its last heartbeat (its own times, not the reader's clock)."""
    if series is None or series.end is not None or heartbeat is None:
        return False
    return stalled_for(heartbeat) > stall_limit(series, thresholds)


def silent_limit(series, heartbeat, thresholds):
    """Seconds after the last heartbeat when a run without end record counts as stopped."""
    interval = heartbeat["interval"] if heartbeat else -1.0
    if interval <= 0 and series.start:
        interval = float(series.start.get("heartbeat_secs") or 0.0)
    return max(thresholds.silent_seconds, 3.0 * max(interval, 0.0))


def end_state(end):
    """The state an "end" event records (crashed when its state is unknown but it holds an
    exception, else finished)."""
    state = end.get("state")
    if state in schema.END_STATES:
        return state
    return schema.END_CRASHED if end.get("exception") else schema.END_FINISHED


def last_sign_of_life(series, heartbeat):
    """Wall time of the latest segment's last heartbeat, else of its last event (or None)."""
    if heartbeat is not None:
        return heartbeat["wall"]
    events = series.segment_events
    return events[-1]["wall_time"] if events else None


def series_state(series, now, thresholds=Thresholds()):
    """The `RunState` of one run's `StatusSeries` (see `run_state`)."""
    if series is None:
        return RunState(None, None)
    heartbeat = series.last_heartbeat()
    age = None if heartbeat is None else max(0.0, now - heartbeat["wall"])
    end = series.end
    if end is not None:
        return RunState(end_state(end), age)
    if heartbeat_off(series):
        return RunState(RUNNING, None)
    last = last_sign_of_life(series, heartbeat)
    if last is not None and now - last > silent_limit(series, heartbeat, thresholds):
        return RunState(SILENT, age)
    if stalled_at_last_heartbeat(series, heartbeat, thresholds):
        return RunState(STALLED, age)
    return RunState(RUNNING, age)


def run_state(status, now, thresholds=Thresholds()):
    """How a run (or job) is going at time `now`.

    The latest segment's end record decides ("finished", "crashed", "halted",
    "interrupted"): a run that ended is never stalled. A run written with `heartbeat=False` is
    "running" until its end record (no heartbeat proves nothing). Else its last heartbeat: older
    than `max(thresholds.silent_seconds, 3 * heartbeat interval)` at `now` is "silent" (stopped
    with no end record: killed or lost, whether or not it had stalled before); else no progress
    for more than its `stall_limit` (heartbeat wall minus its last sign of progress, from the
    data, not from `now`) is "stalled"; else "running". A job's state is its worst worker's
    (`STATES` order; a worker another one names as unhealthy is "silent"), its age its most
    recent heartbeat's.

    Args:
      status: a `read.StatusSeries`, a `read.JobStatus`, or None.
      now: the time to judge at (seconds since the epoch).
      thresholds: the `Thresholds` to apply.

    Returns:
      A `RunState(state, age_s)`; `(None, None)` without status data.

    Example:
      >>> run_state(series, now=series.wall[-1] + 5)
      RunState(state='running', age_s=5.0)
    """
    if not isinstance(status, JobStatus):
        return series_state(status, now, thresholds)
    known = [m for m in members(status, now, thresholds) if m.state != UNKNOWN]
    if not known:
        return RunState(None, None)
    worst = min(known, key=lambda m: STATES.index(m.state) if m.state in STATES else 0)
    ages = [m.age_s for m in known if m.age_s is not None]
    return RunState(worst.state, min(ages) if ages else None)


def _member(name, replicas, task, series, now, thresholds):
    state = series_state(series, now, thresholds)
    heartbeat = None if series is None else series.last_heartbeat()
    return Member(
        name=name,
        replicas=list(replicas),
        task=task,
        series=series,
        state=UNKNOWN if series is None else state.state,
        age_s=state.age_s,
        heartbeat=heartbeat,
        stalled=stalled_at_last_heartbeat(series, heartbeat, thresholds),
    )


def members(status, now, thresholds=Thresholds()):
    """The `Member`s of a run (one) or job (one per worker, in worker order).

    In a job, a worker without an end record that another worker's exception lists among the
    tasks that stopped sending heartbeats is "silent" whatever `now` is.
    """
    if not isinstance(status, JobStatus):
        start = status.start or {}
        return [_member(None, start.get("replicas") or [], None, status, now, thresholds)]
    found = [
        _member(
            worker["name"],
            worker.get("replicas") or [],
            (worker.get("task_type"), worker.get("task_index")),
            series,
            now,
            thresholds,
        )
        for worker, series in zip(status.workers, status.members, strict=True)
    ]
    by_task = {m.task: m for m in found}
    for member in found:
        exception = _end_exception(member)
        for task in (exception or {}).get("unhealthy_tasks") or []:
            lost = by_task.get((task.get("task_type"), task.get("task_index")))
            if lost is not None and lost is not member:
                lost.lost_per.append(member.name)
    for member in found:
        if member.lost_per and member.series is not None and member.series.end is None:
            member.state = SILENT
    return found


def _end_exception(member):
    if member.series is None or member.series.end is None:
        return None
    return member.series.end.get("exception")


def frame_place(frame, short=False):
    """ "/x/train.py:9 in call" (`short`: "train.py:9 in call"), or "" without a frame."""
    if not frame:
        return ""
    file = os.path.basename(frame["file"]) if short else frame["file"]
    return f"{file}:{frame['line']} in {frame['function']}"


def exception_class(exception):
    """The class name of an EXCEPTION ("an exception" when it has none)."""
    return (exception or {}).get("class") or "an exception"


def crash_frame(exception):
    """The user frame of an EXCEPTION: the innermost user frame where TensorFlow says the
    failing op was defined, else the traceback's, else None."""
    if not exception:
        return None
    for frames in (exception.get("defined_at"), exception.get("frames")):
        frame = attribution.user_frame(frames or [])
        if frame is not None:
            return frame
    return None


def step_of(member, *candidates):
    """The first of `candidates` that is a step (an int >= 0), else the step of the member's
    last heartbeat; -1 when none is known (before the first step)."""
    for step in candidates:
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return step
    return member.heartbeat["step"] if member.heartbeat else -1


def crash_step(member):
    """The step a member's crash happened at: its exception's, its end record's, else its last
    heartbeat's (-1 when unknown)."""
    end = member.series.end or {}
    return step_of(member, (end.get("exception") or {}).get("step"), end.get("step"))


def stopped_at(member, step):
    """Where a member stopped sending heartbeats, as known: " at step 5"; for an unknown step
    (-1) " after a last heartbeat that recorded no step" (steps may have run since it), or
    " after its start (no heartbeat recorded)"."""
    if step >= 0:
        return f" at step {step}"
    if member.heartbeat is not None:
        return " after a last heartbeat that recorded no step"
    return " after its start (no heartbeat recorded)"


def step_name(step):
    """ "step 5", or "the first step" for an unknown step (-1)."""
    return f"step {step}" if step >= 0 else "the first step"


def at_step(step):
    """ "at step 5", or "before the first step" for an unknown step (-1)."""
    return f"at step {step}" if step >= 0 else "before the first step"


def named_workers(tasks, everyone, exclude=None):
    """Worker names of the tasks an exception names (in a job), in task order."""
    by_task = {m.task: m.name for m in everyone if m.task is not None}
    names = []
    for task in tasks or []:
        name = by_task.get((task.get("task_type"), task.get("task_index")))
        if name is not None and name != exclude and name not in names:
            names.append(name)
    return names


def training_thread(stacks):
    """The training thread of a "stacks" event (the one marked "training"; in events written
    before that mark, the main thread), or None."""
    threads = (stacks or {}).get("threads") or []
    for mark in ("training", "main"):
        for thread in threads:
            if thread.get(mark):
                return thread
    return None


def training_thread_frames(stacks):
    """The frames of the training thread in a "stacks" event (outermost first), or None."""
    thread = training_thread(stacks)
    return None if thread is None else thread.get("frames") or []


def thread_label(series=None, name=None):
    """How messages name a training thread: "main thread", or "thread `name`" when a run's
    stretch began in another one (`series`' start event's "thread", or `name` itself)."""
    if series is not None:
        name = (series.start or {}).get("thread")
    return f"thread `{name}`" if name else "main thread"


def stall_frame(member):
    """The top user frame (else the innermost frame) of a member's training thread in its latest
    "stacks" event of the current stall (same last sign of progress), or None."""
    series, heartbeat = member.series, member.heartbeat
    stacks = series.stacks if series is not None else None
    if stacks is None or heartbeat is None:
        return None
    active = stacks.get("active_wall")
    if isinstance(active, int | float) and abs(active - heartbeat["active_wall"]) > 1.0:
        return None  # the stacks of an earlier stall
    frames = training_thread_frames(stacks) or []
    return attribution.user_frame(frames) or (frames[-1] if frames else None)
