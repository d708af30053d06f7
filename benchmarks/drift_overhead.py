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


def _check_times(strategy, mlp_variables, large, workdir, repeats):
    """Milliseconds per check (`_time_checks`) of the MLP's variables and of one 2048 × 2048
    variable, the default fingerprints and `exact=True`."""
    from tb_replica_plugin import ReplicaProbe

    check_ms = {}
    for name, variables, times in (
        ("mlp", mlp_variables, repeats),
        ("large_2048x2048", [large], max(3, repeats // 4)),
    ):
        for exact in (False, True):
            probe = ReplicaProbe(os.path.join(workdir, f"{name}_{exact}"), strategy, None)
            key = f"{name}_{'exact' if exact else 'default'}"
            check_ms[key] = _time_checks(probe, variables, exact, times)
            probe.close()
    return check_ms


def _fit_variants():
    """The alternated `fit` variants: `{name: fn(log_dir) -> callbacks}`."""
    from tb_replica_plugin import ReplicaCallback

    return {
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


def _ratios(cpu, best):
    """The `fit_ratio_median_cpu` and `fit_ratio_best` figures from the variants' medians of
    CPU seconds per step and best wall seconds per step."""
    every, inputs = cpu["inputs_and_drift_every_step"], cpu["inputs_every_step_no_drift"]
    rotating = cpu["inputs_and_rotating_drift_every_step"]
    median_cpu = {
        "every_stat_every_step_vs_no_callback": round(every / cpu["no_callback"], 4),
        "drift_every_step_vs_inputs_only": round(every / inputs, 4),
        "rotating_drift_every_step_vs_no_callback": round(rotating / cpu["no_callback"], 4),
        "rotating_drift_every_step_vs_inputs_only": round(rotating / inputs, 4),
    }
    best_ratios = {
        "drift_every_step_vs_inputs_only": round(
            best["inputs_and_drift_every_step"] / best["inputs_every_step_no_drift"], 4
        ),
        "default_with_drift_vs_without": round(
            best["default_drift_at_epoch_end"] / best["default_no_drift"], 4
        ),
    }
    return median_cpu, best_ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps-per-epoch", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=12, help="timed checks per variant")
    parser.add_argument("--replicas", type=int, default=4)
    common.add_record_argument(parser)
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf

    from demo.scenarios import configure_devices
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
    check_ms = _check_times(strategy, mlp_variables, large, workdir, args.repeats)
    per_step, cpu_per_step = common.alternate_fits(
        model,
        dataset,
        _fit_variants(),
        rounds=args.rounds,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        workdir=workdir,
    )
    median = {k: statistics.median(v) for k, v in per_step.items()}
    best = {k: min(v) for k, v in per_step.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_per_step.items()}
    median_cpu_ratios, best_ratios = _ratios(cpu, best)
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
        "fit_ratio_median_cpu": median_cpu_ratios,
        "fit_ratio_best": best_ratios,
    }
    print(json.dumps(result, indent=1))
    if args.record:
        keys = ("mlp_variables", "mlp_elements", "bytes_off_device_per_copy", "check_ms")
        figures = {k: result[k] for k in (*keys, "fit_ratio_median_cpu")}
        common.record_results("drift_overhead", {"default": figures}, argv)


if __name__ == "__main__":
    main()
