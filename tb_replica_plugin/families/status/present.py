"""Presentation of the status family: the `/status` body, the overview's status column and the
report's status line.

Every function takes `now` (seconds since the epoch) so that what it says is deterministic; the
route and the report pass `time.time()`. Non-finite numbers never reach JSON (None). Pure
Python and numpy, no TensorFlow.
"""

import math
import time

from tb_replica_plugin.analysis import SEVERITY_RANK, Thresholds, replica_list_text
from tb_replica_plugin.families.status import attribution, pss_workers, rules, schema, states

ARGS = {}

# How many of the latest events `/status` and the JSON report list.
EVENTS_SHOWN = 20
# The states of a process still heartbeating: only they have a time without progress.
_HEARTBEATING = frozenset((states.RUNNING, states.STALLED))


def _number(value, digits=3):
    """A rounded float for JSON, or None for None, NaN and infinities."""
    if value is None or isinstance(value, bool):
        return value
    value = float(value)
    return round(value, digits) if math.isfinite(value) else None


def json_safe(value):
    """`value` (dicts, lists, numbers, strings) with every non-finite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def _known(value):
    """An int slot as JSON: None where unknown (-1)."""
    return None if value is None or value < 0 else int(value)


def _worker_row(member, run):
    """One row of `/status` "workers": a worker of a job, or the run itself (named after it)."""
    heartbeat, series = member.heartbeat, member.series
    end = series.end if series is not None else None
    ongoing = member.state in _HEARTBEATING
    return {
        "name": member.name or run,
        "replicas": list(member.replicas),
        "state": member.state,
        "step": _known(heartbeat["step"]) if heartbeat else None,
        "completed": _known(heartbeat["completed"]) if heartbeat else None,
        "in_step": heartbeat["in_step"] if heartbeat else None,
        "last_heartbeat": _number(heartbeat["wall"]) if heartbeat else None,
        "age_s": _number(member.age_s),
        "stalled_for_s": _number(states.stalled_for(heartbeat)) if heartbeat and ongoing else None,
        "stack": states.training_thread_frames(series.stacks) if series is not None else None,
        "exception": _exception_json((end or {}).get("exception")),
    }


def _exception_json(exception):
    """An end record's EXCEPTION for `/status`, with what the report says of it: its
    `first_line` and its `user_frame` (`states.crash_frame`), so the tab says the same."""
    if not exception:
        return None
    first = attribution.first_line(exception.get("message") or "")
    return {**exception, "first_line": first, "user_frame": states.crash_frame(exception)}


def event_summary(event):
    """One line saying what a status event says."""
    kind = event["type"]
    step = event.get("step")
    at_step = f" at step {step}" if isinstance(step, int) and step >= 0 else ""
    if kind == schema.EVENT_START:
        replicas = event.get("replicas") or []
        plural = "s" if len(replicas) > 1 else ""
        on = f", replica{plural} {replica_list_text(replicas)}" if replicas else ""
        return (
            f"started ({event.get('source') or 'unknown source'}, pid {event.get('pid')} on "
            f"{event.get('host') or 'an unknown host'}{on})"
        )
    if kind == schema.EVENT_END:
        text = f"{states.end_state(event)}{at_step}"
        if event.get("how") == "cell":  # the notebook cell that ran a custom loop ended
            text += " (notebook cell)"
        exception = event.get("exception")
        if exception:
            first = attribution.first_line(exception.get("message") or "")
            named = exception.get("class")  # unknown for a `fit` that stopped without returning
            what = f"{states.exception_class(exception)}: {first}" if named and first else first
            text += f": {what or states.exception_class(exception)}"
        kinds = [f.get("kind") for f in event.get("findings") or [] if isinstance(f, dict)]
        return text + (f" by {', '.join(map(str, kinds))}" if kinds else "")
    if kind == schema.EVENT_EXCEPTION:
        exception = event.get("exception") or {}
        return f"thread `{event.get('thread')}` died: {states.exception_class(exception)}"
    if kind == schema.EVENT_WORKER_FAILED:
        what = event.get("error_class") or "an error"
        retried = event.get("retried")
        back = f"; {retried} scheduled step(s) put back so far" if retried is not None else ""
        return f"worker {event.get('worker')} failed{at_step} ({what}){back}"
    if kind == schema.EVENT_WORKER_RECOVERED:
        return f"worker {event.get('worker')} came back{at_step}"
    thread = states.training_thread(event) or {}
    frame = attribution.user_frame(thread.get("frames") or [])
    label = states.thread_label(name=None if thread.get("main") else thread.get("name"))
    where = f": {label} at {states.frame_place(frame, short=True)}" if frame else ""
    return f"stacks written ({event.get('reason')}{at_step}){where}"


def _same_process(series, index):
    """Whether event `index` of an earlier segment of `series` was written by the process of
    its latest segment (an earlier stretch: an earlier `fit`, a loop run again): the pid and
    host of the start events that begin the two segments are the same."""
    starts = [e for e in series.events[: index + 1] if e["type"] == schema.EVENT_START]
    latest = series.events[series.segment_index]
    if not starts or latest["type"] != schema.EVENT_START or starts[-1] is latest:
        return False
    pid, host = starts[-1].get("pid"), starts[-1].get("host")
    return pid is not None and (pid, host) == (latest.get("pid"), latest.get("host"))


def recent_events(members):
    """The last `EVENTS_SHOWN` events of every member, oldest first, summarised; an event of an
    earlier segment is marked `earlier_process`, or `earlier_stretch` when the same process
    wrote it (`_same_process`)."""
    rows = []
    for member in members:
        if member.series is None:
            continue
        earlier = member.series.segment_index
        for index, event in enumerate(member.series.events):
            same = index < earlier and _same_process(member.series, index)
            rows.append(
                {
                    "wall_time": _number(event["wall_time"]),
                    "worker": member.name,
                    "type": event["type"],
                    "earlier_process": index < earlier and not same,
                    "earlier_stretch": same,
                    "summary": event_summary(event),
                }
            )
    rows.sort(key=lambda row: (row["wall_time"] or 0.0, row["worker"] or ""))
    return rows[-EVENTS_SHOWN:]


def earlier_crashes(members):
    """`[{"worker", "wall_time", "same_process", "summary"}]`: crashes of the earlier segments
    of the runs (`same_process`: an earlier stretch of the latest segment's process)."""
    rows = []
    for member in members:
        series = member.series
        if series is None:
            continue
        for index, event in enumerate(series.events[: series.segment_index]):
            if event["type"] != schema.EVENT_END or event.get("state") != schema.END_CRASHED:
                continue
            rows.append(
                {
                    "worker": member.name,
                    "wall_time": _number(event["wall_time"]),
                    "same_process": _same_process(series, index),
                    "summary": event_summary(event),
                }
            )
    return rows


def worker_failures(members):
    """`[{"worker", "device", "wall_time", "step", "error_class", "error", "put_back",
    "retried", "recovered_wall", "recovered_step", "down_s", "summary"}]`: the outages of
    workers under `ParameterServerStrategy` (`read.StatusSeries.worker_failures`), with
    `down_s` (seconds until the worker came back, None while it had not) and the finding's
    text without advice (`summary`)."""
    rows = []
    for member in members:
        series = member.series
        if series is None:
            continue
        for outage in series.worker_failures:
            back = outage["recovered_wall"]
            down = None if back is None else max(0.0, back - outage["wall_time"])
            summary = pss_workers.outage_text(outage, series.end is not None)
            rows.append({**outage, "down_s": _number(down), "summary": summary})
    return rows


def status_body(run_data, now, thresholds=Thresholds()):
    """The `/status` response body of a run or job (see `http_api.md`).

    Args:
      run_data: a `reader.RunData` (its `status`: `StatusSeries`, `JobStatus` or None).
      now: the time to judge at (seconds since the epoch).
      thresholds: the `Thresholds` to apply.

    Returns:
      `{"run", "state", "age_s", "root_cause", "workers": [row, ...], "events": [...],
      "earlier_crashes": [...], "worker_failures": [...]}`; state None and empty lists for a
      run without status data.

    Example:
      >>> status_body(run_data, now)["workers"][0]["state"]
      'crashed'
    """
    status = run_data.status
    if status is None:
        return {
            "run": run_data.run,
            "state": None,
            "age_s": None,
            "root_cause": None,
            "workers": [],
            "events": [],
            "earlier_crashes": [],
            "worker_failures": [],
        }
    state = states.run_state(status, now, thresholds)
    members = states.members(status, now, thresholds)
    return json_safe(
        {
            "run": run_data.run,
            "state": state.state,
            "age_s": _number(state.age_s),
            "root_cause": rules.root_cause(status, now, thresholds),
            "workers": [_worker_row(member, run_data.run) for member in members],
            "events": recent_events(members),
            "earlier_crashes": earlier_crashes(members),
            "worker_failures": worker_failures(members),
        }
    )


def body(run, run_data, parsed):
    """The `/status` body of a run, judged now with the default thresholds."""
    return status_body(run_data, time.time())


def live_fields(run_data, now, thresholds=Thresholds()):
    """The run's status column of `/overview` (`Presenter.live_fields`: at each request).

    Args:
      run_data: a `reader.RunData` (its `status`: `StatusSeries`, `JobStatus` or None).
      now: the time to judge at (seconds since the epoch).
      thresholds: the `Thresholds` to apply.

    Returns:
      `{"status": {"state", "age_s", "worst"}}`: `worst` is the message of the root cause (a
      job) or of the most severe status finding, None when there is none or no status data.

    Example:
      >>> live_fields(run_data, now)["status"]["state"]
      'finished'
    """
    status = run_data.status
    if status is None:
        return {"status": {"state": None, "age_s": None, "worst": None}}
    state = states.run_state(status, now, thresholds)
    findings = rules.status_findings(status, now, thresholds)
    findings.sort(key=lambda f: (f.cause != rules.ROOT_CAUSE, SEVERITY_RANK[f.severity]))
    worst = findings[0].message if findings else None
    return {"status": {"state": state.state, "age_s": _number(state.age_s), "worst": worst}}


def report_json(run_data, thresholds=Thresholds(), now=None):
    """The run's status block of `tb-replica report --json`.

    Args:
      run_data: a `reader.RunData`.
      thresholds: the `Thresholds` to apply.
      now: the time to judge at (seconds since the epoch); default `time.time()`.

    Returns:
      `{"status": body}`: `status_body` without "run", or None without status data.

    Example:
      >>> report_json(run_data, now=now)["status"]["state"]
      'finished'
    """
    now = time.time() if now is None else now
    if run_data.status is None:
        return {"status": None}
    body_json = status_body(run_data, now, thresholds)
    body_json.pop("run")
    return {"status": body_json}


def _crash_clause(member, everyone):
    """ "InvalidArgumentError on replica 1 (at train.py:9 in call)"; an exception of unknown
    class (a `fit` that stopped without returning) says its message's first line instead."""
    exception = (member.series.end or {}).get("exception") or {}
    if not exception:
        return "no exception recorded"
    first = attribution.first_line(exception.get("message") or "")
    what = exception.get("class") or first or states.exception_class(exception)
    replicas = exception.get("replicas") or []
    workers = states.named_workers(exception.get("tasks"), everyone, exclude=member.name)
    on = ""
    if replicas:
        on = f" on replica{'s' if len(replicas) > 1 else ''} {replica_list_text(replicas)}"
    elif workers:
        on = f" naming {' and '.join(workers)}"
    frame = states.crash_frame(exception)
    return f"{what}{on}" + (f" (at {states.frame_place(frame, short=True)})" if frame else "")


def _stall_clause(everyone):
    """ "stalled 42 s in step 5 — worker_1 never entered step 5 (waits at ...); worker_0 waits
    inside step 5" (a job), "stalled 42 s in step 5 — at train.py:88 in wait" (a run)."""
    if everyone[0].name is None:
        member = everyone[0]
        frame = states.stall_frame(member)
        inside = "inside the step, " if member.heartbeat["in_step"] else ""
        where = f"at {states.frame_place(frame, short=True)}" if frame else "no stack yet"
        seconds, step = states.stalled_for(member.heartbeat), states.step_of(member)
        return f"stalled {seconds:.0f} s in {states.step_name(step)} — {inside}{where}"
    roles = rules.stall_roles(everyone)
    step = states.step_name(roles.step)
    parts = []
    for member in roles.behind + roles.idle:
        frame = states.stall_frame(member)
        waits = f" (waits at {states.frame_place(frame, short=True)})" if frame else ""
        entered = "is outside" if member in roles.idle else "never entered"
        parts.append(f"{member.name} {entered} {step}{waits}")
    parts.extend(f"{member.name} waits inside {step}" for member in roles.waiting)
    return f"stalled {roles.seconds:.0f} s in {step} — " + "; ".join(parts)


def _headline(state, everyone):
    """`(text, kind, worker)`: the status line's text after "status: " for the run's or job's
    state, and the finding kind and worker it is about (None when it is about no failure)."""
    job = everyone[0].name is not None
    if state == schema.END_CRASHED:
        crashed = [m for m in everyone if m.state == schema.END_CRASHED]
        first = min(crashed, key=lambda m: m.series.end["wall_time"])
        who = f"{first.name}: " if job else ""
        at = states.at_step(states.crash_step(first))
        text = f"crashed {at} — {who}{_crash_clause(first, everyone)}"
        return text, "training_crashed", first.name
    if state == states.STALLED:
        return _stall_clause(everyone), "stalled", None
    if state == states.SILENT:
        lost = [m for m in everyone if m.state == states.SILENT]
        if job:
            names = " and ".join(m.name for m in lost)
            text = f"silent — {names} stopped sending heartbeats with no end record"
            return text, "stopped_without_end", lost[0].name
        age = f" {lost[0].age_s:.0f} s" if lost[0].age_s is not None else ""
        step = states.step_of(lost[0])
        after = f" after step {step}" if step >= 0 else states.stopped_at(lost[0], step)
        text = f"silent{age}{after} — no end record (killed or lost)"
        return text, "stopped_without_end", None
    if state == states.RUNNING:
        if all(states.heartbeat_off(m.series) for m in everyone if m.state == states.RUNNING):
            text = (
                "running (no heartbeats: heartbeat=False; whether it still runs is unknown until "
                "its end record)"
            )
            return text, None, None
        steps = [m.heartbeat["step"] for m in everyone if m.heartbeat is not None]
        age = min((m.age_s for m in everyone if m.age_s is not None), default=None)
        at = f" at step {max(steps)}" if steps and max(steps) >= 0 else ""
        text = f"running{at}" + (f" (last heartbeat {age:.0f} s ago)" if age is not None else "")
        return text, None, None
    if state in (schema.END_HALTED, schema.END_INTERRUPTED):
        ended = next(m for m in everyone if m.state == state)
        kinds = [f.get("kind") for f in ended.series.end.get("findings") or []]
        by = f" — by {', '.join(map(str, kinds))}" if kinds else ""
        return (
            f"{state} {states.at_step(states.step_of(ended, ended.series.end.get('step')))}{by}",
            None,
            None,
        )
    return str(state), None, None


_ROOT_CAUSE_TEXT = {
    "stopped_without_end": "{worker} stopped sending heartbeats{stopped_at} with no end record",
    "training_interrupted": "{worker} was interrupted {at_step}",
    "training_crashed": "{worker} crashed {at_step}",
    "stalled": "{worker} never entered {step_name}",
}


def report_text(run_data, thresholds=Thresholds(), now=None):
    """The status lines of a run in the text report (none without status data).

    Args:
      run_data: a `reader.RunData`.
      thresholds: the `Thresholds` to apply.
      now: the time to judge at (seconds since the epoch); default `time.time()`.

    Returns:
      e.g. `["  status: crashed at step 3 — InvalidArgumentError on replica 1 (at train.py:9
      in call)"]`, `["  status: finished"]`; a job whose root cause is another worker's failure
      than the headline's adds "; root cause: worker_1 stopped sending heartbeats ...", and each
      earlier segment of the run that crashed adds a line ("an earlier stretch of this process"
      when the same process wrote it, e.g. an earlier `fit`, else "an earlier process"); under
      `ParameterServerStrategy` each worker failure the coordinator handled adds a line
      ("Worker 1 (/job:worker/replica:0/task:1) failed at ...; it came back after 3 s").

    Example:
      >>> report_text(run_data, now=now)
      ['  status: finished']
    """
    status = run_data.status
    if status is None:
        return []
    now = time.time() if now is None else now
    state = states.run_state(status, now, thresholds).state
    everyone = states.members(status, now, thresholds)
    text, kind, worker = _headline(state, everyone)
    line = f"  status: {text}"
    cause = rules.root_cause(status, now, thresholds) if everyone[0].name is not None else None
    # A stall's or a loss's headline names every worker it is about; a crash's only one.
    said = cause is not None and cause["kind"] == kind
    said = said and (kind in ("stalled", "stopped_without_end") or cause["worker"] == worker)
    if cause is not None and not said:
        step = -1 if cause["step"] is None else cause["step"]
        lost = next((m for m in everyone if m.name == cause["worker"]), everyone[0])
        names = {
            "at_step": states.at_step(step),
            "step_name": states.step_name(step),
            "stopped_at": states.stopped_at(lost, step),
        }
        line += "; root cause: " + _ROOT_CAUSE_TEXT[cause["kind"]].format(**cause, **names)
    lines = [line]
    for crash in earlier_crashes(everyone):
        who = f"{crash['worker']}: " if crash["worker"] else ""
        earlier = "stretch of this process" if crash["same_process"] else "process of this run"
        lines.append(f"    an earlier {earlier}: {who}{crash['summary']}")
    lines.extend(f"    {row['summary']}" for row in worker_failures(everyone))
    return lines
