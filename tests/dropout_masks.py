"""Test helper: a Keras `fit` whose dropout layers record the mask each replica actually applied.

Two layers: a stock Keras `Dropout` subclass that only records (`outputs != 0`; its inputs are
never 0), and a dropout drawing its mask from a `tf.random.Generator` created under
`strategy.scope()`. Used in-process (2 replicas) and as a script for other replica counts (one
MirroredStrategy size per process):

    python tests/dropout_masks.py LOGDIR --replicas 4   # writes LOGDIR/replicas and masks.npz
"""

import argparse
import collections
import os
import sys

import numpy as np

RATE = 0.5
FEATURES = 6
PER_REPLICA_BATCH = 4
STEPS_PER_EPOCH = 4
EPOCHS = 2


def train(strategy, logdir):
    """Trains with `ReplicaCallback(update_freq=1)` and returns the recorded masks.

    Returns:
      `{(layer name, replica): [mask per step]}`, masks as bool arrays [batch, features], in
      the order each replica ran its steps.
    """
    import keras
    import tensorflow as tf

    from tb_replica_plugin import ReplicaCallback

    masks = collections.defaultdict(list)

    def recorder(name):
        def record(replica, mask):
            masks[(name, int(replica))].append(mask.numpy())
            return np.int32(0)

        return record

    def record_mask(name, mask):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        tf.py_function(recorder(name), [replica, mask], tf.int32)

    class RecordingDropout(keras.layers.Dropout):
        def call(self, inputs, training=False):
            outputs = super().call(inputs, training=training)
            if training:
                record_mask(self.name, tf.not_equal(outputs, 0))
            return outputs

    with strategy.scope():
        generator = tf.random.Generator.from_seed(11)

    class GeneratorDropout(keras.layers.Layer):
        def call(self, inputs, training=False):
            if not training:
                return inputs
            keep = generator.uniform(tf.shape(inputs)) >= RATE
            record_mask(self.name, keep)
            return tf.where(keep, inputs / (1 - RATE), tf.zeros_like(inputs))

    num = strategy.num_replicas_in_sync
    examples = PER_REPLICA_BATCH * num * STEPS_PER_EPOCH
    rng = np.random.default_rng(0)
    x = rng.uniform(1.0, 2.0, size=(examples, FEATURES)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((FEATURES,)),
                RecordingDropout(RATE, name="dropout"),
                GeneratorDropout(name="gen_dropout"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="sgd", loss="mse")
    model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(PER_REPLICA_BATCH * num),
        epochs=EPOCHS,
        verbose=0,
        callbacks=[ReplicaCallback(logdir, update_freq=1, generators={"g": generator})],
    )
    return dict(masks)


def save_masks(masks, path):
    np.savez(path, **{f"{name}:{replica}": np.stack(m) for (name, replica), m in masks.items()})


def load_masks(path):
    with np.load(path) as data:
        masks = {}
        for key in data.files:
            name, replica = key.rsplit(":", 1)
            masks[(name, int(replica))] = list(data[key])
        return masks


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("logdir")
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from demo import scenarios

    devices = scenarios.configure_devices(args.replicas)
    import tensorflow as tf

    masks = train(tf.distribute.MirroredStrategy(devices), args.logdir)
    save_masks(masks, os.path.join(args.logdir, "masks.npz"))


if __name__ == "__main__":
    main()
