"""The core subset's training, in its own process: one Keras flavour on 2 logical CPU replicas.

    python tests/window_child.py LOGDIR --flavour keras3|tf_keras

`tf.keras` is chosen once per process (`TF_USE_LEGACY_KERAS`, set here before TensorFlow is
imported), so each flavour trains in its own process. It writes two runs with every family the
write side records on one worker (`tests/test_window.py` reads them back):

- `LOGDIR/fit`: `model.fit` with a `ReplicaCallback` (`update_freq=1`, examples every step, one
  extra generator) on a model with `Dropout`: 17 examples, global batch 8 → [4, 4], [4, 4],
  [1, 0];
- `LOGDIR/loop`: the README's custom loop with a `ReplicaProbe` (inputs, examples, rng,
  gradients, variables, a watched value): 15 examples, global batch 7 → [4, 3], [4, 3], [1, 0].

Its last stdout line is a JSON document of facts: the versions it ran with, where
`tb_replica_plugin` was imported from, the warnings `tb_replica_plugin` raised and the model's
step counter.
"""

import argparse
import json
import os
import platform
import sys
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOBAL_BATCH_LOOP = 7


def _keras(flavour):
    """The Keras module of `flavour`, `tf.keras` pointing at it (set before TF's import)."""
    if flavour == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import tf_keras as keras
    else:
        os.environ.pop("TF_USE_LEGACY_KERAS", None)
        import keras
    return keras


def _strategy(tf):
    """A MirroredStrategy over 2 logical CPU devices (configured before any other TF use)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def train_fit(keras, tf, strategy, logdir):
    """`fit` with every family of `ReplicaCallback`: 17 examples, batch 8, one epoch.

    Returns:
      The optimizer's iterations after `fit`.
    """
    import numpy as np

    import tb_replica_plugin

    rng = np.random.default_rng(0)
    x = rng.normal(size=(17, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(4),
                keras.layers.Dropout(0.5, seed=1),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
        # tf_keras's Dropout draws from no generator the rng family can see: this one is seen
        # in both flavours (created under the scope: each replica its own stream).
        augment = tf.random.Generator.from_seed(2)
    model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
        epochs=1,
        verbose=0,
        callbacks=[
            tb_replica_plugin.ReplicaCallback(
                logdir,
                run_name="fit",
                update_freq=1,
                examples_every=1,
                generators={"augment": augment},
            )
        ],
    )
    return int(tf.convert_to_tensor(model.optimizer.iterations).numpy())


def train_loop(keras, tf, strategy, logdir):
    """The README's custom loop with every `observe_*` and `watch`: 15 examples, batch 7.

    Returns:
      The optimizer's iterations after the loop.
    """
    import tb_replica_plugin

    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
        noise = tf.random.Generator.from_seed(1)
    features = tf.random.stateless_normal((15, 8), seed=(1, 2))
    labels = tf.reduce_sum(features, axis=1, keepdims=True)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL_BATCH_LOOP)
    probe = tb_replica_plugin.ReplicaProbe(os.path.join(logdir, "loop"), strategy, update_freq=1)

    @tf.function
    def train_step(x, y):
        def step_fn(x, y):
            probe.observe_inputs({"x": x, "y": y})
            probe.observe_examples({"x": x, "y": y})
            probe.observe_rng({"noise": noise})
            x = x + 0.01 * noise.normal(tf.shape(x))
            with tf.GradientTape() as tape:
                logits = model(x)
                per_example = tf.reduce_mean(tf.square(logits - y), axis=1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_LOOP)
            probe.watch("logits", logits)
            grads = tape.gradient(loss, model.trainable_variables)
            probe.observe_gradients(
                grads, model.trainable_variables, loss=loss, scale=1 / strategy.num_replicas_in_sync
            )
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        strategy.run(step_fn, args=(x, y))

    for x, y in strategy.experimental_distribute_dataset(dataset):
        train_step(x, y)
        probe.observe_variables(model.variables + optimizer.variables)
    probe.close()
    return int(tf.convert_to_tensor(optimizer.iterations).numpy())


def _versions(keras, tf):
    """The versions this process ran with, and where the plugin came from."""
    import numpy as np
    import tensorboard

    import tb_replica_plugin

    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras_module": keras.__name__,
        "keras": keras.__version__,
        "tf_keras_is_keras": tf.keras.__name__.split(".")[0] == keras.__name__.split(".")[0],
        "numpy": np.__version__,
        "tensorboard": tensorboard.__version__,
        "plugin_file": tb_replica_plugin.__file__,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("--flavour", choices=("keras3", "tf_keras"), required=True)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    keras = _keras(args.flavour)
    import tensorflow as tf

    strategy = _strategy(tf)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        facts = {
            "fit_iterations": train_fit(keras, tf, strategy, args.logdir),
            "loop_iterations": train_loop(keras, tf, strategy, args.logdir),
        }
    facts["warnings"] = [str(w.message) for w in caught if "tb_replica_plugin" in str(w.message)]
    facts.update(_versions(keras, tf))
    print(json.dumps(facts), flush=True)


if __name__ == "__main__":
    sys.exit(main())
