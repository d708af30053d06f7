"""The steady cost of a `ReplicaCallback` variant on the MLP, against no callback in one process.

`benchmarks.fit_overhead` starts a process per variant and pair, as a user pays; across processes
a shared 2-core machine's speed swings by more than a few percent. This benchmark keeps one
process and two copies of the MLP (same seed, same data; 4 logical CPU replicas): one fitted
without callback, one with the variant's callbacks (the same instances in every `fit`, so the
instrumented step is traced once, in the warm-up round). Each round fits both, the order swapped
every round (A B, B A, ...), 2 epochs each; the second epoch is timed (process CPU: its steps and
its epoch end, the callback's epoch-end work included) and so is the whole `fit`.

Printed: one JSON document with, per copy, the CPU per step of each round's timed epoch and of
each whole `fit`, and the medians and ranges of the per-round ratios (variant / no callback).

    python -m benchmarks.fit_alternated --variant replica_callback_default --rounds 12
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from benchmarks import common, fit_overhead


def _parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variant",
        default="replica_callback_default",
        choices=sorted(set(fit_overhead.VARIANTS) - {"no_callback"}),
    )
    parser.add_argument("--rounds", type=int, default=12, help="timed rounds after the warm-up")
    parser.add_argument("--steps-per-epoch", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2-step epochs (CI)")
    common.add_record_argument(parser)
    return parser


def _alternate(models, callbacks, dataset, args):
    """Fits each model once (warm-up), then `args.rounds` rounds of a 2-epoch `fit` of each, the
    order swapped every round. Returns `(per_step, per_fit)`: `{name: [CPU s]}` of the second
    epoch's steps and of the whole `fit`, one per round."""
    per_step = {name: [] for name in models}
    per_fit = {name: [] for name in models}

    def fit(name):
        timer = common.epoch_timer()
        start = time.process_time()
        models[name].fit(dataset, epochs=2, verbose=0, callbacks=[*callbacks[name], timer])
        per_fit[name].append(time.process_time() - start)
        per_step[name].append(timer.cpu_times[1] / args.steps_per_epoch)

    for name in models:  # warm-up: traces and instruments
        fit(name)
    for series in (*per_step.values(), *per_fit.values()):
        series.clear()
    names = list(models)
    for round_index in range(args.rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            fit(name)
        print(
            f"round {round_index + 1}/{args.rounds}: "
            + ", ".join(f"{n} {per_step[n][-1] * 1000:.2f} ms CPU/step" for n in names),
            file=sys.stderr,
            flush=True,
        )
    return per_step, per_fit


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    common.check_record(parser, args)
    if args.quick:
        args.rounds, args.steps_per_epoch = 2, 2

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from demo.scenarios import configure_devices

    strategy = tf.distribute.MirroredStrategy(configure_devices(4))
    dataset = common.mlp_dataset(args.steps_per_epoch)
    keras.utils.set_random_seed(0)
    models = {"no_callback": common.mlp_model(strategy)}
    keras.utils.set_random_seed(0)
    models[args.variant] = common.mlp_model(strategy)
    workdir = tempfile.mkdtemp(prefix="fit_alternated_")
    callbacks = {
        "no_callback": [],
        args.variant: fit_overhead.VARIANTS[args.variant](keras, os.path.join(workdir, "logs")),
    }
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    per_step, per_fit = _alternate(models, callbacks, dataset, args)
    names = list(models)
    result = {
        "benchmark": "fit_alternated",
        "machine": common.machine(),
        "keras": keras.__version__,
        "tensorflow": tf.__version__,
        "load_average_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "duration_s": round(time.perf_counter() - started, 1),
        "variant": args.variant,
        "rounds": args.rounds,
        "steps_per_epoch": args.steps_per_epoch,
        "cpu_per_step": {n: [round(v, 6) for v in per_step[n]] for n in names},
        "cpu_per_fit": {n: [round(v, 4) for v in per_fit[n]] for n in names},
        "median_cpu_per_step": {n: round(statistics.median(per_step[n]), 6) for n in names},
        "ratio_per_step": common.ratio_range(per_step[args.variant], per_step["no_callback"]),
        "ratio_per_fit": common.ratio_range(per_fit[args.variant], per_fit["no_callback"]),
    }
    print(json.dumps(result, indent=1))
    if args.record:
        keys = ("rounds", "median_cpu_per_step", "ratio_per_step", "ratio_per_fit")
        figures = {k: result[k] for k in keys}
        common.record_results("fit_alternated", {args.variant: figures}, argv)


if __name__ == "__main__":
    main()
