"""Step-time family, write side: each replica's ready time, and each worker's step time.

A step scope (`ReplicaProbe.step()`, the train step of `ReplicaCallback`) is timed by the core
(`core.transfer`): a host timestamp at the step's start and one when each replica's packed vector
has arrived on the host. A replica's *ready time* is the second minus the first: its forward and
backward pass up to the values it sends (on an accelerator, the end of that work: the stamp waits
for the copy, a data dependency). This recorder keeps every timed step in a ring of the last
`RING_STEPS` steps (step, start, arrivals: one row, one scatter per step; a step where a
replica's gradients or loss were not finite gets no step number, so it is not timed) and writes,
at logged steps in-graph and from the host at window writes (epoch ends, `flush`, `close`), the
window's statistics (`step_time/replicas`, `schema.TAG_REPLICA_TIME`): each replica's median and
largest ready time and the median time it waited for the slowest replica of its worker, over the
steps since the previous write (its last `RING_STEPS` steps when it holds more: the medians and the
largest value are those of these steps, and the count says how many they are).

In a multi-worker job it also records the worker's step time (`workers/step_time`): when the
step's inputs were ready on the host (the step's start in a scope; outside one, the arrival of
the inputs family's transfer), the time since the previous step and the mean over the window.
"""

import math

import numpy as np
import tensorflow as tf

from tb_replica_plugin.core import transfer as transfer_lib
from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from tb_replica_plugin.families.step_time import pss, schema

# Timed steps kept for the window statistics (per replica: a step's start and arrival).
RING_STEPS = 256
# Columns of the ring: the step, its start, then each replica's arrival.
_STEP, _START = 0, 1
# Slots of the float64 timing variable of a multi-worker worker's probe.
_LAST_TIME, _LAST_PERIOD, _WIN_TIME, _WIN_STEPS, _LAST_STEP = range(5)
_NONE = np.iinfo(np.int64).min


def window_stats(ring, after, upto):
    """float64 [4, R]: the rows of `schema.TAG_REPLICA_TIME` over the ring's steps in
    (`after`, `upto`], and the number of those steps (works eagerly and in-graph).

    Args:
      ring: float64 [steps, 2 + R] (step, start, arrival of each replica), NaN rows unused.
      after: int64 scalar, the last step of the previous window.
      upto: int64 scalar, the last step of this window.

    Returns:
      `(rows, count)`: float64 [4, R] and an int64 scalar (rows are NaN when it is 0).

    Example:
      >>> ring = tf.constant([[0.0, 10.0, 10.5, 10.2], [1.0, 11.0, 11.4, 11.1]], tf.float64)
      >>> window_stats(ring, tf.constant(-1, tf.int64), tf.constant(1, tf.int64))[0].numpy()
      array([[0.45, 0.15], [0.5 , 0.2 ], [0.  , 0.3 ], [2.  , 2.  ]])
    """
    steps = ring[:, _STEP]
    valid = tf.logical_and(steps > tf.cast(after, tf.float64), steps <= tf.cast(upto, tf.float64))
    # [steps, R]; not below 0: on a tiny step the start's stamp can come after an arrival
    # (scheduling jitter), and readers skip a negative time as malformed.
    ready = tf.maximum(ring[:, 2:] - ring[:, _START : _START + 1], 0.0)
    wait = tf.reduce_max(ready, axis=1, keepdims=True) - ready
    count = tf.reduce_sum(tf.cast(valid, tf.int64))
    column = valid[:, None]
    largest = tf.reduce_max(tf.where(column, ready, -math.inf), axis=0)
    rows = tf.stack(
        [
            _median(ready, column, count),
            largest,
            _median(wait, column, count),
            tf.fill(tf.shape(largest), tf.cast(count, tf.float64)),
        ]
    )
    return tf.where(count > 0, rows, math.nan), count


def _median(values, valid, count):
    """float64 [R]: the median of each column of `values` over its `valid` rows (the mean of
    the two middle values for an even count, as `np.median`)."""
    ordered = tf.sort(tf.where(valid, values, math.inf), axis=0)
    low = tf.maximum(count - 1, 0) // 2
    return (tf.gather(ordered, low) + tf.gather(ordered, count // 2)) / 2.0


class Recorder(RecorderBase):
    """State and writes of the step-time family."""

    name = "step_time"
    pss_totals = None  # `pss.Totals` under ParameterServerStrategy

    def pss_ran(self, records):
        """`ParameterServerStrategy`: steps the workers ran, as fetched (see `pss.ran`)."""
        pss.ran(self, records)

    def pss_steps(self, rows, step):
        """`ParameterServerStrategy`: every worker's `step`-th step (see `pss.deliver`)."""
        pss.deliver(self, rows, step)

    def create_state(self):
        width = 2 + self.probe.num_replicas
        self.variable("ring", tf.fill([RING_STEPS, width], tf.constant(math.nan, tf.float64)))
        # The last step of the last written window (int64 min: none yet).
        self.variable("written", _NONE, tf.int64)
        if self.probe.worker is not None:
            # Step timing (multi-worker jobs only), wall-clock seconds, NaN until known:
            # last arrival, last period, arrival at the window start, steps in window, the
            # last step timed.
            self.variable("timing", [math.nan, math.nan, math.nan, 0.0, -1.0], tf.float64)

    def delivered(self, delivery):
        if delivery.step is not None and delivery.arrival_stamps is not None:
            self._record_ready(delivery)
            if "timing" in self.state:
                self._record_time(delivery.start, delivery.step)
        elif "timing" in self.state and "inputs" in delivery.cache.get("steps", {}):
            # Outside a step scope: when the inputs' transfer arrived (every replica's).
            with tf.device("/cpu:0"), tf.control_dependencies([delivery.matrix]):
                now = transfer_lib.independent(tf.timestamp())
            self._record_time(now, delivery.cache["steps"]["inputs"])

    def _record_ready(self, delivery):
        """Keeps the step's start and arrivals in the ring; writes the window at logged steps."""
        probe = self.probe
        step = delivery.step
        with tf.device("/cpu:0"):
            at = tf.cast(step, tf.float64)
            finite = delivery.cache.get(transfer_lib.GRADIENTS_FINITE)
            if finite is not None:
                # A faulty step is not timed: its faulty replica also ran the fault branch
                # (NaN/Inf counts over every gradient), the tool's work, not the replica's.
                at = tf.where(finite, at, math.nan)
            row = tf.stack([at, delivery.start, *delivery.arrival_stamps])
            tf.raw_ops.ResourceScatterUpdate(
                resource=self.state["ring"].handle, indices=step % RING_STEPS, updates=row
            )
        if probe.update_freq is None:
            return  # the host writes the window (`write_window`)
        written = self.state["written"]

        def write():
            rows, count = window_stats(self.state["ring"].read_value(), written.read_value(), step)
            kept = [(schema.TAG_REPLICA_TIME, lambda: rows, schema.KIND_REPLICA_TIME)]
            # Under the gated condition; a window of faulty steps alone has no timed step.
            probe.write_all(count > 0, kept, step, gate=False)
            written.assign(step)

        # With the other families' writes of a logged step, in one cond (`when`).
        probe.when(probe.gated(probe.logged(step)), write)

    def _record_time(self, now, step):
        """Step timing of a multi-worker job: arrival time, period, window mean (in-graph)."""
        probe = self.probe
        timing = self.state["timing"]
        last_time, _, win_time, win_steps, _ = tf.unstack(timing.read_value())
        period = now - last_time
        steps = win_steps + 1.0
        mean = (now - win_time) / steps
        write = tf.constant(False)
        if probe.update_freq is not None:
            write = probe.logged(step)
            probe.write(
                write,
                schema.TAG_STEP_TIME,
                lambda: tf.stack([now, period, mean]),
                step,
                schema.KIND_STEP_TIME,
            )
        timing.assign(
            tf.stack(
                [
                    now,
                    period,
                    tf.where(write, now, win_time),
                    tf.where(write, tf.constant(0.0, tf.float64), steps),
                    tf.cast(step, tf.float64),
                ]
            )
        )

    def write_window(self):
        if self.pss_totals is not None:  # ParameterServerStrategy: the coordinator's totals
            pss.write_window(self)
            return
        ring = self.state.get("ring")
        if ring is None:
            return
        self._write_ready_window(ring)
        self._write_time_window()

    def _write_ready_window(self, ring):
        """Host side: the ready-time window since the last write, if it holds a step."""
        values = ring.numpy()
        written = int(self.state["written"].numpy())
        steps = values[:, _STEP]
        pending = steps[~np.isnan(steps)]
        pending = pending[pending > written]
        if pending.size == 0:
            return
        last = int(pending.max())
        rows, count = window_stats(
            tf.constant(values), tf.constant(written, tf.int64), tf.constant(last, tf.int64)
        )
        if int(count) > 0:
            self.probe.write_now(
                schema.TAG_REPLICA_TIME, lambda: rows, last, schema.KIND_REPLICA_TIME
            )
        self.state["written"].assign(last)

    def _write_time_window(self):
        """Host side: the step time of the last step of a window that had no in-graph write."""
        timing = self.state.get("timing")
        if timing is None or float(timing.numpy()[_WIN_STEPS]) == 0:
            return
        last, period, start, steps, step = (float(v) for v in timing.numpy())
        self.probe.write_now(
            schema.TAG_STEP_TIME,
            lambda: tf.constant([last, period, (last - start) / steps], tf.float64),
            int(step),
            schema.KIND_STEP_TIME,
        )
        timing.assign([last, period, last, 0.0, step])
