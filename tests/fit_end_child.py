"""A child process of tests/test_status.py: Keras `fit`s that stop without returning, and a `fit`
killed in its first seconds.

    python tests/fit_end_child.py caught LOGDIR   # three fits stopped at step 60, caught
    python tests/fit_end_child.py kill LOGDIR     # one fit of 20 ms steps, prints `step N`

`caught` (one replica, 400 steps of 1 example, exit status 0): each run's fit is stopped at the
end of step 60 by a callback and the script catches what left `fit`, as a script saving its model
on Ctrl-C does; `on_train_end` never runs.

- run `sigint`: the callback sends the process a real SIGINT (where Ctrl-C lands while the
  main thread runs fit's Python); Python raises KeyboardInterrupt; the script saves the model.
- run `error`: the callback raises a `ValueError`; the script catches it and fits the same
  model again with the same `ReplicaCallback` (no stopping callback this time): 20 steps.
- run `keyboard`: the callback raises KeyboardInterrupt itself (no signal).

Then the script exits normally. Prints one JSON line: `{"iterations": {run: n}}`.

`kill`: `ReplicaCallback(flush_secs=5)` on a fit of 20 ms steps that prints `step N` after each
step, until the parent kills it.
"""

import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reliability_child import Slow  # noqa: E402 - the 20 ms identity layer, shared

from tb_replica_plugin import ReplicaCallback  # noqa: E402

STOP_AT = 60
STEPS = 400


class StopAt(keras.callbacks.Callback):
    """At the end of step `STOP_AT`: a SIGINT, a `ValueError` or a KeyboardInterrupt."""

    def __init__(self, how):
        super().__init__()
        self.how = how

    def on_train_batch_end(self, batch, logs=None):
        if batch != STOP_AT:
            return
        if self.how == "sigint":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # Python raises KeyboardInterrupt before this returns
        elif self.how == "error":
            raise ValueError("the checkpoint callback failed")
        else:
            raise KeyboardInterrupt


class PrintSteps(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print(f"step {batch}", flush=True)


def make_model(slow=False):
    inputs = keras.Input((3,))
    hidden = Slow()(inputs) if slow else inputs
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer="sgd", loss="mse")
    return model


def data(steps):
    x, y = np.ones((steps, 3), "float32"), np.zeros((steps, 1), "float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(1)


def caught(logdir):
    iterations = {}
    for run in ("sigint", "error", "keyboard"):
        model = make_model()
        callback = ReplicaCallback(logdir, run_name=run, update_freq=1)
        fit = {"epochs": 1, "verbose": 0}
        try:
            model.fit(data(STEPS), callbacks=[StopAt(run), callback], **fit)
        except KeyboardInterrupt:
            model.save(os.path.join(logdir, f"{run}.keras"))
        except ValueError:
            model.fit(data(20), callbacks=[callback], **fit)
        iterations[run] = int(model.optimizer.iterations.numpy())
    print(json.dumps({"iterations": iterations}), flush=True)


def kill(logdir):
    callback = ReplicaCallback(logdir, flush_secs=5)
    callbacks = [PrintSteps(), callback]
    make_model(slow=True).fit(data(100_000), epochs=1, verbose=0, callbacks=callbacks)


if __name__ == "__main__":
    # Python's own SIGINT handler, even when started with SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    {"caught": caught, "kill": kill}[sys.argv[1]](sys.argv[2])
