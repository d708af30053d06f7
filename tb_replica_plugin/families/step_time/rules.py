"""Findings of multi-worker jobs (the step_time family):

- `straggler` (warning): a worker's median busy time per step (its step period minus the time
  it waited for the last worker) exceeds the median over workers by `Thresholds.straggler_factor`
  and by at least `Thresholds.straggler_min_seconds` (the first timed step, a warm-up, is left
  out).

Pure Python and numpy.
"""

import numpy as np

from tb_replica_plugin.analysis import (
    Finding,
    Thresholds,
)

FINDING_KINDS = {
    "straggler": {
        "severity": "warning",
        "thresholds": ("straggler_factor", "straggler_min_seconds"),
        "summary": (
            "A worker's median busy time per step exceeds the median over workers; every worker "
            "waits for it at each all-reduce."
        ),
    },
}


def _worker_text(worker):
    replicas = worker["replicas"]
    ids = ", ".join(str(r) for r in replicas)
    return f"{worker['name']} (replica{'s' if len(replicas) > 1 else ''} {ids})"


def timed_steps(step_time):
    """Which steps of a `read.StepTimeSeries` the straggler rule uses (bool [S]).

    Steps where every worker has a busy time, except the first one when later ones exist: a
    warm-up (workers finish tracing and their first step at different times).
    """
    valid = np.all(np.isfinite(step_time.busy), axis=1)
    first = np.flatnonzero(valid)
    if first.size > 1:
        valid[first[0]] = False
    return valid


def step_time_medians(step_time):
    """Per-worker medians of busy seconds and lateness over `timed_steps` (None if no step).

    Returns:
      `(median_busy, median_lateness)`, two lists with one float (or None) per worker.
    """
    valid = timed_steps(step_time)
    if not np.any(valid):
        return [None] * len(step_time.workers), [None] * len(step_time.workers)
    return (
        [float(v) for v in np.median(step_time.busy[valid], axis=0)],
        [float(v) for v in np.median(step_time.lateness[valid], axis=0)],
    )


def find_stragglers(step_time, workers, thresholds=Thresholds()):
    """Stragglers of a multi-worker job.

    Args:
      step_time: a `read.StepTimeSeries` (or None).
      workers: the job's per-worker grouping (`RunData.workers`), in the same worker order.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding` of kind "straggler", one per slow worker.

    Example:
      >>> [f.name for f in find_stragglers(run_data.step_time, run_data.workers)]
      ['worker_1']
    """
    if step_time is None or len(workers) < 2 or step_time.steps.size == 0:
        return []
    busy = step_time.busy
    valid = timed_steps(step_time)
    if not np.any(valid):
        return []
    busy, steps = busy[valid], step_time.steps[valid]
    lateness = step_time.lateness[valid]
    per_worker = np.median(busy, axis=0)
    middle = float(np.median(per_worker))
    findings = []
    for w, worker in enumerate(workers):
        own = float(per_worker[w])
        if own <= thresholds.straggler_factor * middle:
            continue
        if own - middle < thresholds.straggler_min_seconds:
            continue
        at_step = np.median(busy, axis=1)
        slow = steps[busy[:, w] > thresholds.straggler_factor * at_step]
        slow = slow if slow.size else steps
        ratio = own / middle if middle > 0 else float("inf")
        others = [float(per_worker[v]) for v in range(len(workers)) if v != w]
        findings.append(
            Finding(
                kind="straggler",
                severity="warning",
                run=step_time.run,
                first_step=int(slow[0]),
                last_step=int(slow[-1]),
                count=int(slow.size),
                replicas=list(worker["replicas"]),
                name=worker["name"],
                value=round(ratio, 3),
                threshold=thresholds.straggler_factor,
                message=(
                    f"Worker {_worker_text(worker)} is a straggler: it needs {own:.3f} s per "
                    f"step against a median of {middle:.3f} s over workers (the others "
                    f"{', '.join(f'{o:.3f}' for o in others)} s), and arrives "
                    f"{float(np.median(lateness[:, w])):.3f} s after the first worker, so every "
                    "worker waits for it at each all-reduce. Look at its input pipeline (tf.data "
                    "prefetch/parallel map, data on a slow disk), its host load and its "
                    "hardware; this measures the time until its step inputs are ready."
                ),
                view="step_time",
            )
        )
    return findings


def find(run_data, thresholds=Thresholds()):
    """Stragglers of a multi-worker job (`find_stragglers`); none for a single-worker run."""
    workers = getattr(run_data, "workers", None) or []
    if not workers:
        return []
    return find_stragglers(getattr(run_data, "step_time", None), workers, thresholds)
