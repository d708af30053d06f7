"""Custom-loop overhead of ReplicaProbe, and event bytes per logged step per replica.

The same MLP as `benchmarks.fit_overhead` (64 → 256 → 256 → 1, Adam, MSE) trains in a
`strategy.run` loop on R logical CPU replicas, global batch 256. Variants, alternated A B C A B C …
so machine drift hits them alike:

- `no_probe`: the loop alone;
- `probe_default`: `ReplicaProbe` with its default `update_freq` (100);
- `probe_every_step`: `ReplicaProbe(update_freq=1)`.

Each round traces once (warm-up) and times `--steps` steps, wall and process CPU time (the CPU
ratios are the ones to judge on a shared machine). Also reports the bytes of event files written
per logged step per replica by each probe variant. Prints one JSON document.

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


def _mlp(strategy, batch):
    """`(dataset, model, optimizer)` of the benchmark's MLP under `strategy` (global `batch`)."""
    import keras
    import numpy as np
    import tensorflow as tf

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
    return dataset, model, optimizer


def _train_step(strategy, model, optimizer, batch, probe):
    """The loop's `tf.function` step (one `strategy.run` on the iterator's next batch), observing
    the inputs with `probe` unless it is None."""
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.MeanSquaredError(reduction="sum")

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


def _time_steps(step, iterator, steps, optimizer):
    """`(wall, CPU)` seconds per step of `steps` calls of `step` after one to trace."""
    step(iterator)  # trace
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step(iterator)
    # Steps are dispatched asynchronously: wait for the last one before stopping the clocks.
    float(optimizer.iterations.numpy())
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=4)
    common.add_record_argument(parser)
    args = parser.parse_args(argv)

    import tensorflow as tf

    from demo.scenarios import configure_devices
    from tb_replica_plugin import ReplicaProbe

    strategy = tf.distribute.MirroredStrategy(configure_devices(args.replicas))
    batch = 256
    dataset, model, optimizer = _mlp(strategy, batch)
    workdir = tempfile.mkdtemp(prefix="tb_replica_loop_bench_")
    variants = {"no_probe": None, "probe_default": 100, "probe_every_step": 1}
    per_step = {name: [] for name in variants}
    cpu_per_step = {name: [] for name in variants}
    bytes_per = {}
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    for round_index in range(args.rounds):
        for name, update_freq in variants.items():
            run_dir = os.path.join(workdir, f"{name}_{round_index}")
            probe = None if update_freq is None else ReplicaProbe(run_dir, strategy, update_freq)
            step = _train_step(strategy, model, optimizer, batch, probe)
            wall, cpu = _time_steps(step, iterator, args.steps, optimizer)
            per_step[name].append(wall)
            cpu_per_step[name].append(cpu)
            if probe is not None:
                probe.close()
                logged = (args.steps + 1) // update_freq + 1
                bytes_per[name] = round(_event_bytes(run_dir) / logged / args.replicas, 1)
    median = {k: statistics.median(v) for k, v in per_step.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_per_step.items()}
    result = {
        "benchmark": "loop_overhead",
        "machine": common.machine(),
        "replicas": args.replicas,
        "global_batch": batch,
        "timed_steps_per_variant": args.rounds * args.steps,
        "median_seconds_per_step": {k: round(v, 6) for k, v in median.items()},
        "ratio_to_no_probe": {k: round(v / median["no_probe"], 4) for k, v in median.items()},
        "median_cpu_seconds_per_step": {k: round(v, 6) for k, v in cpu.items()},
        "cpu_ratio_to_no_probe": {k: round(v / cpu["no_probe"], 4) for k, v in cpu.items()},
        "event_bytes_per_logged_step_per_replica": bytes_per,
    }
    print(json.dumps(result, indent=1))
    if args.record:
        keys = ("replicas", "ratio_to_no_probe", "cpu_ratio_to_no_probe")
        figures = {k: result[k] for k in (*keys, "event_bytes_per_logged_step_per_replica")}
        common.record_results("loop_overhead", {"default": figures}, argv)
    return result


if __name__ == "__main__":
    main()
