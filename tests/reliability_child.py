"""Training processes the reliability tests start, kill or starve (run as a script).

    python tests/reliability_child.py kill LOGDIR      # trains until killed, prints steps
    python tests/reliability_child.py fsize LOGDIR     # trains with a 16 KB file-size limit

Both use the default strategy (one replica): the faults are in the writing, not the
distribution. `fsize` limits the size of any file this process writes (`RLIMIT_FSIZE`), so the
event file hits a real `EFBIG` ("File too large") from the kernel, as on a full disk, without
root or a tiny file system. It prints one JSON line with what happened.
"""

import json
import os
import resource
import signal
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tb_replica_plugin import ReplicaCallback  # noqa: E402

FLUSH_SECS = 0.5
FSIZE_LIMIT = 16 * 1024
FSIZE_STEPS = 400


class PrintSteps(keras.callbacks.Callback):
    """Prints `step N` after every step, so the parent knows how far training got, and when."""

    def on_train_batch_end(self, batch, logs=None):
        print(f"step {int(self.model.optimizer.iterations.numpy()) - 1}", flush=True)


class Slow(keras.layers.Layer):
    """Identity that sleeps 20 ms inside the step's graph (a step long enough to kill mid-way)."""

    def call(self, x):
        def sleep():
            time.sleep(0.02)
            return np.float32(0.0)

        pause = tf.py_function(sleep, [], tf.float32)
        pause.set_shape([])
        return x + pause

    def compute_output_shape(self, input_shape):
        return input_shape


def model(slow):
    inputs = keras.Input((3,))
    hidden = Slow()(inputs) if slow else inputs
    built = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    built.compile(optimizer="sgd", loss="mse")
    return built


def data(examples):
    x = np.ones((examples, 3), "float32")
    return tf.data.Dataset.from_tensor_slices((x, np.zeros((examples, 1), "float32"))).batch(2)


def main(mode, logdir):
    if mode == "kill":
        callback = ReplicaCallback(logdir, update_freq=1, flush_secs=FLUSH_SECS)
        model(slow=True).fit(
            data(2 * 100_000), epochs=1, verbose=0, callbacks=[PrintSteps(), callback]
        )
        return
    # fsize: a kernel-enforced file-size limit, as a full disk; SIGXFSZ would kill the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    net = model(slow=False)
    callback = ReplicaCallback(logdir, update_freq=1, flush_secs=FLUSH_SECS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, resource.RLIM_INFINITY))
        for _ in range(3):  # three fits: every step records (update_freq=1), and flushes
            net.fit(data(2 * FSIZE_STEPS // 3), epochs=1, verbose=0, callbacks=[callback])
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    run_dir = os.path.join(logdir, "replicas")
    ours = [str(w.message) for w in caught if "tb_replica_plugin" in str(w.message)]
    print(
        json.dumps(
            {
                "iterations": int(net.optimizer.iterations.numpy()),
                "warnings": ours,
                "file_sizes": [
                    os.path.getsize(os.path.join(run_dir, f)) for f in os.listdir(run_dir)
                ],
                "disabled_reason": callback.probe.disabled_reason,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
