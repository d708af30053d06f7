"""The step_time family of a multi-worker job, merged one worker at a time (`StepTimeMerger`).

Two parts, each into its own job arrays (`core.jobs.StepArrays`) as each worker is read: the
workers' step timing (`workers/step_time`: arrival, period and window mean, one column per
worker) and their replicas' ready times (`step_time/replicas`, on the job's replica axis). The
job's series shows the steps every worker logged. Imports no TensorFlow.
"""

import numpy as np

from tb_replica_plugin.core import columns, jobs
from tb_replica_plugin.families.step_time import schema
from tb_replica_plugin.families.step_time.read import ReplicaTimeSeries, StepTimeSeries

# The columns of a worker's `workers/step_time` value.
TIMING_VALUES = 3
READY_TIMES_ABSENT_NOTE = (
    "Replica ready times are left out of the job: {names} recorded none (the other workers did); "
    "each worker's own run shows its own."
)


class StepTimeMerger(jobs.Merger):
    """Merges a job's step timing and ready times, one worker at a time.

    Example:
      >>> merger = StepTimeMerger(expected_workers=2)
      >>> for slot, member in enumerate(members):
      ...     merger.add(slot, member, None)
      >>> merger.result("job", [0, 1], workers, []).arrival.shape  # [steps, workers]
      (3, 2)
    """

    attribute = "step_time"

    def __init__(self, expected_workers=1):
        super().__init__(expected_workers)
        self.timing = jobs.StepArrays(expected_workers)
        self.timing.declare(
            "timing", (self.expected_workers, TIMING_VALUES), np.float64, np.nan, slot_axes=(0,)
        )
        self.timed = set()  # slots that logged a step timing
        self.ready = jobs.StepArrays(expected_workers)
        self.ready.declare("ready", (schema.REPLICA_TIME_ROWS, 0), np.float64, np.nan, (1,))
        self.axis = jobs.ReplicaAxis()
        self.ready_parts = {}  # slot -> (replicas, devices) of a worker with ready times
        self.ready_steps = set()  # every step some worker logged ready times at

    sample_tags = (schema.TAG_STEP_TIME,)

    def add(self, slot, member, since):
        """Writes worker `slot`'s step timing and ready times from step `since` on (all: None).

        Raises:
          jobs.Irregular: if the worker's replicas changed.
        """
        self._add_timing(slot, member.samples, since)
        series = self.series_of(slot, member)
        ready = getattr(series, "ready", None)
        if ready is not None:
            self._add_ready(slot, ready, since)

    def _add_timing(self, slot, samples, since):
        steps, values = worker_step_times(samples.get(schema.TAG_STEP_TIME, []))
        keep = steps >= since if since is not None else slice(None)
        self.timed.update([slot] if steps.size else [])
        # Every worker is placed (with no steps too): a worker without timing leaves no step
        # that every worker logged.
        rows = self.timing.place(slot, steps[keep])
        self.timing.write(slot, "timing", rows, slot, values[keep])

    def _add_ready(self, slot, ready, since):
        layout = (list(ready.replicas), list(ready.devices))
        if self.ready_parts.setdefault(slot, layout) != layout:
            raise jobs.Irregular(f"worker slot {slot}: other replicas")
        columns = self.axis.add(slot, len(ready.replicas))
        # As wide as the expected workers' replicas at the first worker (not doubling up to
        # it: 8 copies of the array at 256 workers, 0.2 s of a first read).
        self.ready.widen(max(self.axis.total, self.expected_workers * len(ready.replicas)))
        keep = ready.steps >= since if since is not None else slice(None)
        self.ready_steps.update(ready.steps[keep].tolist())
        table = np.empty((ready.steps.size, schema.REPLICA_TIME_ROWS, len(ready.replicas)))
        table[:, schema.READY_MEDIAN] = ready.ready_median
        table[:, schema.READY_MAX] = ready.ready_max
        table[:, schema.WAIT_MEDIAN] = ready.wait_median
        table[:, schema.WINDOW_STEPS] = ready.window_steps
        rows = self.ready.place(slot, ready.steps[keep])
        self.ready.write(slot, "ready", rows, columns, table[keep])

    def result(self, job, order, workers, notes):
        """The job's `StepTimeSeries` over the steps every worker logged, with `ready` the
        merged ready times, or None if the job has neither."""
        ready = self._ready_result(job, order, workers, notes)
        timing = self._timing_result(job, order, workers, notes)
        if timing is None:
            return None if ready is None else StepTimeSeries.of_replicas(job, ready)
        timing.ready = ready
        return timing

    def _ready_result(self, job, order, workers, notes):
        """The ready times on the global replica axis at the steps every worker logged, or None
        (noted when some workers recorded none)."""
        have = [slot in self.ready_parts for slot in order]
        missing = jobs.note_workers_without(workers, have, notes, READY_TIMES_ABSENT_NOTE)
        if missing is None or missing:
            return None
        self.ready.drop_dead()
        rows = self.ready.complete_rows()
        steps = np.asarray(self.ready.steps[rows], np.int64)
        dropped = len(self.ready_steps) - steps.size
        if dropped:
            notes.append(
                f"Replica ready times are compared at the {steps.size} logged step(s) every "
                f"worker has; {dropped} logged step(s) some workers lack are left out."
            )
        table = self.ready.view("ready", rows, self.axis.total, self.axis.order(order))
        parts = [self.ready_parts[slot] for slot in order]
        return ReplicaTimeSeries(
            run=job,
            replicas=[r for replicas, _ in parts for r in replicas],
            devices=[d for _, devices in parts for d in devices],
            workers=[
                w["name"] for w, (replicas, _) in zip(workers, parts, strict=True) for _ in replicas
            ],
            steps=steps,
            ready_median=table[:, schema.READY_MEDIAN],
            ready_max=table[:, schema.READY_MAX],
            wait_median=table[:, schema.WAIT_MEDIAN],
            window_steps=table[:, schema.WINDOW_STEPS].astype(np.int64),
        )

    def _timing_result(self, job, order, workers, notes):
        """The per-worker `StepTimeSeries` (`ready` None), or None if no worker logged any."""
        if not self.timed:
            return None
        self.timing.drop_dead()
        rows = self.timing.complete_rows()
        steps = np.asarray(self.timing.steps[rows], np.int64)
        if any(self.timing.logged.get(slot, 0) != steps.size for slot in order):
            notes.append(
                "Step times are compared at the steps every worker logged; some workers logged "
                "steps the others did not."
            )
        table = self.timing.arrays["timing"][rows][:, order]  # [S, W, 3]
        return worker_timing(job, [w["name"] for w in workers], steps, table)


def worker_timing(job, names, steps, table):
    """A `StepTimeSeries` (no `ready`) from each worker's timing values at the steps.

    Args:
      job: the job name; names: the workers' names.
      steps: int64 [S]; table: float64 [S, W, 3]: arrival, period, window mean.
    """
    arrival, period, window_mean = table[..., 0], table[..., 1], table[..., 2]
    first = last = arrival
    if arrival.size:
        with np.errstate(invalid="ignore"):
            first = np.nanmin(arrival, axis=1, keepdims=True)
            last = np.nanmax(arrival, axis=1, keepdims=True)
    return StepTimeSeries(
        run=job,
        workers=list(names),
        steps=steps,
        arrival=arrival,
        period=period,
        window_mean=window_mean,
        lateness=arrival - first,
        # Clamped at 0: a worker that started its first steps late can show a period shorter
        # than its wait right after.
        busy=np.maximum(period - (last - arrival), 0.0),
    )


def worker_step_times(samples):
    """One worker's `workers/step_time` samples as `(steps, values)`: int64 [N] ascending and
    unique (a step logged twice keeps its last value), float64 [N, 3] (NaN for a sample not of
    3 values)."""
    steps = columns.steps_of(samples)
    if isinstance(samples, columns.Column) and samples.values.dtype.kind in "fiu":  # stacked
        values = samples.values.astype(np.float64).reshape(len(samples), -1)
    else:
        try:
            values = np.array([value for _, value in samples], np.float64)
            values = values.reshape(len(samples), -1)
        except ValueError:  # samples of different shapes (or none)
            values = np.zeros((len(samples), 0))
    if values.shape[1] != TIMING_VALUES:
        values = np.full((len(samples), TIMING_VALUES), np.nan)
        for i, (_, value) in enumerate(samples):
            if np.shape(value) == (TIMING_VALUES,):
                values[i] = value
    # The last of each step: the first in reversed order.
    unique, first = np.unique(steps[::-1], return_index=True)
    return unique, values[::-1][first]
