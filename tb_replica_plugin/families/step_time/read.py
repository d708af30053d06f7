"""The step_time family read side: each replica's ready time, and per-worker step timing.

A run's series (`from_samples`) holds its replicas' ready times (`step_time/replicas`), or is
None when it recorded none; the per-worker timing (`workers/step_time`) compares workers, so it
is built when a job is merged (`merge.StepTimeMerger`), with the workers' ready times on the
global replica axis. Imports no TensorFlow.
"""

import dataclasses

import numpy as np

from tb_replica_plugin.core import columns
from tb_replica_plugin.families.step_time import schema


@dataclasses.dataclass
class ReplicaTimeSeries:
    """Each replica's ready time per logged window (`step_time/replicas`).

    A replica's *ready time* at a step is the host time from the step's start until the vector
    that replica sends once per step (its work up to its local gradients) has reached the host;
    its *wait* is how much later the slowest replica of its worker was ready (what it waits at
    the all-reduce). Each logged step closes a window of steps; values are window statistics.

    Attributes:
      run: the run (or job) name.
      replicas: global replica ids, the order of every per-replica axis.
      devices: the device of each replica.
      workers: in a job, the name of the worker holding each replica (same order); [] for a
        single run.
      steps: int64 [S], the logged steps (in a job: those every worker logged).
      ready_median: float64 [S, R], the median over the window of each replica's ready seconds.
      ready_max: float64 [S, R], their maximum over the window.
      wait_median: float64 [S, R], the median over the window of the seconds each replica
        waited for the slowest replica of its worker.
      window_steps: int64 [S, R], the steps the window held (one value per worker).
      strategy: `"ParameterServerStrategy"` for a run of that strategy (replica r: worker r,
        times are each worker's step seconds, waits 0), else "".
    """

    run: str
    replicas: list
    devices: list
    workers: list
    steps: np.ndarray
    ready_median: np.ndarray
    ready_max: np.ndarray
    wait_median: np.ndarray
    window_steps: np.ndarray
    strategy: str = ""
    # `rules.ready_medians`' `(ready_median, its medians)`: computed once per series.
    medians_cache: tuple = dataclasses.field(default=None, init=False, repr=False, compare=False)


@dataclasses.dataclass
class PssWorkerTotals:
    """Each worker's totals of a `ParameterServerStrategy` run (`step_time/pss_workers`): every
    step it ran, also those beyond the slowest worker that were never written as steps.

    Attributes:
      step: the step of the sample read (the last written).
      steps_run: int64 [W], the steps each worker ran (worker w: replica w).
      busy: float64 [W], the sum of its steps' seconds (start to end on its clock).
      span: float64 [W], seconds from its first step's start to its last step's end.
      rate: float64 [W], its steps per second (`steps_run / span`; 0 when span is 0).
    """

    step: int
    steps_run: np.ndarray
    busy: np.ndarray
    span: np.ndarray
    rate: np.ndarray

    def step_seconds(self):
        """float64 [W]: each worker's mean seconds per step (`busy / steps_run`; NaN for a
        worker that ran none)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.steps_run > 0, self.busy / np.maximum(self.steps_run, 1), np.nan)


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
    ready: ReplicaTimeSeries | None = None
    pss: PssWorkerTotals | None = None

    @classmethod
    def of_replicas(cls, run, ready):
        """A series with replica ready times only (a single run; a job whose workers logged no
        `workers/step_time`): no workers, per-worker arrays of 0 steps.

        Example:
          >>> StepTimeSeries.of_replicas("run", ready).busy.shape
          (0, 0)
        """
        empty = np.zeros((0, 0))
        return cls(
            run=run,
            workers=[],
            steps=np.zeros((0,), np.int64),
            arrival=empty,
            period=empty,
            window_mean=empty,
            lateness=empty,
            busy=empty,
            ready=ready,
        )


def from_samples(run, samples, notes, needed=None):
    """The step_time series of one run: its replicas' ready times (`step_time/replicas`).

    The per-worker timing (`workers/step_time`) is built only when a job is merged.

    Args:
      run: the run name.
      samples: `{tag: [(step, numpy value)]}` sorted by step.
      notes: the run's notes list (malformed samples are noted there).
      needed: `{"inputs": InputsSeries}`: the run's replica ids and devices.

    Returns:
      A `StepTimeSeries` whose `ready` holds the ready times (`StepTimeSeries.of_replicas`), or
      None when the run has no readable ready time.

    Example:
      >>> from_samples("run", {"step_time/replicas": [(0, value)]}, [], {"inputs": inputs}).ready
      ReplicaTimeSeries(run='run', replicas=[0, 1], ...)
    """
    points = samples.get(schema.TAG_REPLICA_TIME, [])
    ready = None
    if points:
        ready = read_replica_times(run, points, (needed or {}).get("inputs"), notes)
    totals = read_pss_totals(samples.get(schema.TAG_PSS_WORKERS, []), notes)
    if ready is None and totals is None:
        return None
    series = StepTimeSeries.of_replicas(run, ready)
    series.pss = totals
    return series


def read_pss_totals(points, notes):
    """The workers' totals of the last readable `step_time/pss_workers` sample, or None.

    A sample is readable when it is a float array [4, W] (W >= 1) of finite values, none
    negative; others are skipped with a note.

    Args:
      points: `[(step, numpy value)]` sorted by step.
      notes: the run's notes list (appended to).

    Returns:
      A `PssWorkerTotals`, or None.

    Example:
      >>> read_pss_totals([(5, np.array([[6, 2], [0.6, 0.8], [1.2, 1.0], [5, 2]]))], []).rate
      array([5., 2.])
    """
    kept, bad = None, 0
    for step, value in points:
        value = np.asarray(value)
        ok = value.ndim == 2 and value.shape[0] == schema.PSS_WORKERS_ROWS and value.shape[1]
        ok = ok and value.dtype.kind in "fiu" and bool(np.all(np.isfinite(value)))
        if not ok or np.any(value < 0):
            bad += 1
            continue
        kept = (int(step), value.astype(np.float64))
    if bad:
        notes.append(
            f"{bad} worker totals sample(s) skipped: each should be {schema.PSS_WORKERS_ROWS} "
            f"rows of finite, non-negative values per worker ({schema.TAG_PSS_WORKERS}, "
            "docs/data-format.md)."
        )
    if kept is None:
        return None
    step, value = kept
    return PssWorkerTotals(
        step=step,
        steps_run=value[schema.PSS_STEPS_RUN].astype(np.int64),
        busy=value[schema.PSS_BUSY],
        span=value[schema.PSS_SPAN],
        rate=value[schema.PSS_RATE],
    )


def read_replica_times(run, points, inputs, notes):
    """A `ReplicaTimeSeries` from `step_time/replicas` samples; malformed ones skipped, noted.

    A sample is kept when it is a float array [4, R] (R: the run's replicas, `inputs.replicas`)
    of finite values, times not negative and a window of at least one step. A later sample at
    the same step replaces an earlier one.

    Args:
      run: the run name.
      points: `[(step, numpy value)]` sorted by step.
      inputs: the run's `InputsSeries` (replica ids and devices), or None.
      notes: the run's notes list (appended to).

    Returns:
      A `ReplicaTimeSeries`, or None when no sample is readable.
    """
    replicas = list(inputs.replicas) if inputs is not None else []
    devices = list(inputs.devices) if inputs is not None else []
    if not replicas:
        width = np.asarray(points[0][1]).shape[-1] if np.ndim(points[0][1]) == 2 else 0
        replicas, devices = list(range(width)), [""] * width
        if width:
            notes.append(
                "Replica ready times name no replicas (the run has no inputs/shapes event): "
                f"they are shown as replicas 0–{width - 1} in the order written."
            )
    steps, table, bad = _readable_samples(points, len(replicas))
    if bad:
        notes.append(
            f"{bad} replica ready-time sample(s) skipped: each should be "
            f"{schema.REPLICA_TIME_ROWS} rows of finite, non-negative values for the run's "
            f"{len(replicas)} replicas "
            f"({schema.TAG_REPLICA_TIME}, docs/data-format.md)."
        )
    if not len(steps):
        return None
    return ReplicaTimeSeries(
        strategy=str(getattr(inputs, "strategy", "") or ""),
        run=run,
        replicas=[int(r) for r in replicas],
        devices=[str(d) for d in devices] + [""] * (len(replicas) - len(devices)),
        workers=[],
        steps=steps,
        ready_median=table[:, schema.READY_MEDIAN],
        ready_max=table[:, schema.READY_MAX],
        wait_median=table[:, schema.WAIT_MEDIAN],
        window_steps=table[:, schema.WINDOW_STEPS].astype(np.int64),
    )


def _readable_samples(points, replicas):
    """The samples with the layout of `schema` for `replicas`, taken by shape (`columns`).

    Returns:
      `(steps, table, skipped)`: int64 [S] in step order, one sample per step (the last one
      written); float64 [S, 4, R]; how many samples were not readable.
    """
    kept_positions, kept_values = [], []
    for group in columns.by_shape(points):
        if group.shape != (schema.REPLICA_TIME_ROWS, replicas) or not replicas:
            continue
        values = group.values
        if values.dtype.kind not in "fiu":  # a list of values of mixed kinds: each on its own
            each = [np.asarray(points[i][1]) for i in group.positions]
            ok = np.array([_readable(value, replicas) for value in each], bool)
            kept_each = [value for value, good in zip(each, ok, strict=True) if good]
            values = np.array(kept_each, np.float64).reshape(-1, *group.shape)
        else:
            ok = np.isfinite(values).all(axis=(1, 2)) & (values >= 0).all(axis=(1, 2))
            ok &= (values[:, schema.WINDOW_STEPS] >= 1).all(axis=1)
            values = values[ok]
        kept_positions.append(group.positions[ok])
        kept_values.append(values.astype(np.float64, copy=False))
    positions = np.concatenate(kept_positions) if kept_positions else np.zeros(0, np.int64)
    if not positions.size:
        return positions, None, len(points)
    order = np.argsort(positions, kind="stable")  # the order written: the last one wins
    steps = columns.steps_of(points)[positions[order]]
    table = np.concatenate(kept_values)[order]
    steps, table = columns.last_per_step(steps.astype(np.int64, copy=False), table)
    return steps, table, len(points) - positions.size


def _readable(value, replicas):
    """Whether a `step_time/replicas` sample has the layout of `schema` for `replicas`."""
    if value.shape != (schema.REPLICA_TIME_ROWS, replicas) or not replicas:
        return False
    if value.dtype.kind not in "fiu" or not np.all(np.isfinite(value)):
        return False
    return bool(np.all(value >= 0) and np.all(value[schema.WINDOW_STEPS] >= 1))
