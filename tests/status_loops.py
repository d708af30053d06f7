"""A custom loop of tests/test_status.py and tests/notebook_child.py (no pytest: a child process
imports it too)."""

import numpy as np
import tensorflow as tf


def make_step(probe, strategy):
    """The loop's step: a `tf.function` observing its inputs; replica 1's step asserts that its
    batch is finite (`InvalidArgumentError`, "Detected at node replica_1/...")."""

    @tf.function
    def step(batch):
        def step_fn(x):
            probe.observe_inputs({"x": x})
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            tf.debugging.assert_all_finite(x * tf.cast(replica, tf.float32), "not finite")
            return tf.reduce_sum(x)

        return strategy.run(step_fn, args=(batch,))

    return step


def loop(probe, strategy, steps, fail_at=None, values=None, step=None):
    """A custom loop of `steps` steps (`step`, or a new `make_step`); at step `fail_at` replica
    1's batch holds a NaN."""
    step = make_step(probe, strategy) if step is None else step
    for index in range(steps):
        batch = np.ones([4, 2], np.float32)
        if index == fail_at:
            batch[3, 0] = np.nan  # rows 2..3 go to replica 1
        step(
            strategy.experimental_distribute_values_from_function(
                lambda context, b=batch: tf.constant(b[2 * context.replica_id_in_sync_group :][:2])
            )
        )
        if values is not None:
            values.append(index)
