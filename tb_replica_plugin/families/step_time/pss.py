"""Step-time family under `ParameterServerStrategy`: each worker's step seconds and steps run.

Each scheduled step's record carries its start and end on its worker's clock (`write/pss.py`,
`StepRecord`). On the coordinator, in numpy:

- every step a worker ran is counted as it is fetched (`ran`), also the steps beyond the slowest
  worker that are never written: each worker's steps run, seconds busy (the sum of its steps'
  end minus start) and the span from its first step's start to its last step's end;
- each written step k (every worker's k-th) adds each worker's seconds to the window
  (`deliver`), written as `step_time/replicas` (replica r: worker r) at logged steps and at
  `flush`/`close`: the window's median and largest step seconds per worker, 0 (no all-reduce:
  the workers do not wait for each other), the window's steps;
- at `flush`/`close` the totals are written as `step_time/pss_workers` (`schema`).

A write is one eager summary op.
"""

import numpy as np
import tensorflow as tf

from tb_replica_plugin.families.step_time import schema


class Totals:
    """The coordinator's step-time state of `workers` workers (host side, numpy)."""

    def __init__(self, workers):
        self.steps = np.zeros(workers, np.int64)
        self.busy = np.zeros(workers, np.float64)
        self.first = np.full(workers, np.nan)
        self.last = np.full(workers, np.nan)
        self.window = []  # each written step's seconds per worker, float64 [W]
        self.last_step = -1  # the last step delivered
        self.written = None  # the last totals written (not written again unchanged)


def _totals(recorder):
    totals = recorder.pss_totals
    if totals is None:
        totals = recorder.pss_totals = Totals(recorder.probe.num_replicas)
    return totals


def ran(recorder, records):
    """Counts steps the workers ran (every fetched one, written or not).

    Args:
      recorder: the step_time family's `Recorder` (its `pss_totals`, a `Totals`).
      records: `StepRecord`s (`worker`, `start`, `end`: seconds on the worker's clock).
    """
    totals = _totals(recorder)
    for record in records:
        w = record.worker
        if not 0 <= w < totals.steps.size:
            continue  # a worker the probe does not know of: not one of the run's replicas
        totals.steps[w] += 1
        totals.busy[w] += max(record.end - record.start, 0.0)
        totals.first[w] = np.fmin(totals.first[w], record.start)
        totals.last[w] = np.fmax(totals.last[w], record.end)


def deliver(recorder, rows, step):
    """Step `step` of every worker (each its `step`-th): its seconds join the window, written
    at logged steps (`update_freq`).

    Args:
      recorder: the step_time family's `Recorder`.
      rows: per worker, its `StepRecord` of that step.
      step: the step.
    """
    totals = _totals(recorder)
    totals.window.append(np.array([max(row.end - row.start, 0.0) for row in rows], np.float64))
    totals.last_step = step
    update_freq = recorder.probe.update_freq
    if update_freq is not None and step % update_freq == 0:
        _write_steps(recorder, totals)


def window_rows(seconds):
    """float64 [4, W]: the `step_time/replicas` rows of a window under this strategy.

    Args:
      seconds: float64 [S, W], each written step's seconds per worker (S >= 1).

    Returns:
      Rows: median and largest seconds per worker, 0 (no wait), the window's steps.

    Example:
      >>> window_rows(np.array([[0.1, 0.3], [0.2, 0.5]]))[:, 1].tolist()
      [0.4, 0.5, 0.0, 2.0]
    """
    count = np.full(seconds.shape[1], float(seconds.shape[0]))
    zero = np.zeros(seconds.shape[1])
    return np.stack([np.median(seconds, axis=0), seconds.max(axis=0), zero, count])


def _write_steps(recorder, totals):
    if not totals.window:
        return
    rows = window_rows(np.stack(totals.window))
    recorder.probe.write_now(
        schema.TAG_REPLICA_TIME,
        lambda: tf.constant(rows, tf.float64),
        totals.last_step,
        schema.KIND_REPLICA_TIME,
    )
    totals.window = []


def totals_rows(totals):
    """float64 [4, W]: the `step_time/pss_workers` rows (steps run, seconds busy, seconds
    spanned, steps per second; 0 for a worker that ran no step)."""
    span = np.nan_to_num(totals.last - totals.first, nan=0.0)
    span = np.maximum(span, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(span > 0, totals.steps / span, 0.0)
    return np.stack([totals.steps.astype(np.float64), totals.busy, span, rate])


def write_window(recorder):
    """At `flush`/`close`: the pending window, and the totals when they changed (at the last
    written step, 0 before any)."""
    totals = recorder.pss_totals
    if totals is None:
        return
    _write_steps(recorder, totals)
    rows = totals_rows(totals)
    if totals.written is not None and np.array_equal(rows, totals.written):
        return
    recorder.probe.write_now(
        schema.TAG_PSS_WORKERS,
        lambda: tf.constant(rows, tf.float64),
        max(totals.last_step, 0),
        schema.KIND_PSS_WORKERS,
    )
    totals.written = rows
