"""Demo scenario of the step-time family: one replica slower than the others.

- `slow_replica`: Keras 3 `fit` with `ReplicaCallback` on the demo's replicas, where replica
  `SLOW_REPLICA` runs a chain of `SLOW_OPS` small dependent ops before its forward pass at every
  step, on the same batch as the others (a stand-in for a throttled GPU or a replica with more
  work: about 20 ms here). Its packed vector reaches the host later at every step, so its median
  ready time stands out: the report's `slow_replica` finding names it, and the other replicas
  wait for it at the all-reduce. `balanced` is its twin (the same work everywhere: no finding).

The extra work is a chain of short ops rather than a `tf.py_function` sleep: a sleeping op holds
one of the executor's threads (as many as the host has cores), which on CPU replicas delays the
replicas queued behind it as well, so several would look slow at once.
"""

import numpy as np

SLOW_REPLICA = 1
SLOW_OPS = 10_000  # iterations of a tiny while loop: about 20 ms per step on this host


def slow_replica_run(strategy, run_dir, examples=256, global_batch=32, epochs=2):
    """The `slow_replica` scenario into `run_dir` (see the module docstring)."""
    import keras
    import tensorflow as tf

    from tb_replica_plugin import ReplicaCallback

    class SlowOnOneReplica(keras.layers.Layer):
        """Passes its inputs on; replica `SLOW_REPLICA` first runs `SLOW_OPS` dependent ops."""

        def call(self, inputs):
            context = tf.distribute.get_replica_context()
            if context is None:  # Keras building the model outside a replica
                return inputs

            def extra_work():
                _, value = tf.while_loop(
                    lambda i, value: i < SLOW_OPS,
                    lambda i, value: (i + 1, tf.tanh(value) * 1.0001),
                    (tf.constant(0), tf.ones([16, 16])),
                )
                return tf.reduce_mean(value) * 0.0

            is_slow = tf.equal(context.replica_id_in_sync_group, SLOW_REPLICA)
            return inputs + tf.cond(is_slow, extra_work, lambda: tf.constant(0.0))

    rng = np.random.default_rng(5)
    x = rng.normal(size=(examples, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((8,)), SlowOnOneReplica(), keras.layers.Dense(16), keras.layers.Dense(1)]
        )
        model.compile(optimizer="sgd", loss="mse")
    model.fit(dataset, epochs=epochs, verbose=0, callbacks=[ReplicaCallback(run_dir)])
