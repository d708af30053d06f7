"""Findings of the status family: how a run is going and how it ended.

- `training_crashed` (error): the run's end record holds an exception: its class, first line,
  step, the replicas, devices and workers TensorFlow's text names, and the user's frame.
- `stalled` (error): a last heartbeat that shows no progress for longer than the run's stall time
  (`states.stall_limit`: `Thresholds.stall_seconds`, else the run's own `stall_secs`), whether
  the process(es) still heartbeat or stopped since (killed while stalled). In a job: the
  furthest step N any worker entered, the workers that never entered it (the cause) with the
  top user frame of their training thread, and those waiting inside it (at the all-reduce).
- `stopped_without_end` (error): heartbeats stopped (older than `Thresholds.silent_seconds`, or
  three heartbeat intervals) with no end record: killed or lost. In a job also a worker another
  worker's exception lists among the tasks that "stopped sending heartbeats".
- `thread_crashed` (warning): a thread other than the main and training ones died of an
  exception.
- `training_interrupted` (warning): in a job whose other workers failed, a worker that ended
  interrupted (KeyboardInterrupt: Ctrl-C, SIGINT).
- `worker_failed` (error; warning when the worker came back): under `ParameterServerStrategy`,
  a worker the coordinator saw fail, the steps it put back and when the worker came back
  (`pss_workers`).

In a job the earliest of the crashes, interruptions, stalls and losses across workers is the
root cause
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
from tb_replica_plugin.families.status import attribution, pss_workers, schema
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
    stall_limit,
    stalled_for,
    step_name,
    step_of,
    stopped_at,
    thread_label,
)

# `rules.run_state` and `rules.members` are the family's interface (they live in `states`).
__all__ = ["FINDING_KINDS", "find", "members", "root_cause", "run_state", "status_findings"]

VIEW = "status"
ROOT_CAUSE = "root_cause"
ROOT_CAUSE_PREFIX = "Root cause (first observed failure): "

# A job's failures at the same moment: which is the root cause first.
_ROOT_CAUSE_ORDER = ("stopped_without_end", "training_interrupted", "training_crashed", "stalled")
# The states of a job's workers that are failures an interrupted worker may have caused.
_FAILED = (schema.END_CRASHED, STALLED, SILENT)

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
            "No progress for longer than the run's stall time at its last heartbeat (still "
            "heartbeating, or killed since); in a job, the worker that never entered the step "
            "the others wait in."
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
    "training_interrupted": {
        "severity": "warning",
        "thresholds": (),
        "summary": (
            "A worker of a job was interrupted (KeyboardInterrupt: Ctrl-C, SIGINT) and the other "
            "workers failed without it."
        ),
    },
    pss_workers.KIND: pss_workers.KIND_META,
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


def _lost_hint(lost):
    """What a crash that names lost workers (`Member`s) says of them: why they stopped, when
    their own end record says so, else where to look."""
    who = " and ".join(m.name for m in lost) or "another worker"
    head = f"It says {who} stopped sending heartbeats: this crash follows from that one."
    ended = {m.state for m in lost}
    if lost and ended == {schema.END_INTERRUPTED}:
        return f"{head} {who} was interrupted (KeyboardInterrupt: Ctrl-C or SIGINT) before."
    if lost and ended <= {schema.END_INTERRUPTED, schema.END_CRASHED}:
        return f"{head} {who} ended before ({' and '.join(sorted(ended))}): its finding says why."
    return f"{head} Look at {who}'s own log and its host (the OOM killer in `dmesg`, a preemption)."


def _crash_hint(exception, lost):
    """What to look at, from the exception's class and text (`lost`: the `Member`s it names as
    unhealthy)."""
    text = f"{exception_class(exception)} {exception.get('message') or ''}"
    line = crash_frame(exception) is not None  # the message quotes a line of the user's code
    if lost or exception.get("unhealthy_tasks"):
        return _lost_hint(lost)
    if "not finite" in text or "CheckNumerics" in text or "NaN" in text:
        at_line = " and at that line" if line else ""
        return (
            "A NaN or Inf reached a numeric check: look at what that replica was fed at that "
            f"step (the gradients view shows NaN/Inf per replica){at_line}."
        )
    if "ResourceExhausted" in text or "out of memory" in text.lower() or "OOM" in text:
        return "A device ran out of memory: lower the per-replica batch size or the model size."
    if "Collective ops is aborted" in text or "DeadlineExceeded" in text:
        return "A collective did not complete: look at the other workers' status and logs."
    if line:
        return "Look at that line, and at the full message and traceback in the status view."
    return "Look at the full message and traceback in the status view."


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
    lost_members = [m for m in everyone if m.name in lost]
    if exception:
        first = attribution.first_line(exception.get("message") or "")
        what = f"{exception_class(exception)}: {first}" if first else exception_class(exception)
        details = (
            _names_text(exception, member, everyone)
            + _frame_text(exception)
            + " "
            + _crash_hint(exception, lost_members)
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


def _no_stack_text(member):
    """What the status says of a stalled member whose stall has no stack yet: when it will."""
    who = "the run" if member.name is None else member.label
    if member.state == SILENT:
        return f"No stack of {who} was recorded before its heartbeats stopped."
    recorded = (member.series.start or {}).get("stall_secs")
    signal = f"at once on SIGUSR1 to process {member.heartbeat['pid']}"
    if isinstance(recorded, int | float) and stalled_for(member.heartbeat) < recorded:
        return (
            f"No stack of {who} yet: its probe writes every thread's stack after {recorded:g} s "
            f"without progress (its `stall_secs`), or {signal}."
        )
    return f"No stack of {who} for this stall: its probe writes every thread's stack {signal}."


_RAISE_STALL_TIME = (
    "If a step, an evaluation or a checkpoint really takes this long, raise the stall time "
    "(`stall_secs` of the probe or callback, or the reader's `stall_seconds` threshold)."
)


def _single_stall(run, member, thresholds, now):
    heartbeat = member.heartbeat
    seconds = stalled_for(heartbeat)
    step = step_of(member)
    frame = stall_frame(member)
    thread = thread_label(member.series)
    dead = member.state == SILENT
    verb = "was" if dead else "has been"
    if heartbeat["in_step"]:
        what = (
            f"the {thread} {verb} inside {step_name(step)} (a TensorFlow call) all along: a "
            "collective waiting for a peer that never joins, an input pipeline that never "
            "yields, or an op that never returns"
        )
    else:
        what = (
            f"the {thread} {'was' if member.state == SILENT else 'is'} in Python, outside any step"
        )
    where = f", at {frame_place(frame)}" if frame else ""
    if dead:
        ago = max(0.0, now - heartbeat["wall"])
        how = (
            f", then the process stopped sending heartbeats ({ago:.0f} s ago) with no end "
            "record (killed or lost)"
        )
        look = f"Look at {frame_place(frame)}." if frame else _no_stack_text(member)
    else:
        how = " while the process still heartbeats"
        look = (
            f"Look at {frame_place(frame)}; SIGUSR1 to process {heartbeat['pid']} writes every "
            "thread's stack again."
            if frame
            else _no_stack_text(member)
        )
    message = (
        f"No progress for {seconds:.0f} s {at_step(step)}{how}: {what}{where}. {look} "
        f"{_RAISE_STALL_TIME}"
    )
    return status_finding(
        "stalled",
        run,
        step,
        message,
        replicas=member.replicas,
        value=round(seconds, 3),
        threshold=stall_limit(member.series, thresholds),
    )


def _labels(group):
    return " and ".join(m.label for m in group)


def _is_open(member):
    """Whether a member had a last heartbeat and no end record (heartbeating, or silent)."""
    return member.heartbeat is not None and member.series.end is None


def _behind_text(member, step):
    """How a worker behind step N is described in a job's stall finding."""
    last = member.heartbeat["step"]
    recorded = f"its last step is {last}" if last >= 0 else "its last heartbeat recorded no step"
    text = f"{member.label} never entered {step_name(step)} ({recorded})"
    if not _is_open(member):
        return text + f": it ended ({member.state})"
    frame = stall_frame(member) if member.state != SILENT or member.stalled else None
    where = f", its {thread_label(member.series)} at {frame_place(frame)}" if frame else ""
    if member.state == SILENT:
        return text + where + ", then stopped sending heartbeats"
    return text + where


def _stall_advice(step, cause, behind):
    if cause:
        dead = all(m.state == SILENT for m in cause)
        framed = all(stall_frame(m) is not None for m in cause)
        advice = (
            f"{_labels(cause)} {'is' if len(cause) == 1 else 'are'} the cause: look at why it "
            f"{'did' if dead else 'does'} not go on with {step_name(step)} "
            f"({'that line, ' if framed else ''}an input pipeline that ends earlier on one "
            "worker, a condition that differs per worker)."
        )
        missing = [_no_stack_text(m) for m in cause if stall_frame(m) is None]
        return " ".join([advice, *missing])
    if behind:
        return "The workers behind stopped or ended: their findings say why."
    return (
        f"Every worker is inside {step_name(step)} and none progresses: a collective that does "
        "not complete (collectives that differ across workers, a peer outside this job)."
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
    stalled: list


def stall_roles(everyone):
    """The roles of a job's workers in a stall, or None when no worker without end record was
    stalled at its last heartbeat (`Member.stalled`: still heartbeating, or silent since).

    N (`step`) is the furthest step any worker entered (its HB_STEP). `waiting`: workers without
    end record inside step N (at the all-reduce); `behind`: workers whose last step is below N
    (whatever their state); `idle`: stalled workers at N outside the step; `cause`: the workers
    behind that still heartbeat or stalled before they stopped, else (nobody behind) the idle
    ones; `stalled`: the stalled workers. `seconds`: the longest time without progress at the
    last heartbeat of a worker without end record.
    """
    known = [m for m in everyone if m.heartbeat is not None]
    unended = [m for m in known if _is_open(m)]
    stalled = [m for m in unended if m.stalled]
    if not stalled:
        return None
    step = max(m.heartbeat["step"] for m in known)
    at_n = [m for m in unended if m.heartbeat["step"] == step]
    behind = [m for m in known if m.heartbeat["step"] < step]
    idle = [m for m in at_n if not m.heartbeat["in_step"] and m.stalled]
    went_on = [m for m in behind if m in unended and (m.state != SILENT or m.stalled)]
    return StallRoles(
        step=step,
        seconds=max(stalled_for(m.heartbeat) for m in unended),
        waiting=[m for m in at_n if m.heartbeat["in_step"]],
        behind=behind,
        idle=idle,
        cause=went_on or ([] if behind else idle),
        stalled=stalled,
    )


def _stall_parts(roles):
    parts = []
    for dead in (False, True):
        group = [m for m in roles.waiting if (m.state == SILENT) == dead]
        if group:
            verb = "waited" if dead else ("waits" if len(group) == 1 else "wait")
            parts.append(
                f"{_labels(group)} {verb} inside {step_name(roles.step)} (at the all-reduce)"
            )
    parts.extend(_behind_text(m, roles.step) for m in roles.behind)
    for member in roles.idle:
        frame = stall_frame(member)
        where = f", its {thread_label(member.series)} at {frame_place(frame)}" if frame else ""
        verb = "was" if member.state == SILENT else "is"
        parts.append(f"{member.label} {verb} outside {step_name(roles.step)}{where}")
    return parts


def _stall_when(everyone):
    """ "while the workers still heartbeat", or which of them stopped since."""
    unended = [m for m in everyone if _is_open(m)]
    alive = [m for m in unended if m.state in (RUNNING, STALLED)]
    if len(alive) == len(unended):
        return "while the workers still heartbeat"
    dead = [m for m in unended if m not in alive]
    who = "the workers" if len(dead) == len(everyone) > 1 else " and ".join(m.name for m in dead)
    text = f"; then {who} stopped sending heartbeats with no end record (killed or lost)"
    if alive:
        verb = "heartbeats" if len(alive) == 1 else "heartbeat"
        text += f" while {' and '.join(m.name for m in alive)} still {verb}"
    return text


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
    blamed = roles.cause or roles.behind or roles.stalled
    when = _stall_when(everyone)
    message = (
        f"No progress for {roles.seconds:.0f} s in {step_name(roles.step)}"
        f"{' ' if when.startswith('while') else ''}{when}: {'; '.join(_stall_parts(roles))}. "
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
        threshold=stall_limit(roles.stalled[0].series, thresholds),
    )
    if roles.behind and not roles.cause:
        return finding, None
    return finding, min(m.heartbeat["active_wall"] for m in roles.cause or roles.stalled)


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
        f"{subject} stopped sending heartbeats{stopped_at(member, step)}{ago} with no end "
        f"record{named}: its process was killed (the OOM killer, a preemption or eviction, "
        "SIGKILL) or its host was lost; a clean end, an exception or Ctrl-C would have written "
        "one. Look at the host's logs (`dmesg` for the OOM killer) and the scheduler's events."
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


def interrupted_finding(run, member, everyone):
    """The `training_interrupted` finding of a worker of a job that ended interrupted while
    another worker failed (crashed, stalled or silent), or None."""
    if member.name is None or member.state != schema.END_INTERRUPTED:
        return None
    failed = [m for m in everyone if m is not member and m.state in _FAILED]
    if not failed:
        return None
    end = member.series.end
    step = step_of(member, (end.get("exception") or {}).get("step"), end.get("step"))
    names = " and ".join(m.name for m in failed)
    message = (
        f"Worker {member.label} was interrupted {at_step(step)} (KeyboardInterrupt: Ctrl-C or "
        f"SIGINT to its process), and {names} failed without it: a synchronous job cannot go on "
        "without one of its workers. To stop a job, stop every worker (or its launcher)."
    )
    return status_finding(
        "training_interrupted", run, step, message, replicas=member.replicas, name=member.name
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


def worker_failed_findings(run, member):
    """`worker_failed` findings of a run under `ParameterServerStrategy`: one per outage of a
    worker (`read.StatusSeries.worker_failures`)."""
    series = member.series
    if series is None:
        return []
    findings = []
    for outage in series.worker_failures:
        severity, message, value = pss_workers.finding_fields(outage, series.end is not None)
        step = outage["step"] if isinstance(outage["step"], int) else -1
        back = outage["recovered_step"]
        finding = status_finding(
            pss_workers.KIND,
            run,
            step,
            message,
            replicas=[outage["worker"]],
            name=f"worker {outage['worker']}",
            value=value,
            last_step=back if isinstance(back, int) else step,
        )
        finding.severity = severity
        findings.append(finding)
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
        interrupted = interrupted_finding(status.run, member, everyone)
        if interrupted is not None:
            add(interrupted, member.series.end["wall_time"], interrupted.first_step)
        lost = lost_finding(status.run, member, now, thresholds)
        if lost is not None:
            add(lost, last_sign_of_life(member.series, member.heartbeat), step_of(member))
        findings.extend(thread_findings(status.run, member))
        findings.extend(worker_failed_findings(status.run, member))
    roles = stall_roles(everyone) if isinstance(status, JobStatus) else None
    if roles is not None:
        add(*job_stall(status.run, everyone, roles, thresholds), roles.step)
    elif not isinstance(status, JobStatus) and everyone[0].stalled:
        stall = _single_stall(status.run, everyone[0], thresholds, now)
        add(stall, everyone[0].heartbeat["active_wall"], step_of(everyone[0]))
    ordered = sorted(candidates, key=lambda c: (c.wall_time, c.order, c.worker or ""))
    return findings, _lost_together(ordered, everyone)


# Slack added to the heartbeat interval within which losses count as one (the job killed at once).
LOST_TOGETHER_SLACK_SECONDS = 1.0


def _lost_together(candidates, everyone):
    """`candidates` with the cause of a job killed at once first.

    When the first failures are losses within one heartbeat interval of each other (every worker
    killed together), their last heartbeats' order is chance. The worker behind the furthest
    step the lost workers reached, whose last progress came before the first loss, had stopped
    before (a stall shorter than the stall time): its loss comes first, and its message says so.
    """
    by_name = {m.name: m for m in everyone if m.heartbeat is not None and m.name is not None}
    if not candidates or candidates[0].worker not in by_name:
        return candidates
    first = candidates[0]
    window = max(m.heartbeat["interval"] for m in by_name.values()) + LOST_TOGETHER_SLACK_SECONDS
    together = []
    for candidate in candidates:
        if candidate.finding.kind != "stopped_without_end" or candidate.worker not in by_name:
            break
        if candidate.wall_time - first.wall_time > window:
            break
        together.append(by_name[candidate.worker])
    furthest = max((m.heartbeat["step"] for m in together), default=-1)
    behind = [
        m
        for m in together
        if m.heartbeat["step"] < furthest and m.heartbeat["active_wall"] < first.wall_time - window
    ]
    if not behind:
        return candidates
    cause = min(behind, key=lambda m: m.heartbeat["active_wall"])
    chosen = next(c for c in candidates if c.worker == cause.name)
    ahead = " and ".join(m.name for m in together if m.heartbeat["step"] == furthest)
    chosen.finding.message += (
        f" It had made no progress for {stalled_for(cause.heartbeat):.0f} s before (less than "
        f"the stall time), behind {ahead} in {step_name(furthest)}: the workers were killed "
        "together, and it is the one that had stopped."
    )
    return [chosen] + [c for c in candidates if c is not chosen]


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
    return status_findings(run_data.status, time.time() if now is None else now, thresholds)
