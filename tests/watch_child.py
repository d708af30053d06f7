"""A custom loop whose replicas return outputs of different widths, run as a script:

    python tests/watch_child.py LOGDIR

Writes two runs on 2 replicas, 3 steps each, watching what each replica returns (and, after the
loop, what `strategy.run` returned, with `explain=True`): `mismatch` (replica r's per-replica
preprocessing gives outputs [4, 10 + 2r]) and its clean twin `clean` ([4, 10] on both). Then it
asks TensorFlow itself: `strategy.gather(axis=0)` of the clean outputs, then of the mismatched
ones. It prints one JSON line `{"clean_gather_shape": [...], "mismatch_gather_error": "..."}`.

A subprocess because a failing `strategy.gather` aborts the process's collective executor: the
collectives of every later test in the same process would fail ("Restart your program to
reset").
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from demo import scenarios  # noqa: E402

DEVICES = scenarios.configure_devices(2)

import tensorflow as tf  # noqa: E402

from tb_replica_plugin import ReplicaProbe  # noqa: E402


def run(strategy, run_dir, widen):
    """3 steps of a loop whose replica r returns [4, 10 + widen * r]; the last step's result."""
    probe = ReplicaProbe(run_dir, strategy, update_freq=1)

    @tf.function
    def step(batch):
        def step_fn(x):
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            # Per-replica preprocessing: a feature width that depends on the replica.
            width = 10 + widen * replica
            out = tf.tile(tf.reduce_mean(x, axis=1, keepdims=True), [1, width])
            probe.watch("logits", out)
            return out

        return strategy.run(step_fn, args=(batch,))

    dataset = tf.data.Dataset.from_tensor_slices(tf.ones([24, 3])).batch(8)
    result = None
    for batch in strategy.experimental_distribute_dataset(dataset):
        result = step(batch)
    probe.watch("returned", result, step=2, explain=True)  # cross-replica: the PerReplica
    probe.close()
    return result


def main():
    logdir = sys.argv[1]
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    clean = run(strategy, os.path.join(logdir, "clean"), widen=0)
    mismatch = run(strategy, os.path.join(logdir, "mismatch"), widen=2)
    facts = {
        "clean_local_shapes": [
            t.shape.as_list() for t in strategy.experimental_local_results(clean)
        ],
        "mismatch_local_shapes": [
            t.shape.as_list() for t in strategy.experimental_local_results(mismatch)
        ],
        "clean_gather_shape": strategy.gather(clean, axis=0).shape.as_list(),
    }
    try:
        facts["mismatch_gather_shape"] = strategy.gather(mismatch, axis=0).shape.as_list()
    except Exception as error:  # noqa: BLE001 - the error is the fact
        facts["mismatch_gather_error"] = f"{type(error).__name__}: {error}"
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
