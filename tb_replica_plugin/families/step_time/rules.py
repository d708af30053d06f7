"""Findings of the step_time family:

- `straggler` (warning, multi-worker jobs): a worker's median busy time per step (its step
  period minus the time it waited for the last worker) exceeds the median over workers by
  `Thresholds.straggler_factor` and by at least `Thresholds.straggler_min_seconds` (the first
  timed step, a warm-up, is left out).
- `pss_straggler` (warning, ParameterServerStrategy): a worker's steps per second are at most
  the other workers' median over `Thresholds.pss_straggler_factor`, it ran at least
  `Thresholds.pss_straggler_min_steps` fewer steps than their median, and its steps take at least
  `Thresholds.straggler_min_seconds` longer (each timed on its worker's clock), from the totals
  the coordinator wrote (`step_time/pss_workers`).
- `slow_replica` (warning): a replica's median ready time per step is at least
  `Thresholds.slow_replica_factor` times the median of the other replicas of its worker and at
  least `Thresholds.slow_replica_min_seconds` above it (replicas of different workers are
  compared through `straggler`). Under ParameterServerStrategy the workers' step seconds are
  compared, with a floor of `Thresholds.straggler_min_seconds`, once the timed windows hold
  `Thresholds.pss_straggler_min_steps` steps.

Pure Python and numpy.
"""

import dataclasses
import re

import numpy as np

from tb_replica_plugin.analysis import (
    Finding,
    Thresholds,
)
from tb_replica_plugin.core.medians import median_of_others

FINDING_KINDS = {
    "straggler": {
        "severity": "warning",
        "thresholds": ("straggler_factor", "straggler_min_seconds"),
        "summary": (
            "A worker's median busy time per step exceeds the median over workers; every worker "
            "waits for it at each all-reduce."
        ),
    },
    "pss_straggler": {
        "severity": "warning",
        "thresholds": ("pss_straggler_factor", "pss_straggler_min_steps", "straggler_min_seconds"),
        "summary": (
            "Under `ParameterServerStrategy` a worker runs far fewer steps per second than the "
            "others; in asynchronous training its updates fall behind"
        ),
    },
    "slow_replica": {
        "severity": "warning",
        "thresholds": (
            "slow_replica_factor",
            "slow_replica_min_seconds",
            "straggler_min_seconds",
            "pss_straggler_min_steps",
        ),
        "summary": (
            "A replica's median ready time per step (until its local gradients reach the host) is "
            "above the other replicas' of its worker; they wait for it at each all-reduce."
        ),
    },
}


# A run of ParameterServerStrategy: replica r is worker r (`inputs.rules.PSS`).
PSS = "ParameterServerStrategy"


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


def find_pss_stragglers(series, thresholds=Thresholds()):
    """Stragglers of a `ParameterServerStrategy` run, from its workers' totals.

    A worker is one when the median steps per second of the other workers is at least
    `pss_straggler_factor` times its own, they ran (median) at least `pss_straggler_min_steps`
    more steps, and its seconds per step (`pss_step_seconds`) exceed theirs (median) by
    `straggler_min_seconds` or more (a worker that ran no step: by the first two alone). The
    last two keep out a short run whose few steps went to whichever worker was free first.

    Args:
      series: a `read.StepTimeSeries` (or None); its `pss` totals are judged.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding` of kind "pss_straggler", one per slow worker.

    Example:
      >>> [f.replicas for f in find_pss_stragglers(series)]  # 12 steps at 0.9/s, 30 at 3.1/s
      [[1]]
    """
    totals = getattr(series, "pss", None)
    if totals is None or totals.steps_run.size < 2:
        return []
    seconds = pss_step_seconds(series)
    findings = []
    for w in range(totals.steps_run.size):
        others = [v for v in range(totals.steps_run.size) if v != w]
        rate, base_rate = float(totals.rate[w]), float(np.median(totals.rate[others]))
        steps, base_steps = int(totals.steps_run[w]), float(np.median(totals.steps_run[others]))
        if base_rate < thresholds.pss_straggler_factor * rate:
            continue
        if base_steps - steps < thresholds.pss_straggler_min_steps:
            continue
        own, base = float(seconds[w]), float(np.nanmedian(seconds[others]))
        if steps and not own - base >= thresholds.straggler_min_seconds:
            continue
        findings.append(
            Finding(
                kind="pss_straggler",
                severity="warning",
                run=series.run,
                first_step=0,
                last_step=int(totals.step),
                count=steps,
                replicas=[w],
                name=None,
                value=round(base_rate / rate, 3) if rate > 0 else float("inf"),
                threshold=thresholds.pss_straggler_factor,
                message=pss_straggler_message(w, steps, rate, base_steps, base_rate, own, base),
                view="step_time",
            )
        )
    return findings


def pss_step_seconds(series):
    """float64 [W]: each worker's seconds per step under ParameterServerStrategy: the median of
    its written steps' windows (`ready_medians`, the first window left out when it is a single
    step: each worker's first step sets up its function and iterator) where the run has them,
    else its mean over every step it ran (`PssWorkerTotals.step_seconds`)."""
    seconds = series.pss.step_seconds()
    ready = series.ready
    if ready is not None and len(ready.replicas) == seconds.size:
        medians = ready_medians(ready)[0]
        seconds = np.where(np.isfinite(medians), medians, seconds)
    return seconds


def pss_straggler_message(worker, steps, rate, base_steps, base_rate, own, base):
    """The message of a `pss_straggler` finding (see `find_pss_stragglers`)."""
    timing = (
        f"; its steps take {own:.3f} s against {base:.3f} s (median of the others)" if steps else ""
    )
    return (
        f"Worker {worker} ran {steps} step{'s' if steps != 1 else ''} at {rate:.2f} steps/s while "
        f"the others ran {base_steps:g} at {base_rate:.2f} steps/s (median){timing}. Under "
        "ParameterServerStrategy the workers do not wait for each other: in asynchronous "
        "training its updates fall behind (fewer, computed from older variables: stale "
        "gradients), and the steps it did not reach are not written as steps of the run. Look "
        "at its input pipeline (dataset_fn: tf.data prefetch, parallel map), its host's load "
        "and hardware, and its network to the parameter servers."
    )


def timed_windows(ready):
    """Which logged windows of a `read.ReplicaTimeSeries` the ready-time figures use (bool [S]).

    Every window, except the first when it holds a single step and later windows exist: that
    step is the first one the replicas ran (a warm-up), and its window's median is that step.
    """
    used = np.ones(ready.steps.size, dtype=bool)
    if ready.steps.size > 1 and np.all(ready.window_steps[0] == 1):
        used[0] = False
    return used


def ready_medians(ready):
    """Per replica, over `timed_windows`: the median of its window medians of ready seconds, of
    wait seconds, and the largest ready time.

    Returns:
      `(median_ready, median_wait, max_ready)`: float64 arrays [R] (NaN without windows).

    Computed once per series and read-only (a version's findings and its `/step_time` body
    ask for the same: 80 ms at 1,000 x 2,048).

    Example:
      >>> [a.tolist() for a in ready_medians(ready)]  # replica 1 slow in every window
      [[0.02, 0.03], [0.01, 0.0], [0.025, 0.04]]
    """
    cached = ready.medians_cache
    if cached is not None and cached[0] is ready.ready_median:
        return cached[1]
    used = timed_windows(ready)
    if not np.any(used):
        medians = tuple(np.full(len(ready.replicas), np.nan) for _ in range(3))
    else:
        medians = (
            _column_medians(ready.ready_median[used]),
            _column_medians(ready.wait_median[used]),
            np.max(ready.ready_max[used], axis=0),
        )
    for array in medians:
        array.flags.writeable = False
    ready.medians_cache = (ready.ready_median, medians)
    return medians


def _column_medians(values):
    """`np.median(values, axis=0)`, each replica's column made contiguous first (its
    partition reads one row of memory, not every row: 0.06 instead of 0.1 s at 1,000 x 2,048)."""
    return np.median(np.ascontiguousarray(values.T), axis=1)


def replica_groups(ready):
    """Positions of the replicas compared with each other: those of one worker (all of a run).

    Returns:
      A list of `(worker name or None, [positions])`, in replica order.
    """
    if not ready.workers:
        return [(None, list(range(len(ready.replicas))))]
    groups = {}
    for position, name in enumerate(ready.workers):
        groups.setdefault(name, []).append(position)
    return list(groups.items())


def find_slow_replicas(ready, thresholds=Thresholds()):
    """Slow replicas: ready times above the other replicas' of their worker.

    A replica is slow when its median ready time (`ready_medians`) is at least
    `slow_replica_factor` times the median of the other replicas' of its worker and at least
    `slow_replica_min_seconds` above it. Replicas of different workers are not compared here
    (their clocks and hosts differ: the straggler rule compares workers).

    Args:
      ready: a `read.ReplicaTimeSeries` (or None).
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding` of kind "slow_replica", one per slow replica.

    Example:
      >>> [(f.replicas, f.value) for f in find_slow_replicas(ready)]  # 0.030 s against 0.020 s
      [([1], 1.5)]
    """
    if ready is None or not ready.steps.size:
        return []
    if ready.strategy == PSS:
        thresholds = _pss_slow_thresholds(ready, thresholds)
        if thresholds is None:
            return []
    median_ready, median_wait, _ = ready_medians(ready)
    findings = []
    for worker, positions in replica_groups(ready):
        for position in _candidates(median_ready, positions, thresholds):
            others = [p for p in positions if p != position]
            if not others or not np.isfinite(median_ready[position]):
                continue
            own, base = float(median_ready[position]), float(np.median(median_ready[others]))
            if own < thresholds.slow_replica_factor * base:
                continue
            if own - base < thresholds.slow_replica_min_seconds:
                continue
            wait = float(np.median(median_wait[others]))
            findings.append(
                _slow_finding(ready, position, others, own, base, wait, worker, thresholds)
            )
    return findings


def _pss_slow_thresholds(ready, thresholds):
    """Under ParameterServerStrategy (replica r: worker r, other hosts): the thresholds of
    `slow_replica` with a floor of `straggler_min_seconds`, or None when the timed windows hold
    fewer than `pss_straggler_min_steps` steps (a worker's first steps set up its function and
    its iterator: a short run is not judged)."""
    used = timed_windows(ready)
    if int(ready.window_steps[used, 0].sum()) < thresholds.pss_straggler_min_steps:
        return None
    floor = max(thresholds.slow_replica_min_seconds, thresholds.straggler_min_seconds)
    return dataclasses.replace(thresholds, slow_replica_min_seconds=floor)


def _candidates(median_ready, positions, thresholds):
    """The positions that may be slow: where the worker's medians are all finite, those at
    least the thresholds above the median of the others (`core.medians`, equal to
    `np.median` of the others: 2,048 of them one by one were 0.1 s); else all of them."""
    values = median_ready[positions]
    if len(positions) < 2 or not np.isfinite(values).all():
        return positions
    base = median_of_others(values[None, :])[0]
    with np.errstate(invalid="ignore"):
        slow = (values >= thresholds.slow_replica_factor * base) & (
            values - base >= thresholds.slow_replica_min_seconds
        )
    return [position for position, flag in zip(positions, slow, strict=True) if flag]


def slow_replicas(ready, thresholds=Thresholds()):
    """The global ids of the replicas `find_slow_replicas` names, in replica order."""
    return [r for f in find_slow_replicas(ready, thresholds) for r in f.replicas]


def _slow_finding(ready, position, others, own, base, wait, worker, thresholds):
    """The `slow_replica` finding of the replica at `position` (see `find_slow_replicas`)."""
    used = timed_windows(ready)
    steps, windows = ready.steps[used], ready.ready_median[used]
    with np.errstate(invalid="ignore"):
        at_step = np.median(windows[:, others], axis=1)
        slow = (windows[:, position] >= thresholds.slow_replica_factor * at_step) & (
            windows[:, position] - at_step >= thresholds.slow_replica_min_seconds
        )
    slow_steps = steps[slow] if np.any(slow) else steps
    ratio = own / base if base > 0 else float("inf")
    return Finding(
        kind="slow_replica",
        severity="warning",
        run=ready.run,
        first_step=int(slow_steps[0]),
        last_step=int(slow_steps[-1]),
        count=int(slow_steps.size),
        replicas=[ready.replicas[position]],
        name=ready.devices[position] or None,
        value=round(ratio, 3),
        threshold=thresholds.slow_replica_factor,
        message=slow_message(ready, position, own, base, wait, worker, int(steps.size)),
        view="step_time",
    )


def device_text(device):
    """ "GPU:1" from "/job:localhost/replica:0/task:0/device:GPU:1" (the device as given when
    it has no `device:` part; "" for none)."""
    found = re.search(r"device:([^/]+)$", device or "")
    return found.group(1) if found else (device or "")


def place_text(ready, position):
    """Where the replica at `position` runs: "GPU:1", "CPU:0 on worker_1", "on worker_1" or ""."""
    device = device_text(ready.devices[position])
    worker = ready.workers[position] if ready.workers else ""
    return " on ".join(p for p in (device, worker) if p) if device else (worker and f"on {worker}")


def slow_message(ready, position, own, base, wait, worker, windows):
    """The message of a `slow_replica` finding: the replica, its device, its ready time against
    the others', what the others wait for it, and what to look at (under
    ParameterServerStrategy: `pss_slow_message`)."""
    if ready.strategy == PSS:
        return pss_slow_message(ready, position, own, base, windows)
    device = device_text(ready.devices[position])
    where = place_text(ready, position)
    others = f"the other replicas of {worker}" if worker else "the other replicas"
    ratio = f"{own / base:.2f}×" if base > 0 else "while the others take no time"
    text = (
        f"Replica {ready.replicas[position]}{f' ({where})' if where else ''} is slow: it is "
        f"ready {own:.3f} s after the step starts against {base:.3f} s for {others} (median "
        f"per step over {windows} logged window{'s' if windows != 1 else ''}; {ratio}), so they "
        f"wait {wait:.3f} s per step for it at the all-reduce. Its ready time lasts until its "
        "local gradients reach the host. Look at its device (a throttled or busier GPU: "
        "nvidia-smi -q -d PERFORMANCE shows clocks and throttle reasons, and other processes on "
        "it) and at whether it gets more work than the others: uneven shapes (sequence lengths, "
        "padding per batch), a branch on the data or on the replica id."
    )
    if device.upper().startswith("CPU"):
        text += (
            " On CPU replicas (logical devices sharing the host's cores) it can also be "
            "contention for those cores rather than work of its own."
        )
    return text


def pss_slow_message(ready, position, own, base, windows):
    """The `slow_replica` message of a ParameterServerStrategy run (replica r: worker r, its
    times are its step seconds)."""
    device = ready.devices[position]
    ratio = f"{own / base:.2f}×" if base > 0 else "while the others take no time"
    return (
        f"Worker {ready.replicas[position]}{f' ({device})' if device else ''} is slow: its steps "
        f"take {own:.3f} s against {base:.3f} s for the other workers (median per step over "
        f"{windows} logged window{'s' if windows != 1 else ''}; {ratio}), each timed on its "
        "worker's clock from the scheduled step's start to its end. Under "
        "ParameterServerStrategy the workers do not wait for each other: it runs fewer steps, and "
        "its updates fall behind. Look at its input pipeline (dataset_fn), its host's load and "
        "hardware, and its network to the parameter servers."
    )


def find(run_data, thresholds=Thresholds()):
    """Stragglers of a multi-worker job (`find_stragglers`) or of a ParameterServerStrategy run
    (`find_pss_stragglers`), and slow replicas of any run or job (`find_slow_replicas`; a
    worker named as a `pss_straggler` is not named again as slow).

    Args:
      run_data: a `reader.RunData`.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding`.

    Example:
      >>> [f.kind for f in find(run_data)]
      ['slow_replica']
    """
    series = run_data.step_time
    workers = run_data.workers
    found = find_stragglers(series, workers, thresholds) if workers else []
    found += find_pss_stragglers(series, thresholds)
    named = {r for f in found if f.kind == "pss_straggler" for r in f.replicas}
    slow = find_slow_replicas(getattr(series, "ready", None), thresholds)
    # Under ParameterServerStrategy a pss_straggler's slow steps are said in its own finding.
    return found + [f for f in slow if not set(f.replicas) & named]
