"""Training overhead of ReplicaCallback against no callback and Keras's TensorBoard callback.

The same Keras MLP (64 → 256 → 256 → 1) trains on 4 logical CPU replicas with global batch 256.
Variants are alternated (A B C D A B C D …) so drift of the machine hits them alike; each round
fits one warm-up epoch (tracing) and times the following epochs. Prints one JSON document with
the median seconds per step of each variant and its ratio to the no-callback baseline, in wall
time and in CPU time of this process (`time.process_time()` per epoch: steadier than wall time on
a shared machine, and it counts every thread of the step, replicas included).

    python -m benchmarks.fit_overhead [--steps-per-epoch 100] [--epochs 3] [--rounds 3]
        [--variants no_callback replica_callback_default ...]
"""

import argparse
import json
import os
import platform
import statistics
import tempfile

from benchmarks import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps-per-epoch", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument(
        "--variants", nargs="*", help="variants to run (default: all; no_callback always runs)"
    )
    args = parser.parse_args(argv)

    import keras
    import tensorflow as tf

    from demo.scenarios import configure_devices
    from tb_replica_plugin import ReplicaCallback

    strategy = tf.distribute.MirroredStrategy(configure_devices(args.replicas))
    dataset = common.mlp_dataset(args.steps_per_epoch)
    model = common.mlp_model(strategy)
    workdir = tempfile.mkdtemp(prefix="tb_replica_bench_")
    variants = {
        "no_callback": lambda d: [],
        "keras_tensorboard_update_freq_1": lambda d: [
            keras.callbacks.TensorBoard(d, update_freq=1)
        ],
        "replica_callback_default": lambda d: [ReplicaCallback(d)],
        # The inputs family alone (the others off): where the default's cost comes from.
        "replica_callback_inputs_only": lambda d: [
            ReplicaCallback(d, gradients=False, rng=False, examples=False, variables=False)
        ],
        # The default without the weight-drift check at epoch ends (the timer's epoch includes
        # the callbacks' on_epoch_end, so the default's figure includes that check).
        "replica_callback_default_variables_off": lambda d: [ReplicaCallback(d, variables=False)],
        # The data family at every step (the default before examples_every, 2026-11-21).
        "replica_callback_examples_every_1": lambda d: [ReplicaCallback(d, examples_every=1)],
        "replica_callback_every_step": lambda d: [ReplicaCallback(d, update_freq=1)],
    }
    if args.variants:
        unknown = set(args.variants) - set(variants)
        if unknown:
            parser.error(f"unknown variants {sorted(unknown)}; known: {sorted(variants)}")
        variants = {k: v for k, v in variants.items() if k == "no_callback" or k in args.variants}
    per_step, cpu_per_step = common.alternate_fits(
        model,
        dataset,
        variants,
        rounds=args.rounds,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        workdir=workdir,
    )
    base = statistics.median(per_step["no_callback"])
    cpu_base = statistics.median(cpu_per_step["no_callback"])
    result = {
        "benchmark": "fit_overhead",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "replicas": args.replicas,
        "global_batch": common.GLOBAL_BATCH,
        "timed_steps_per_variant": args.rounds * args.epochs * args.steps_per_epoch,
        "median_seconds_per_step": {k: round(statistics.median(v), 6) for k, v in per_step.items()},
        "ratio_to_no_callback": {
            k: round(statistics.median(v) / base, 4) for k, v in per_step.items()
        },
        "median_cpu_seconds_per_step": {
            k: round(statistics.median(v), 6) for k, v in cpu_per_step.items()
        },
        "cpu_ratio_to_no_callback": {
            k: round(statistics.median(v) / cpu_base, 4) for k, v in cpu_per_step.items()
        },
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
