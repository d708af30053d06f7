"""Overhead of the weight-drift check (variables family) of ReplicaCallback / ReplicaProbe.

Two measurements on 4 logical CPU replicas, printed as one JSON document:

1. `check_ms`: wall time of one drift check (`ReplicaProbe.observe_variables`, host call, one
   traced function over every variable) for the Keras MLP of `fit_overhead` (64 → 256 → 256 → 1
   with Adam: its weights and optimizer slots) and for one large 2048 × 2048 variable; default
   (fingerprints) against `exact=True`. Also the bytes each check moves off each copy's device:
   default 8 + 8 × (4 + 64) per copy whatever the variable's size, exact the whole variable.
2. `fit`: median seconds per training step of `fit` without callback, with
   `ReplicaCallback(update_freq=1, variables=False)` against `ReplicaCallback(update_freq=1,
   variables_budget=None)` (the full drift check at every step: the worst case), against
   `ReplicaCallback(update_freq=1)` (a rotating slice of each large variable per step), and
   `ReplicaCallback()` (default: inputs every step, drift check at epoch ends) against
   `ReplicaCallback(variables=False)`. Variants alternate so machine drift hits them alike;
   wall-time ratios use the fastest epoch of each variant, medians are printed too, and so is the
   process CPU time per step (median over epochs), the steadier figure on a machine shared with
   other jobs.

    python -m benchmarks.drift_overhead [--steps-per-epoch 50] [--epochs 2] [--rounds 2]
"""

import argparse
import json
import os
import statistics
import tempfile
import time

from benchmarks import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


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

    import numpy as np
    import tensorflow as tf

    from demo.scenarios import configure_devices
    from tb_replica_plugin import ReplicaCallback, ReplicaProbe
    from tb_replica_plugin.families.variables import fingerprint as collector
    from tb_replica_plugin.families.variables.fit import fit_variables

    strategy = tf.distribute.MirroredStrategy(configure_devices(args.replicas))
    dataset = common.mlp_dataset(args.steps_per_epoch)
    model = common.mlp_model(strategy)
    with strategy.scope():
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
        "inputs_and_drift_every_step": lambda d: [
            ReplicaCallback(d, update_freq=1, variables_budget=None)
        ],
        "inputs_and_rotating_drift_every_step": lambda d: [ReplicaCallback(d, update_freq=1)],
        "default_no_drift": lambda d: [ReplicaCallback(d, variables=False)],
        "default_drift_at_epoch_end": lambda d: [ReplicaCallback(d)],
    }
    per_step, cpu_per_step = common.alternate_fits(
        model,
        dataset,
        variants,
        rounds=args.rounds,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        workdir=workdir,
    )
    median = {k: statistics.median(v) for k, v in per_step.items()}
    best = {k: min(v) for k, v in per_step.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_per_step.items()}
    fingerprint_bytes = 8 + 8 * (len(collector.STAT_COLUMNS) + collector.SKETCH_SIZE)
    result = {
        "benchmark": "drift_overhead",
        "machine": common.machine(),
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
            "rotating_drift_every_step_vs_no_callback": round(
                cpu["inputs_and_rotating_drift_every_step"] / cpu["no_callback"], 4
            ),
            "rotating_drift_every_step_vs_inputs_only": round(
                cpu["inputs_and_rotating_drift_every_step"] / cpu["inputs_every_step_no_drift"], 4
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
