"""The step_time family read side: per-worker step timing, built when a job is merged.

A single run has no step_time series (`from_samples` gives None): the timing compares workers.
Imports no TensorFlow.
"""

import dataclasses

import numpy as np

from tb_replica_plugin.families.step_time import schema


@dataclasses.dataclass
class StepTimeSeries:
    """Per-worker step timing of a multi-worker job, at the steps every worker logged.

    Times are host wall-clock seconds taken in-graph (`tf.timestamp`) when a worker's inputs of
    the step were ready (where `observe_inputs` runs). In a synchronous job every worker waits
    at the all-reduce for the last one, so all workers have the same period; what differs is
    when they arrive. A worker's `busy` time is its period minus the time it waited for the
    last worker to arrive: the time per step it would take alone.

    Attributes:
      run: the job name.
      workers: worker names (`worker_0`, ...), the order of every per-worker axis.
      steps: int64 [S], steps logged by every worker.
      arrival: float64 [S, W], wall-clock seconds (since the epoch) of each worker's arrival.
      period: float64 [S, W], seconds since the worker's previous step (NaN at its first).
      window_mean: float64 [S, W], mean seconds per step over the logging window (NaN at first).
      lateness: float64 [S, W], seconds after the first worker's arrival at that step.
      busy: float64 [S, W], `max(0, period - (latest arrival - arrival))` (NaN where period is
        NaN).
    """

    run: str
    workers: list
    steps: np.ndarray
    arrival: np.ndarray
    period: np.ndarray
    window_mean: np.ndarray
    lateness: np.ndarray
    busy: np.ndarray


def from_samples(run, samples, notes, needed=None):
    """None: a run on its own has no step_time series (see `merge`)."""
    return None


def merge_step_time(job, member_runs, workers, notes):
    """The `StepTimeSeries` of a job from each worker's `workers/step_time` samples.

    Args:
      job: the job name.
      member_runs: the workers' `RunData`, in worker order.
      workers: the per-worker grouping.
      notes: the job's notes list (appended to).

    Returns:
      A `StepTimeSeries` over the steps every worker logged, or None if no worker logged any.
    """
    per_worker = [
        {
            step: np.asarray(value, np.float64)
            for step, value in m.samples.get(schema.TAG_STEP_TIME, [])
        }
        for m in member_runs
    ]
    if not any(per_worker):
        return None
    common = sorted(set.intersection(*(set(p) for p in per_worker)))
    if any(len(p) != len(common) for p in per_worker):
        notes.append(
            "Step times are compared at the steps every worker logged; some workers logged "
            "steps the others did not."
        )
    shape = (len(common), len(per_worker))
    table = np.full(shape + (3,), np.nan)
    for w, points in enumerate(per_worker):
        for i, step in enumerate(common):
            value = points[step]
            if value.shape == (3,):
                table[i, w] = value
    arrival, period, window_mean = table[..., 0], table[..., 1], table[..., 2]
    if arrival.size:
        with np.errstate(invalid="ignore"):
            first = np.nanmin(arrival, axis=1, keepdims=True) if shape[1] else arrival
            last = np.nanmax(arrival, axis=1, keepdims=True) if shape[1] else arrival
    else:
        first = last = arrival
    return StepTimeSeries(
        run=job,
        workers=[w["name"] for w in workers],
        steps=np.array(common, dtype=np.int64),
        arrival=arrival,
        period=period,
        window_mean=window_mean,
        lateness=arrival - first,
        # Clamped at 0: a worker that started its first steps late can show a period shorter
        # than its wait right after.
        busy=np.maximum(period - (last - arrival), 0.0),
    )
