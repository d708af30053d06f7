"""Custom-loop overhead of ReplicaProbe, and event bytes per logged step per replica.

The same MLP as `benchmarks.fit_overhead` (64 → 256 → 256 → 1, Adam, MSE) trains in a
`strategy.run` loop on R logical CPU replicas, global batch 256. Variants, alternated A B C A B C …
so machine drift hits them alike:

- `no_probe`: the loop alone;
- `probe_default`: `ReplicaProbe` with its default `update_freq` (100);
- `probe_every_step`: `ReplicaProbe(update_freq=1)`.

Each round traces once (warm-up) and times `--steps` steps. Also reports the bytes of event files
written per logged step per replica by each probe variant. Prints one JSON document.

    python -m benchmarks.loop_overhead [--steps 300] [--rounds 3] [--replicas 4]
"""

import argparse
import glob
import json
import os
import statistics
import tempfile
import time

from benchmarks import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _event_bytes(run_dir):
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(run_dir, "events.out.*")))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args(argv)

    import keras
    import numpy as np
    import tensorflow as tf

    from demo.scenarios import configure_devices
    from tb_replica_plugin import ReplicaProbe

    strategy = tf.distribute.MirroredStrategy(configure_devices(args.replicas))
    batch = 256
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 8, 64)).astype("float32")
    y = rng.normal(size=(batch * 8, 1)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat().prefetch(2)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        optimizer = keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.MeanSquaredError(reduction="sum")

    def make_step(probe):
        def replica_step(features, labels):
            if probe is not None:
                probe.observe_inputs({"x": features, "y": labels})
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(features, training=True)) / batch
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        @tf.function
        def train_step(iterator):
            strategy.run(replica_step, args=next(iterator))

        return train_step

    workdir = tempfile.mkdtemp(prefix="tb_replica_loop_bench_")
    variants = {"no_probe": None, "probe_default": 100, "probe_every_step": 1}
    per_step = {name: [] for name in variants}
    bytes_per = {}
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    for round_index in range(args.rounds):
        for name, update_freq in variants.items():
            run_dir = os.path.join(workdir, f"{name}_{round_index}")
            probe = None if update_freq is None else ReplicaProbe(run_dir, strategy, update_freq)
            step = make_step(probe)
            step(iterator)  # trace
            start = time.perf_counter()
            for _ in range(args.steps):
                step(iterator)
            # Steps are dispatched asynchronously: wait for the last one before stopping the clock.
            float(optimizer.iterations.numpy())
            per_step[name].append((time.perf_counter() - start) / args.steps)
            if probe is not None:
                probe.close()
                logged = (args.steps + 1) // update_freq + 1
                bytes_per[name] = round(_event_bytes(run_dir) / logged / args.replicas, 1)
    base = statistics.median(per_step["no_probe"])
    result = {
        "benchmark": "loop_overhead",
        "machine": common.machine(),
        "replicas": args.replicas,
        "global_batch": batch,
        "timed_steps_per_variant": args.rounds * args.steps,
        "median_seconds_per_step": {k: round(statistics.median(v), 6) for k, v in per_step.items()},
        "ratio_to_no_probe": {
            k: round(statistics.median(v) / base, 4) for k, v in per_step.items()
        },
        "event_bytes_per_logged_step_per_replica": bytes_per,
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
