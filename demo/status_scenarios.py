"""Demo scenarios of the status family: a `fit` that crashes on one replica.

- `crash`: Keras 3 `fit` with `ReplicaCallback` on the demo's replicas; one example of step
  `CRASH_STEP` holds a NaN and lands on replica `CRASH_REPLICA`, where the model's first layer
  asserts its inputs are finite (`tf.debugging.assert_all_finite`). `fit` raises
  `InvalidArgumentError` ("Detected at node replica_1/..."); the demo catches it and goes on. The
  report's `training_crashed` finding names the exception, the step, the replica and the line of
  `FiniteInputs.call`.

The multi-worker stall (`mw_stall`) lives in `demo/multiworker.py`.
"""

import numpy as np

CRASH_STEP = 3
CRASH_REPLICA = 1
CRASH_GLOBAL_BATCH = 16


def crash_run(strategy, run_dir, examples=96):
    """The `crash` scenario into `run_dir` (see the module docstring).

    Returns:
      The exception `fit` raised (an `InvalidArgumentError`).

    Raises:
      RuntimeError: if `fit` did not raise.
    """
    import keras
    import tensorflow as tf

    from tb_replica_plugin import ReplicaCallback

    class FiniteInputs(keras.layers.Layer):
        """Passes its inputs on; fails the step when one is NaN or infinite."""

        def call(self, inputs):
            # The checked tensor goes on: nothing downstream runs once the check fails, so the
            # step's NaN reaches no gradient and no output (the crash is the only finding).
            return tf.debugging.assert_all_finite(inputs, "an input is not finite")

    replicas = strategy.num_replicas_in_sync
    rng = np.random.default_rng(3)
    x = rng.normal(size=(examples, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    per_replica = CRASH_GLOBAL_BATCH // replicas
    # Step s's global batch is rows 16s..16s+15; replica r gets the r-th quarter (or half) of it.
    x[CRASH_STEP * CRASH_GLOBAL_BATCH + CRASH_REPLICA * per_replica + 1, 2] = np.nan
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(CRASH_GLOBAL_BATCH)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((8,)), FiniteInputs(), keras.layers.Dense(16), keras.layers.Dense(1)]
        )
        model.compile(optimizer="sgd", loss="mse")
    try:
        model.fit(dataset, epochs=2, verbose=0, callbacks=[ReplicaCallback(run_dir)])
    except tf.errors.InvalidArgumentError as error:
        return error
    raise RuntimeError("the crash scenario's fit did not raise")
