"""Presentation of the step_time family: `/step_time` and the report's step-time block.

The route body (JSON documented in `http_api.md`), the family's blocks of `tb-replica report`
(JSON and text). Pure Python and numpy, no TensorFlow.
"""

import numpy as np

from tb_replica_plugin.core import args
from tb_replica_plugin.core.downsample import bucket_means
from tb_replica_plugin.families.step_time import rules

ARGS = {"max_points": args.parse_max_points}


def step_time_body(run_data, max_points):
    """The `/step_time` response body of a multi-worker job (see `http_api.md`).

    Args:
      run_data: a `reader.RunData` (a job; a single-worker run gives empty series).
      max_points: most buckets on the step axis (bucket means beyond).

    Returns:
      The JSON-ready dict: per-worker busy seconds, lateness, period and summary medians.
    """
    series = run_data.step_time
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


def body(run, run_data, parsed):
    """The `/step_time` body of a run (`step_time_body`; empty series for a single worker)."""
    return step_time_body(run_data, parsed["max_points"])


def listed(run_data):
    """Never: `/runs` does not name step_time (the tab shows it for jobs, from `workers`)."""
    return False


def report_json(run_data, thresholds):
    """`{"step_time": ...}`: the step-time block of a run in the JSON report (None if no job)."""
    return {"step_time": _step_time_json(run_data)}


def report_text(run_data, thresholds):
    """The step-time lines of a job in the text report (none for a single-worker run)."""
    return _step_time_lines(run_data)


def _rounded(values):
    return [None if v is None else round(v, 6) for v in values]


def _step_time_json(run_data):
    """The `step_time` block of a job in the JSON report (None for a single-worker run)."""
    series = run_data.step_time
    if series is None:
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
