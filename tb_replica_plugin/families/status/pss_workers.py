"""The status family under `ParameterServerStrategy`: the worker failures the coordinator handled
(its "worker_failed" and "worker_recovered" events, `write.pss_failures`), in words.

`worker_failed` finding: a worker's server stopped mid-run; the coordinator put the scheduled
step(s) it ran back in its queue and another worker ran them. A warning when the worker came
back, an error when it had not by the run's end (or, for a run still going, by its last event).
The replica of worker r is r (each worker is one replica of the run). Pure Python.
"""

import time

KIND = "worker_failed"
KIND_META = {
    "severity": "error",
    "thresholds": (),
    "summary": (
        "Under ParameterServerStrategy, a worker failed mid-run (its server stopped or became "
        "unreachable); the coordinator put its scheduled step back and ran it on another "
        "worker. A warning when the worker came back, an error when it had not by the run's end."
    ),
}


def clock(wall):
    """ "12:00:03 UTC": the time of day of `wall` (seconds since the epoch)."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(wall))


def _steps(count):
    return f"{count} scheduled step{'s' if count != 1 else ''}"


def _step(step):
    return f" (step {step})" if isinstance(step, int) and step >= 0 else ""


def outage_text(outage, ended):
    """What one entry of `StatusSeries.worker_failures` says, without advice.

    Args:
      outage: the entry.
      ended: whether the run's latest segment has its end record.

    Returns:
      e.g. "Worker 1 (/job:worker/replica:0/task:1) failed at 12:00:03 UTC (step 5) with
      UnavailableError: failed to connect to all addresses; the coordinator put 1 scheduled step
      back and ran it on another worker; it came back after 3 s (step 9)".
    """
    device = f" ({outage['device']})" if outage.get("device") else ""
    error = outage.get("error_class") or "an error"
    if outage.get("error"):
        error += f": {outage['error'].rstrip(' .:;,')}"
    put_back = outage["put_back"]
    text = (
        f"Worker {outage['worker']}{device} failed at {clock(outage['wall_time'])}"
        f"{_step(outage.get('step'))} with {error}; the coordinator put {_steps(put_back)} back "
        f"and ran {'it' if put_back == 1 else 'them'} on another worker"
    )
    back = outage.get("recovered_wall")
    if back is not None:
        seconds = max(0.0, back - outage["wall_time"])
        return text + f"; it came back after {seconds:.0f} s{_step(outage.get('recovered_step'))}"
    if ended:
        return text + "; it had not come back when the run ended"
    return text + "; it has not come back (as of the run's last record)"


def finding_fields(outage, ended):
    """`(severity, message, value)` of the `worker_failed` finding of one outage: value is the
    seconds until the worker came back (None while it had not)."""
    text = outage_text(outage, ended)
    back = outage.get("recovered_wall")
    if back is not None:
        return (
            "warning",
            f"{text}. Training went on: the coordinator re-runs a failed worker's steps on the "
            "others. A worker that fails again and again points at its host (preemptions, the "
            "OOM killer: look at its logs).",
            round(max(0.0, back - outage["wall_time"]), 3),
        )
    return (
        "error",
        f"{text}. The other workers ran every step meanwhile, and the coordinator waits for it "
        "(up to an hour): restart its server at the same address (the cluster spec's), and look "
        "at its host's logs for why it stopped (the OOM killer, a preemption).",
        None,
    )
