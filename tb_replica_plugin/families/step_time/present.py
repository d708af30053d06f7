"""Presentation of the step_time family: `/step_time` and the report's step-time blocks.

The route body (JSON documented in `http_api.md`), the family's blocks of `tb-replica report`
(JSON and text). Pure Python and numpy, no TensorFlow.
"""

import numpy as np

from tb_replica_plugin.core import args
from tb_replica_plugin.core.downsample import bucket_max, bucket_means, pool_replicas
from tb_replica_plugin.families.step_time import rules

ARGS = {"max_points": args.parse_max_points, "replica_blocks": args.parse_replica_blocks}

# The text report lists every replica's ready time up to this many replicas, else the slowest.
TEXT_REPLICAS = 16


def step_time_body(run_data, max_points, replica_blocks=None):
    """The `/step_time` response body of a run or job (see `http_api.md`).

    Args:
      run_data: a `reader.RunData` (a single-worker run gives empty per-worker series).
      max_points: most buckets on the step axis (bucket means beyond).
      replica_blocks: with more replicas than this, the ready times are sent as this many
        blocks of replicas (`ready_body`).

    Returns:
      The JSON-ready dict: per-worker busy seconds, lateness, period and summary medians, and
      `ready`, the replicas' ready times (`ready_body`; None when the run has none).

    Example:
      >>> step_time_body(run_data, 2000)["ready"]["median_ready"]
      [0.02, 0.03]
    """
    series = run_data.step_time
    ready = getattr(series, "ready", None)
    body = _worker_body(run_data, series, max_points)
    body["ready"] = None if ready is None else ready_body(ready, max_points, replica_blocks)
    body["pss_workers"] = pss_workers_json(series)
    return body


def pss_workers_json(series, thresholds=None):
    """The `pss_workers` block (`/step_time`, the JSON report): each worker's totals under
    ParameterServerStrategy, None for a run of another strategy.

    Returns:
      `{"step", "steps_run", "busy", "span", "rate", "step_seconds", "stragglers"}`: per worker
      (worker w: replica w) the steps it ran, its seconds busy, from its first step's start to
      its last one's end, its steps per second, its mean seconds per step (None without a step),
      and the workers `pss_straggler` names.

    Example:
      >>> pss_workers_json(series)["steps_run"]
      [30, 12]
    """
    totals = getattr(series, "pss", None)
    if totals is None:
        return None
    found = rules.find_pss_stragglers(series, *([thresholds] if thresholds else []))
    return {
        "step": int(totals.step),
        "steps_run": totals.steps_run.tolist(),
        "busy": [_finite(v) for v in totals.busy.tolist()],
        "span": [_finite(v) for v in totals.span.tolist()],
        "rate": [_finite(v) for v in totals.rate.tolist()],
        "step_seconds": [_finite(v) for v in totals.step_seconds().tolist()],
        "stragglers": [r for f in found for r in f.replicas],
    }


def pss_workers_lines(series, thresholds):
    """The text report's lines of a ParameterServerStrategy run's worker totals ([] for
    another strategy).

    Example:
      >>> pss_workers_lines(series, Thresholds())[2]
      '    worker 1: ran 12 steps, 13.2 s busy (1.100 s/step), 0.90 steps/s  <- pss_straggler'
    """
    block = pss_workers_json(series, thresholds)
    if block is None:
        return []
    lines = ["  steps each worker ran (also those past the slowest worker's last written step):"]
    for w, steps in enumerate(block["steps_run"]):
        per_step = block["step_seconds"][w]
        each = "" if per_step is None else f" ({per_step:.3f} s/step)"
        mark = "  <- pss_straggler" if w in block["stragglers"] else ""
        lines.append(
            f"    worker {w}: ran {steps} step{'s' if steps != 1 else ''}, "
            f"{block['busy'][w]:.3g} s busy{each}, {block['rate'][w]:.2f} steps/s{mark}"
        )
    return lines


def _worker_body(run_data, series, max_points):
    """The per-worker keys of `/step_time` (empty lists without per-worker timing)."""
    workers = run_data.workers
    if series is None or not series.steps.size:
        return {
            "run": run_data.run,
            "workers": workers,
            "steps": [],
            "busy": [],
            "lateness": [],
            "period": [],
            "median_busy": [],
            "median_lateness": [],
            "downsampled": False,
        }
    steps, busy, lateness, period = series.steps, series.busy, series.lateness, series.period
    count = int(steps.size)
    downsampled = count > max_points
    if downsampled:
        starts = np.arange(0, count, -(-count // max_points))
        steps = steps[starts]
        busy, lateness, period = (bucket_means(v, starts) for v in (busy, lateness, period))

    median_busy, median_lateness = rules.step_time_medians(series)
    return {
        "run": run_data.run,
        "workers": workers,
        "steps": steps.tolist(),
        "busy": busy.tolist(),
        "lateness": lateness.tolist(),
        "period": period.tolist(),
        "median_busy": median_busy,
        "median_lateness": median_lateness,
        "downsampled": downsampled,
    }


def ready_body(ready, max_points, replica_blocks=None):
    """The `ready` part of `/step_time`: each replica's ready times over the logged steps.

    Args:
      ready: a `read.ReplicaTimeSeries`.
      max_points: most buckets on the step axis: beyond, `median` and `wait` hold each bucket's
        mean and `max` its maximum.
      replica_blocks: with more replicas than this, `median`, `max` and `wait` are sent as this
        many blocks of replicas, each the largest value of its replicas (the slowest stays
        visible), with `pooled`; the per-replica figures stay per replica.

    Returns:
      The JSON-ready dict documented in `http_api.md`.

    Example:
      >>> ready_body(ready, 2000)["median"]  # 2 replicas, 2 logged steps
      [[0.02, 0.03], [0.021, 0.031]]
    """
    steps = ready.steps
    median, highest, wait = ready.ready_median, ready.ready_max, ready.wait_median
    count = int(steps.size)
    downsampled = count > max_points
    if downsampled:
        starts = np.arange(0, count, -(-count // max_points))
        steps = steps[starts]
        median, wait = bucket_means(median, starts), bucket_means(wait, starts)
        highest = bucket_max(highest, starts)
    median_ready, median_wait, max_ready = rules.ready_medians(ready)
    (median, highest, wait), pooled = pool_replicas([median, highest, wait], replica_blocks)
    used = rules.timed_windows(ready)
    return {
        "replicas": ready.replicas,
        "devices": ready.devices,
        "workers": ready.workers,
        "steps": steps.tolist(),
        "warm_up": bool(used.size and not used[0]),
        "median": median.tolist(),
        "max": highest.tolist(),
        "wait": wait.tolist(),
        "median_ready": median_ready.tolist(),
        "median_wait": median_wait.tolist(),
        "max_ready": max_ready.tolist(),
        "downsampled": downsampled,
        **pooled,
    }


def body(run, run_data, parsed):
    """The `/step_time` body of a run (`step_time_body`; empty per-worker series for a single
    worker)."""
    return step_time_body(run_data, parsed["max_points"], parsed.get("replica_blocks"))


def listed(run_data):
    """Whether `/runs` names step_time: when the run has replica ready times (a job's tab shows
    its per-worker step time from `workers` whatever this says)."""
    return _ready(run_data) is not None or getattr(run_data.step_time, "pss", None) is not None


def _ready(run_data):
    """The run's replica ready times (`read.ReplicaTimeSeries`), None without step_time data."""
    series = run_data.step_time
    return None if series is None else series.ready


def report_json(run_data, thresholds):
    """`{"step_time": ..., "replica_time": ...}`: a run's step-time blocks in the JSON report:
    the per-worker timing of a job (None for a single run) and the replicas' ready times
    (`replica_time_json`; None when the run has none)."""
    ready = _ready(run_data)
    return {
        "step_time": _step_time_json(run_data),
        "replica_time": None if ready is None else replica_time_json(ready, thresholds),
        "pss_workers": pss_workers_json(run_data.step_time, thresholds),
    }


def report_text(run_data, thresholds):
    """The step-time lines of a run in the text report: each worker's of a job, then the
    replicas' ready times (`replica_time_lines`)."""
    ready = _ready(run_data)
    lines = _step_time_lines(run_data) + pss_workers_lines(run_data.step_time, thresholds)
    return lines + ([] if ready is None else replica_time_lines(ready, thresholds))


def replica_time_json(ready, thresholds):
    """The `replica_time` block of a run in `tb-replica report --json`.

    Returns:
      `{"replicas", "workers", "windows", "median_ready", "median_wait", "max_ready",
      "slow_replicas"}`: per replica, seconds over the logged windows the rule uses (`windows`
      of them; rounded to the microsecond), and the ids `slow_replica` names.
    """
    median_ready, median_wait, max_ready = rules.ready_medians(ready)
    return {
        "replicas": ready.replicas,
        "workers": ready.workers,
        "windows": int(np.count_nonzero(rules.timed_windows(ready))),
        "median_ready": [_finite(v) for v in median_ready.tolist()],
        "median_wait": [_finite(v) for v in median_wait.tolist()],
        "max_ready": [_finite(v) for v in max_ready.tolist()],
        "slow_replicas": rules.slow_replicas(ready, thresholds),
    }


def replica_time_lines(ready, thresholds):
    """The text report's lines of a run's replica ready times: one per replica (the
    `TEXT_REPLICAS` slowest beyond that many), the slow ones marked.

    Example:
      >>> replica_time_lines(ready, Thresholds())[2]
      '    replica 1 (CPU:1): ready 0.030 s, waits 0.000 s, max 0.040 s  <- slow_replica'
    """
    median_ready, median_wait, max_ready = rules.ready_medians(ready)
    slow = set(rules.slow_replicas(ready, thresholds))
    windows = int(np.count_nonzero(rules.timed_windows(ready)))
    if ready.strategy == rules.PSS:
        return _pss_step_lines(ready, median_ready, max_ready, slow, windows)
    lines = [
        f"  replica ready time per step (medians over {windows} logged window(s); waits: for "
        "the slowest replica of its worker):"
    ]
    count = len(ready.replicas)
    shown = range(count)
    if count > TEXT_REPLICAS:
        order = np.argsort(-np.nan_to_num(median_ready, nan=-np.inf), kind="stable")
        shown = sorted(order[:TEXT_REPLICAS].tolist())
    for p in shown:
        where = rules.place_text(ready, p)
        mark = "  <- slow_replica" if ready.replicas[p] in slow else ""
        lines.append(
            f"    replica {ready.replicas[p]}{f' ({where})' if where else ''}: ready "
            f"{_seconds(median_ready[p])}, waits {_seconds(median_wait[p])}, max "
            f"{_seconds(max_ready[p])}{mark}"
        )
    if count > TEXT_REPLICAS:
        lines.append(f"    … {count - TEXT_REPLICAS} faster replicas (see --json)")
    return lines


def _pss_step_lines(ready, median_ready, max_ready, slow, windows):
    """The replica-time lines of a ParameterServerStrategy run: each worker's step seconds."""
    lines = [
        f"  step seconds per worker, on its clock (medians over {windows} logged window(s) of "
        "the written steps):"
    ]
    for p, worker in enumerate(ready.replicas):
        mark = "  <- slow_replica" if worker in slow else ""
        lines.append(
            f"    worker {worker}: step {_seconds(median_ready[p])}, max "
            f"{_seconds(max_ready[p])}{mark}"
        )
    return lines


def _seconds(value):
    return "—" if not np.isfinite(value) else f"{value:.3f} s"


def _rounded(values):
    return [None if v is None else round(v, 6) for v in values]


def _step_time_json(run_data):
    """The `step_time` block of a job in the JSON report (None for a single-worker run)."""
    series = run_data.step_time
    if series is None or not series.workers:
        return None
    return {
        "workers": series.workers,
        "steps": series.steps.tolist(),
        "busy": [[_finite(v) for v in row] for row in series.busy.tolist()],
        "lateness": [[_finite(v) for v in row] for row in series.lateness.tolist()],
        "period": [[_finite(v) for v in row] for row in series.period.tolist()],
        "median_busy": _rounded(rules.step_time_medians(series)[0]),
        "median_lateness": _rounded(rules.step_time_medians(series)[1]),
    }


def _finite(value):
    return None if value is None or not np.isfinite(value) else round(float(value), 6)


def _step_time_lines(run_data):
    series = run_data.step_time
    if series is None or not series.steps.size:
        return []
    lines = ["  step time per worker (median over logged steps after the first):"]
    busy, late = rules.step_time_medians(series)
    for index, worker in enumerate(run_data.workers):
        replicas = ", ".join(str(r) for r in worker["replicas"])
        if busy[index] is None:
            lines.append(f"    {worker['name']} (replicas {replicas}): not enough steps")
            continue
        lines.append(
            f"    {worker['name']} (replicas {replicas}): busy {busy[index]:.3f} s/step, "
            f"arrives {late[index]:.3f} s after the first worker"
        )
    return lines
