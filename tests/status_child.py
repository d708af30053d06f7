"""A child process of tests/test_status.py: how a custom loop's run ends when the process does.

`python tests/status_child.py MODE LOGDIR`, on 2 logical CPU replicas, a probe writing
`LOGDIR/loop` and 3 steps of a custom loop, then:

- `uncaught`: a thread named `prefetcher` dies of an `OSError` (the run goes on), then the main
  thread raises a `ValueError` in `load_more` that nobody catches (exit status 1).
- `exit_open`: the script ends with the probe still open (exit status 0); prints
  `{"closed": false}`.
- `thread`: the loop runs in a thread named `trainer` (heartbeats every 0.2 s, stall time
  0.5 s), which then waits 1.5 s in `waits_here` and dies of a `ValueError`; the main thread
  joins it, waits 0.5 s and exits (status 0).
"""

import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def load_more():
    raise ValueError("the loader gave up")


def prefetch():
    raise OSError("disk went away")


def waits_here():
    time.sleep(1.5)


def train_then_give_up(train):
    train()
    waits_here()  # past the stall time: the stacks show this line, in this thread
    raise ValueError("the trainer gave up")


def main():
    mode, logdir = sys.argv[1], sys.argv[2]
    from demo import scenarios

    devices = scenarios.configure_devices(2)
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    strategy = tf.distribute.MirroredStrategy(devices)
    often = {"flush_secs": 0.2, "stall_secs": 0.5} if mode == "thread" else {}
    probe = ReplicaProbe(os.path.join(logdir, "loop"), strategy, update_freq=1, **often)

    @tf.function
    def step(batch):
        return strategy.run(lambda x: probe.observe_inputs({"x": x}), args=(batch,))

    dataset = tf.data.Dataset.range(12).map(lambda i: tf.fill([2], tf.cast(i, tf.float32)))

    def train():
        for batch in strategy.experimental_distribute_dataset(dataset.batch(4)):
            step(batch)

    if mode == "thread":
        trainer = threading.Thread(target=train_then_give_up, args=(train,), name="trainer")
        trainer.start()
        trainer.join()
        time.sleep(0.5)  # no heartbeat after the stretch ended
    else:
        train()
    if mode == "uncaught":
        thread = threading.Thread(target=prefetch, name="prefetcher")
        thread.start()
        thread.join()
        load_more()
    print(json.dumps({"closed": probe.disabled_reason is not None}), flush=True)


if __name__ == "__main__":
    main()
