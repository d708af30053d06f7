"""Findings of the status family: how a run is going and how it ended.

- `training_crashed` (error): the run's end record holds an exception: its class, first line,
  step, the replicas, devices and workers TensorFlow's text names, and the user's frame.
- `stalled` (error): no progress for more than `Thresholds.stall_seconds` while the process(es)
  still heartbeat. In a job: the furthest step N any worker entered, the workers that never
  entered it (the cause) with the top user frame of their main thread, and those waiting inside
  it (at the all-reduce).
- `stopped_without_end` (error): heartbeats stopped (older than `Thresholds.silent_seconds`, or
  three heartbeat intervals) with no end record: killed or lost. In a job also a worker another
  worker's exception lists among the tasks that "stopped sending heartbeats".
- `thread_crashed` (warning): a thread other than the main and training ones died of an
  exception.

In a job the earliest of the crashes, stalls and losses across workers is the root cause
("first observed failure", as torchelastic): its finding has `cause="root_cause"` and a message
that says so (`root_cause` gives it to the presenter). Only the latest process segment of a run
decides its state (`read.StatusSeries`). Runs without status data have no state and no finding.
The rules read time only from `now`: given `now`, they are deterministic.

Pure Python and numpy.
"""

import dataclasses
import time
from typing import NamedTuple

from tb_replica_plugin.analysis import Finding, Thresholds, replica_list_text, sort_findings
from tb_replica_plugin.families.status import attribution, schema
from tb_replica_plugin.families.status.read import JobStatus
from tb_replica_plugin.families.status.states import (
    RUNNING,
    SILENT,
    STALLED,
    at_step,
    crash_frame,
    crash_step,
    end_state,
    exception_class,
    frame_place,
    last_sign_of_life,
    members,
    named_workers,
    run_state,
    silent_limit,
    stall_frame,
    stalled_for,
    step_name,
    step_of,
    thread_label,
)

# `rules.run_state` and `rules.members` are the family's interface (they live in `states`).
__all__ = ["FINDING_KINDS", "find", "members", "root_cause", "run_state", "status_findings"]

VIEW = "status"
ROOT_CAUSE = "root_cause"
ROOT_CAUSE_PREFIX = "Root cause (first observed failure): "

# A job's failures at the same moment: which is the root cause first.
_ROOT_CAUSE_ORDER = ("stopped_without_end", "training_crashed", "stalled")

FINDING_KINDS = {
    "training_crashed": {
        "severity": "error",
        "thresholds": (),
        "summary": (
            "The run ended with an exception; the message names its class, step, the replicas, "
            "devices or workers TensorFlow's text names, and the user's frame."
        ),
    },
    "stalled": {
        "severity": "error",
        "thresholds": ("stall_seconds",),
        "summary": (
            "No progress for longer than the stall time while the processes still heartbeat; in "
            "a job, the worker that never entered the step the others wait in."
        ),
    },
    "stopped_without_end": {
        "severity": "error",
        "thresholds": ("silent_seconds",),
        "summary": (
            "Heartbeats stopped with no end record (killed, e.g. by the OOM killer, or lost), or "
            "another worker's error says this one stopped sending heartbeats."
        ),
    },
    "thread_crashed": {
        "severity": "warning",
        "thresholds": (),
        "summary": "A thread other than the training one died of an exception; training went on.",
    },
}


def status_finding(kind, run, step, message, **fields):
    """A `Finding` of this family at one step (-1: before the first, recorded as 0).

    Args:
      kind: one of `FINDING_KINDS` (its severity is the kind's).
      run: the run or job name.
      step: the step it happened at.
      message: the finding's message.
      **fields: `replicas` (sorted here), `name`, `value`, `threshold`, `count` (default 1),
        `last_step` (default `step`).

    Returns:
      The `Finding`, `view="status"`.
    """
    first = max(step, 0)
    return Finding(
        kind=kind,
        severity=FINDING_KINDS[kind]["severity"],
        run=run,
        first_step=first,
        last_step=max(fields.get("last_step", first), first),
        count=fields.get("count", 1),
        replicas=sorted(fields.get("replicas", [])),
        name=fields.get("name"),
        value=fields.get("value"),
        threshold=fields.get("threshold"),
        message=message,
        view=VIEW,
    )


def _sentence(text):
    """`text` without trailing punctuation, then one full stop."""
    return text.rstrip(" .:;,") + "."


def _crash_hint(exception, lost_names):
    """What to look at, from the exception's class and text."""
    text = f"{exception_class(exception)} {exception.get('message') or ''}"
    if lost_names or exception.get("unhealthy_tasks"):
        who = " and ".join(lost_names) or "another worker"
        return (
            f"It says {who} stopped sending heartbeats: this crash follows from that one. Look "
            f"at {who}'s own log and its host (the OOM killer in `dmesg`, a preemption)."
        )
    if "not finite" in text or "CheckNumerics" in text or "NaN" in text:
        return (
            "A NaN or Inf reached a numeric check: look at what that replica was fed at that "
            "step (the gradients view shows NaN/Inf per replica) and at that line."
        )
    if "ResourceExhausted" in text or "out of memory" in text.lower() or "OOM" in text:
        return "A device ran out of memory: lower the per-replica batch size or the model size."
    if "Collective ops is aborted" in text or "DeadlineExceeded" in text:
        return "A collective did not complete: look at the other workers' status and logs."
    return "Look at that line, and at the full message and traceback in the status view."


def _names_text(exception, member, everyone):
    """ " TensorFlow's text names replica 1 (node `...`)." or ""."""
    parts = []
    replicas = exception.get("replicas") or []
    if replicas:
        plural = "s" if len(replicas) > 1 else ""
        parts.append(f"replica{plural} {replica_list_text(replicas)}")
    named = named_workers(exception.get("tasks"), everyone, exclude=member.name)
    parts.extend(named)
    devices = exception.get("devices") or []
    if devices and not parts:
        parts.append(f"device {devices[0]}")
    node = exception.get("node")
    node_text = f" (node `{node}`)" if node else ""
    if not parts:
        return f" The failing op is `{node}`." if node else ""
    return f" TensorFlow's text names {' and '.join(parts)}{node_text}."


def _frame_text(exception):
    frame = crash_frame(exception)
    if frame is None:
        return ""
    if frame in (exception.get("defined_at") or []):
        return f" The failing op was created in your code at {frame_place(frame)}."
    return f" It was raised from your code at {frame_place(frame)}."


def _subject(member):
    return "Training" if member.name is None else f"Worker {member.label}"


def crash_finding(run, member, everyone):
    """The `training_crashed` finding of a member whose end record says crashed, or None."""
    end = member.series.end if member.series is not None else None
    if end is None or end_state(end) != schema.END_CRASHED:
        return None
    exception = end.get("exception") or {}
    step = crash_step(member)
    lost = named_workers(exception.get("unhealthy_tasks"), everyone, exclude=member.name)
    if exception:
        first = attribution.first_line(exception.get("message") or "")
        what = f"{exception_class(exception)}: {first}" if first else exception_class(exception)
        details = (
            _names_text(exception, member, everyone)
            + _frame_text(exception)
            + " "
            + _crash_hint(exception, lost)
        )
    else:
        what, details = "no exception recorded", " Look at the process's own log."
    replicas = exception.get("replicas") or [
        r for m in everyone if m.name in lost for r in m.replicas
    ]
    return status_finding(
        "training_crashed",
        run,
        step,
        f"{_subject(member)} crashed {at_step(step)} with {_sentence(what)}{details}",
        replicas=replicas or (member.replicas if member.name is not None else []),
        name=member.name,
    )


def _single_stall(run, member, thresholds):
    heartbeat = member.heartbeat
    seconds = stalled_for(heartbeat)
    step = step_of(member)
    frame = stall_frame(member)
    thread = thread_label(member.series)
    if heartbeat["in_step"]:
        what = (
            f"the {thread} has been inside {step_name(step)} (a TensorFlow call) all along: a "
            "collective waiting for a peer that never joins, an input pipeline that never "
            "yields, or an op that never returns"
        )
    else:
        what = f"the {thread} is in Python, outside any step"
    where = f", at {frame_place(frame)}" if frame else ""
    look = f"Look at {frame_place(frame)}" if frame else "Look at its stack in the status view"
    message = (
        f"No progress for {seconds:.0f} s {at_step(step)} while the process still heartbeats: "
        f"{what}{where}. {look}; SIGUSR1 to process {heartbeat['pid']} writes every thread's "
        "stack again. If a step, an evaluation or a checkpoint really takes this long, raise "
        "Thresholds.stall_seconds."
    )
    return status_finding(
        "stalled",
        run,
        step,
        message,
        replicas=member.replicas,
        value=round(seconds, 3),
        threshold=thresholds.stall_seconds,
    )


def _labels(group):
    return " and ".join(m.label for m in group)


def _behind_text(member, step):
    """How a worker behind step N is described in a job's stall finding."""
    last = member.heartbeat["step"]
    recorded = f"its last step is {last}" if last >= 0 else "it recorded no step"
    text = f"{member.label} never entered {step_name(step)} ({recorded})"
    if member.state == SILENT:
        return text + " and stopped sending heartbeats"
    if member.state not in (RUNNING, STALLED):
        return text + f": it ended ({member.state})"
    frame = stall_frame(member)
    where = f", its {thread_label(member.series)} at {frame_place(frame)}" if frame else ""
    return text + where


def _stall_advice(step, cause, behind):
    if cause:
        return (
            f"{_labels(cause)} {'is' if len(cause) == 1 else 'are'} the cause: look at why it "
            f"does not go on with {step_name(step)} (that line, an input pipeline that ends "
            "earlier on "
            "one worker, a condition that differs per worker)."
        )
    if behind:
        return "The workers behind stopped or ended: their findings say why."
    return (
        f"Every worker is inside {step_name(step)} and none progresses: a collective that does "
        "not "
        "complete (collectives that differ across workers, a peer outside this job)."
    )


@dataclasses.dataclass
class StallRoles:
    """Who is where in a stalled job (see `stall_roles`)."""

    step: int
    seconds: float
    waiting: list
    behind: list
    idle: list
    cause: list


def stall_roles(everyone):
    """The roles of a job's workers in a stall, or None when no heartbeating worker is stalled.

    N (`step`) is the furthest step any worker entered (its HB_STEP). `waiting`: heartbeating
    workers inside step N (at the all-reduce); `behind`: workers whose last step is below N
    (whatever their state); `idle`: stalled workers at N outside the step; `cause`: the
    heartbeating workers behind, else (nobody behind) the idle ones. `seconds`: the longest
    time without progress of a heartbeating worker.
    """
    known = [m for m in everyone if m.heartbeat is not None]
    alive = [m for m in known if m.state in (RUNNING, STALLED)]
    if not any(m.state == STALLED for m in alive):
        return None
    step = max(m.heartbeat["step"] for m in known)
    at_step = [m for m in alive if m.heartbeat["step"] == step]
    behind = [m for m in known if m.heartbeat["step"] < step]
    idle = [m for m in at_step if not m.heartbeat["in_step"] and m.state == STALLED]
    return StallRoles(
        step=step,
        seconds=max(stalled_for(m.heartbeat) for m in alive),
        waiting=[m for m in at_step if m.heartbeat["in_step"]],
        behind=behind,
        idle=idle,
        cause=[m for m in behind if m in alive] or ([] if behind else idle),
    )


def _stall_parts(roles):
    parts = []
    if roles.waiting:
        verb = "waits" if len(roles.waiting) == 1 else "wait"
        parts.append(
            f"{_labels(roles.waiting)} {verb} inside {step_name(roles.step)} (at the all-reduce)"
        )
    parts.extend(_behind_text(m, roles.step) for m in roles.behind)
    for member in roles.idle:
        frame = stall_frame(member)
        where = f", its {thread_label(member.series)} at {frame_place(frame)}" if frame else ""
        parts.append(f"{member.label} is outside {step_name(roles.step)}{where}")
    return parts


def job_stall(run, everyone, roles, thresholds):
    """The `stalled` finding of a job and the root-cause time of its cause (or None).

    Args:
      run: the job name.
      everyone: the job's `Member`s.
      roles: their `stall_roles`.
      thresholds: the `Thresholds` applied.

    Returns:
      `(finding, wall_time)`. The cause's time is its last sign of progress; a stall whose workers
    behind all stopped or ended has no time of its own (their loss or crash is the root cause);
    with nobody behind nor idle, the earliest last progress of a stalled worker.
    """
    stalled = [m for m in everyone if m.state == STALLED]
    blamed = roles.cause or roles.behind or stalled
    message = (
        f"No progress for {roles.seconds:.0f} s in {step_name(roles.step)} while the workers "
        f"still heartbeat: {'; '.join(_stall_parts(roles))}. "
        f"{_stall_advice(roles.step, roles.cause, roles.behind)} Synchronous workers wait for "
        "each other for ever; tf.distribute.experimental.CommunicationOptions(timeout_seconds="
        "...) makes them fail instead."
    )
    finding = status_finding(
        "stalled",
        run,
        roles.step,
        message,
        replicas=[r for m in blamed for r in m.replicas],
        name=blamed[0].name,
        value=round(roles.seconds, 3),
        threshold=thresholds.stall_seconds,
    )
    if roles.behind and not roles.cause:
        return finding, None
    return finding, min(m.heartbeat["active_wall"] for m in roles.cause or stalled)


def lost_finding(run, member, now, thresholds):
    """The `stopped_without_end` finding of a member whose state is silent, or None."""
    if member.state != SILENT or member.series is None:
        return None
    last = last_sign_of_life(member.series, member.heartbeat)
    age = None if last is None else max(0.0, now - last)
    step = step_of(member)
    ago = f" ({age:.0f} s ago)" if age is not None else ""
    named = ""
    if member.lost_per:
        who = " and ".join(member.lost_per)
        named = f", and {who}'s error lists it among the tasks that stopped sending heartbeats"
    subject = "The run" if member.name is None else f"Worker {member.label}"
    message = (
        f"{subject} stopped sending heartbeats {at_step(step)}{ago} with no end record{named}: "
        "its process was killed (the OOM killer, a preemption or eviction, SIGKILL) or its host "
        "was lost; a clean end, an exception or Ctrl-C would have written one. Look at the "
        "host's logs (`dmesg` for the OOM killer) and the scheduler's events."
    )
    return status_finding(
        "stopped_without_end",
        run,
        step,
        message,
        replicas=member.replicas,
        name=member.name,
        value=None if age is None else round(age, 3),
        threshold=silent_limit(member.series, member.heartbeat, thresholds),
    )


def thread_findings(run, member):
    """`thread_crashed` findings of a member: one per thread and exception class."""
    groups = {}
    for event in member.series.thread_exceptions if member.series is not None else []:
        exception = event.get("exception") or {}
        key = (str(event.get("thread")), exception_class(exception))
        groups.setdefault(key, []).append(exception)
    findings = []
    for (thread, name), exceptions in groups.items():
        exception = exceptions[0]
        first = attribution.first_line(exception.get("message") or "")
        frame = attribution.user_frame(exception.get("frames") or [])
        step = step_of(member, exception.get("step"))
        times = f" ({len(exceptions)} times)" if len(exceptions) > 1 else ""
        on = "" if member.name is None else f" on worker {member.label}"
        died = _sentence((f"{name}: {first}" if first else name).rstrip(" .:;,") + times)
        at = f" At {frame_place(frame)}." if frame else ""
        findings.append(
            status_finding(
                "thread_crashed",
                run,
                step,
                f"Thread `{thread}`{on} died of {died}{at} Training went on without it; a "
                "background thread that dies (a data loader, a callback's worker) can leave "
                "work undone or the main loop waiting: look at that line.",
                last_step=step_of(member, exceptions[-1].get("step")),
                count=len(exceptions),
                replicas=member.replicas if member.name is not None else [],
                name=thread,
            )
        )
    return findings


class _Candidate(NamedTuple):
    """A failure that may be a job's root cause: when it was first observed, and by whom."""

    wall_time: float
    order: int
    worker: str | None
    step: int
    finding: Finding


def _evaluate(status, now, thresholds):
    """`(findings, candidates)` of a run or job: every status finding, and the crashes, stalls
    and losses with the time each was first observed (root-cause candidates)."""
    everyone = members(status, now, thresholds)
    findings, candidates = [], []

    def add(finding, wall_time, step):
        findings.append(finding)
        if wall_time is not None:
            order = _ROOT_CAUSE_ORDER.index(finding.kind)
            candidates.append(_Candidate(float(wall_time), order, finding.name, step, finding))

    for member in everyone:
        crash = crash_finding(status.run, member, everyone)
        if crash is not None:
            add(crash, member.series.end["wall_time"], crash_step(member))
        lost = lost_finding(status.run, member, now, thresholds)
        if lost is not None:
            add(lost, last_sign_of_life(member.series, member.heartbeat), step_of(member))
        findings.extend(thread_findings(status.run, member))
    roles = stall_roles(everyone) if isinstance(status, JobStatus) else None
    if roles is not None:
        add(*job_stall(status.run, everyone, roles, thresholds), roles.step)
    elif not isinstance(status, JobStatus) and everyone[0].state == STALLED:
        stall = _single_stall(status.run, everyone[0], thresholds)
        add(stall, everyone[0].heartbeat["active_wall"], step_of(everyone[0]))
    return findings, sorted(candidates, key=lambda c: (c.wall_time, c.order, c.worker or ""))


def status_findings(status, now, thresholds=Thresholds()):
    """Every status finding of a `read.StatusSeries` or `read.JobStatus` at time `now`.

    In a job, the earliest failure (`root_cause`) is marked: `cause="root_cause"` and a message
    starting "Root cause (first observed failure): ".

    Returns:
      A list of `Finding`, most severe first.
    """
    if status is None:
        return []
    findings, candidates = _evaluate(status, now, thresholds)
    if isinstance(status, JobStatus) and candidates:
        first = candidates[0].finding
        first.cause = ROOT_CAUSE
        first.message = ROOT_CAUSE_PREFIX + first.message
    return sort_findings(findings)


def root_cause(status, now, thresholds=Thresholds()):
    """The first observed failure of a job (or the failure of a run), for the presenter.

    The earliest of the crashes (their end record's time), stalls (the cause worker's last sign
    of progress) and losses (the last heartbeat) across workers; at the same time a loss comes
    before a crash, a crash before a stall.

    Args:
      status: a `read.JobStatus` or `read.StatusSeries` (or None).
      now: the time to judge at (seconds since the epoch).
      thresholds: the `Thresholds` to apply.

    Returns:
      `{"kind", "worker" (None for a single run), "replicas", "step" (None before the first
      step), "wall_time", "message"}`, or None when nothing failed.

    Example:
      >>> root_cause(job_status, now)["worker"]   # worker 1 SIGKILLed, then worker 0 crashed
      'worker_1'
    """
    if status is None:
        return None
    _, candidates = _evaluate(status, now, thresholds)
    if not candidates:
        return None
    first = candidates[0]
    return {
        "kind": first.finding.kind,
        "worker": first.worker,
        "replicas": list(first.finding.replicas),
        "step": None if first.step < 0 else first.step,
        "wall_time": first.wall_time,
        "message": first.finding.message,
    }


def find(run_data, thresholds=Thresholds(), now=None):
    """The status findings of a run or job (`status_findings` of `run_data.status`).

    Args:
      run_data: a `reader.RunData` (its `status`: a `StatusSeries`, a `JobStatus` or None).
      thresholds: the `Thresholds` to apply.
      now: the time to judge at (seconds since the epoch); default `time.time()`.

    Returns:
      A list of `Finding` (none for a run without status data).

    Example:
      >>> [f.kind for f in find(run_data, now=heartbeat_wall + 600)]   # killed 10 min ago
      ['stopped_without_end']
    """
    status = getattr(run_data, "status", None)
    return status_findings(status, time.time() if now is None else now, thresholds)
