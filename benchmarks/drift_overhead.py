"""Overhead of the weight-drift check (variables family) of ReplicaCallback / ReplicaProbe.

Two measurements on 4 logical CPU replicas, printed as one JSON document:

1. `check_ms`: wall time of one drift check (`ReplicaProbe.observe_variables`, host call, one
   traced function over every variable) for the Keras MLP of `fit_overhead` (64 → 256 → 256 → 1
   with Adam: its weights and optimizer slots) and for one large 2048 × 2048 variable; default
   (fingerprints) against `exact=True`. Also the bytes each check moves off each copy's device:
   default 8 + 8 × (4 + 64) per copy whatever the variable's size, exact the whole variable.
2. `fit`: median seconds per training step of `fit` without callback, with
   `ReplicaCallback(update_freq=1, variables=False)` against `ReplicaCallback(update_freq=1)`
   (drift check at every step: the worst case) and `ReplicaCallback()` (default: inputs every
   step, drift check at epoch ends) against `ReplicaCallback(variables=False)`. Variants alternate
   so machine drift hits them alike; wall-time ratios use the fastest epoch of each variant,
   medians are printed too, and so is the process CPU time per step (median over epochs), the
   steadier figure on a machine shared with other jobs.

    python -m benchmarks.drift_overhead [--steps-per-epoch 50] [--epochs 2] [--rounds 2]
"""

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class _EpochClock:
    """Wall and process CPU time of every epoch (no per-batch hooks)."""

    def __new__(cls):
        import keras

        class _Clock(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.times, self.cpu = [], []

            def on_epoch_begin(self, epoch, logs=None):
                self._start = (time.perf_counter(), time.process_time())

            def on_epoch_end(self, epoch, logs=None):
                self.times.append(time.perf_counter() - self._start[0])
                self.cpu.append(time.process_time() - self._start[1])

        return _Clock()


def _time_checks(probe, variables, exact, repeats):
    probe.observe_variables(variables, step=0, exact=exact)  # trace
    times = []
    for step in range(1, repeats + 1):
        start = time.perf_counter()
        probe.observe_variables(variables, step=step, exact=exact)
        times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps-per-epoch", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=12, help="timed checks per variant")
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    from demo.scenarios import configure_devices
    from tb_replica_plugin import ReplicaCallback, ReplicaProbe
    from tb_replica_plugin.callback import fit_variables
    from tb_replica_plugin.collectors import variables as collector

    strategy = tf.distribute.MirroredStrategy(configure_devices(args.replicas))
    batch = 256
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * args.steps_per_epoch, 64)).astype("float32")
    y = rng.normal(size=(batch * args.steps_per_epoch, 1)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache().prefetch(2)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
        large = tf.Variable(tf.random.normal([2048, 2048]), name="large")
    workdir = tempfile.mkdtemp(prefix="tb_replica_drift_bench_")
    model.fit(dataset, epochs=1, verbose=0)  # builds the optimizer slots

    mlp_variables = fit_variables(model)
    elements = sum(int(np.prod(v.shape)) for v in mlp_variables)
    check_ms = {}
    for name, variables, repeats in (
        ("mlp", mlp_variables, args.repeats),
        ("large_2048x2048", [large], max(3, args.repeats // 4)),
    ):
        for exact in (False, True):
            probe = ReplicaProbe(os.path.join(workdir, f"{name}_{exact}"), strategy, None)
            key = f"{name}_{'exact' if exact else 'default'}"
            check_ms[key] = _time_checks(probe, variables, exact, repeats)
            probe.close()

    variants = {
        "no_callback": lambda d: [],
        "inputs_every_step_no_drift": lambda d: [
            ReplicaCallback(d, update_freq=1, variables=False)
        ],
        "inputs_and_drift_every_step": lambda d: [ReplicaCallback(d, update_freq=1)],
        "default_no_drift": lambda d: [ReplicaCallback(d, variables=False)],
        "default_drift_at_epoch_end": lambda d: [ReplicaCallback(d)],
    }
    per_step = {name: [] for name in variants}
    cpu_per_step = {name: [] for name in variants}
    for round_index in range(args.rounds):
        for name, make_callbacks in variants.items():
            timer = _EpochClock()
            model.fit(
                dataset,
                epochs=1 + args.epochs,
                verbose=0,
                callbacks=[*make_callbacks(os.path.join(workdir, f"{name}_{round_index}")), timer],
            )
            per_step[name].extend(t / args.steps_per_epoch for t in timer.times[1:])
            cpu_per_step[name].extend(t / args.steps_per_epoch for t in timer.cpu[1:])
    median = {k: statistics.median(v) for k, v in per_step.items()}
    best = {k: min(v) for k, v in per_step.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_per_step.items()}
    fingerprint_bytes = 8 + 8 * (len(collector.STAT_COLUMNS) + collector.SKETCH_SIZE)
    result = {
        "benchmark": "drift_overhead",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "replicas": args.replicas,
        "fingerprint_version": collector.FINGERPRINT_VERSION,
        "mlp_variables": len(mlp_variables),
        "mlp_elements": elements,
        "bytes_off_device_per_copy": {
            "default": fingerprint_bytes,
            "exact_mlp_all_variables": 4 * elements,
            "exact_large_2048x2048": 4 * 2048 * 2048,
        },
        "check_ms": check_ms,
        "timed_steps_per_variant": args.rounds * args.epochs * args.steps_per_epoch,
        "fit_median_seconds_per_step": {k: round(v, 6) for k, v in median.items()},
        "fit_best_seconds_per_step": {k: round(v, 6) for k, v in best.items()},
        "fit_median_cpu_seconds_per_step": {k: round(v, 6) for k, v in cpu.items()},
        "fit_ratio_median_cpu": {
            "every_stat_every_step_vs_no_callback": round(
                cpu["inputs_and_drift_every_step"] / cpu["no_callback"], 4
            ),
            "drift_every_step_vs_inputs_only": round(
                cpu["inputs_and_drift_every_step"] / cpu["inputs_every_step_no_drift"], 4
            ),
        },
        "fit_ratio_best": {
            "drift_every_step_vs_inputs_only": round(
                best["inputs_and_drift_every_step"] / best["inputs_every_step_no_drift"], 4
            ),
            "default_with_drift_vs_without": round(
                best["default_drift_at_epoch_end"] / best["default_no_drift"], 4
            ),
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
