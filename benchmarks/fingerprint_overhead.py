"""Cost of the rng and data fingerprints: in `fit`, and of the fingerprint ops alone.

1. `fit`: the MLP of `fit_overhead` with a Dropout layer (64 → 256 → Dropout → 256 → 1, 4 logical
   CPU replicas, global batch 256) under five variants, alternated round by round: no callback;
   `ReplicaCallback(rng=False, examples=False)` (inputs only); with the rng family; with the data
   family; with both (the default). Each round fits a warm-up epoch (tracing), then times epochs.
   Wall time and process CPU time per step (CPU time is what the fingerprints add to the machine,
   and is less sensitive to other processes sharing it).
2. Ops alone, in-graph: `example_fingerprints` on one replica's batch of [B, 64] float32 (+ [B, 1]
   labels) and `OverlapStats` (shared counts and sketches) over 4 such replicas, each run 100
   times in a `tf.while_loop` minus the same loop without them (no per-call dispatch).

Prints one JSON document.

    python -m benchmarks.fingerprint_overhead [--steps-per-epoch 50] [--epochs 2] [--rounds 2]
"""

import argparse
import json
import os
import statistics
import tempfile
import time

from benchmarks import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def fit_variants(strategy, args):

    from tb_replica_plugin import ReplicaCallback

    dataset = common.mlp_dataset(args.steps_per_epoch)
    model = common.mlp_model(strategy, dropout=0.2)
    workdir = tempfile.mkdtemp(prefix="tb_replica_fp_bench_")
    variants = {
        "no_callback": lambda d: [],
        "inputs_only": lambda d: [ReplicaCallback(d, rng=False, examples=False)],
        "inputs_rng": lambda d: [ReplicaCallback(d, examples=False)],
        "inputs_examples": lambda d: [ReplicaCallback(d, rng=False)],
        "all_default": lambda d: [ReplicaCallback(d)],
    }
    wall, cpu = common.alternate_fits(
        model,
        dataset,
        variants,
        rounds=args.rounds,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        workdir=workdir,
    )
    med_wall = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    base = "inputs_only"
    return {
        "replicas": strategy.num_replicas_in_sync,
        "global_batch": common.GLOBAL_BATCH,
        "timed_steps_per_variant": args.rounds * args.epochs * args.steps_per_epoch,
        "median_wall_seconds_per_step": {k: round(v, 6) for k, v in med_wall.items()},
        "median_cpu_seconds_per_step": {k: round(v, 6) for k, v in med_cpu.items()},
        "wall_ratio_to_no_callback": {
            k: round(v / med_wall["no_callback"], 4) for k, v in med_wall.items()
        },
        "added_ms_per_step_vs_inputs_only": {
            "wall": {k: round(1000 * (med_wall[k] - med_wall[base]), 3) for k in med_wall},
            "cpu": {k: round(1000 * (med_cpu[k] - med_cpu[base]), 3) for k in med_cpu},
        },
    }


def ops_alone(repeats, iterations=100):
    """In-graph cost of the ops, without the per-call dispatch: each timed call runs them
    `iterations` times in a `tf.while_loop` (on inputs shifted by the loop index, so nothing is
    cached), minus the same loop without them."""
    import numpy as np
    import tensorflow as tf

    from tb_replica_plugin.families.examples import record as data_collector

    def timed(function, *args):
        function(*args)  # trace
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            function(*args).numpy()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def loop(step):
        @tf.function
        def run(*args):
            def body(i, total):
                return i + 1, total + step(i, *args)

            start = (tf.constant(0), tf.constant(0, tf.int64))
            return tf.while_loop(lambda i, _: i < iterations, body, start)[1]

        return run

    def shifted(x, i):
        return x + tf.cast(i, x.dtype)

    hash_step = loop(
        lambda i, x, y: tf.reduce_sum(data_collector.example_fingerprints([shifted(x, i), y]))
    )
    base_step = loop(lambda i, x, y: tf.cast(tf.reduce_sum(shifted(x, i)), tf.int64))
    overlap_step = loop(
        lambda i, *f: tf.reduce_sum(data_collector.OverlapStats([shifted(h, i) for h in f]).shared)
    )
    overlap_base = loop(lambda i, *f: tf.add_n([tf.reduce_sum(shifted(h, i)) for h in f]))
    result = {}
    for batch in (32, 256, 2048):
        rng = np.random.default_rng(batch)
        x = tf.constant(rng.normal(size=(batch, 64)).astype("float32"))
        y = tf.constant(rng.normal(size=(batch, 1)).astype("float32"))
        fingerprints = [data_collector.example_fingerprints([x + r, y]) for r in range(4)]
        hashing = (timed(hash_step, x, y) - timed(base_step, x, y)) / iterations
        overlap = timed(overlap_step, *fingerprints) - timed(overlap_base, *fingerprints)
        overlap /= iterations
        result[str(batch)] = {
            "fingerprints_us_per_replica_step": round(1e6 * hashing, 2),
            "fingerprints_us_per_example": round(1e6 * hashing / batch, 3),
            "overlap_and_sketch_4_replicas_us_per_step": round(1e6 * overlap, 2),
        }
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps-per-epoch", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=9, help="timed calls of the ops alone")
    parser.add_argument("--skip-fit", action="store_true", help="measure the ops alone only")
    common.add_record_argument(parser)
    args = parser.parse_args(argv)

    import tensorflow as tf

    from demo.scenarios import configure_devices

    strategy = tf.distribute.MirroredStrategy(configure_devices(args.replicas))
    result = {
        "benchmark": "fingerprint_overhead",
        "machine": common.machine(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "fit": None if args.skip_fit else fit_variants(strategy, args),
        "ops_alone_by_batch": ops_alone(args.repeats),
    }
    print(json.dumps(result, indent=1))
    if args.record:
        figures = {k: result[k] for k in ("fit", "ops_alone_by_batch")}
        common.record_results("fingerprint_overhead", {"default": figures}, argv)


if __name__ == "__main__":
    main()
