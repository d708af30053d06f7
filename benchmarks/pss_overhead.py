"""CPU per step under `ParameterServerStrategy`: a custom loop through `probe.schedule` against
`coordinator.schedule`, and tf_keras `fit` with `ReplicaCallback` against without.

The in-process cluster of the tests (`demo.pss.cluster`: 2 workers, 2 ps and the coordinator in
one process, so `time.process_time()` counts the workers' and the servers' CPU too) runs the step
of tests/pss_child.py: `reduce_sum(x * weights)` over each worker's batch (8 rows of 3 floats on
worker 0, 2 on worker 1). Variants:

- `coordinator_schedule`: the step without a probe, scheduled by `coordinator.schedule`;
- `probe_schedule`: the same step observing its inputs (`probe.observe_inputs`), scheduled by
  `probe.schedule` (`ReplicaProbe(update_freq=100)`, the default).

TensorFlow copies a scheduled function's outputs to the coordinator only while its `RemoteValue`
is held. The probe holds each step's until it read the record, so its variant pays that copy (the
step's result and the record); a loop that drops its results does not. `--path loop_kept`
(recorded as `kept`) times `coordinator_schedule_kept`, the baseline keeping every step's
`RemoteValue` (as a loop that reads its losses does), against `probe_schedule`.

`--path fit` (recorded as `fit`): tf_keras `fit` of a `Dense(64)`-`Dense(1)` model on
`demo.pss.uneven_xy_fn` (a `DatasetCreator`; `steps_per_execution=1`, the dearest per step):

- `fit`: no callback;
- `fit_replica_callback`: `ReplicaCallback` with its defaults (inputs, gradients, examples,
  variables' placement, step times).

A warm-up `fit` of `--warmup` steps traces; the timed one is a second `fit` of `--steps` steps
(its epoch end, the callback's flush and the join included).

Each (variant, pair) is its own child process (`python -m benchmarks.pss_overhead --child ...`;
a cluster changes its process's eager context for good), children one at a time, variants
alternated (A B A B ...). A child builds the cluster, schedules `--warmup` steps and joins
(tracing, the per-worker datasets), then times `--steps` scheduled steps and the join, and
prints one JSON line. Prints one JSON document: per variant the median CPU and wall
milliseconds per step (range across pairs), and the pairwise ratios.

    python -m benchmarks.pss_overhead [--path loop|fit] [--steps 50] [--pairs 7] [--quick]
        [--record]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import common
from demo import pss

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_MARK = "PSS_OVERHEAD "
# Per path: (without the plugin, with it).
VARIANTS = {
    "loop": ("coordinator_schedule", "probe_schedule"),
    "fit": ("fit", "fit_replica_callback"),
    "loop_kept": ("coordinator_schedule_kept", "probe_schedule"),
}
RECORD_KEYS = {"loop": "default", "fit": "fit", "loop_kept": "kept"}


def _child(args):
    """Times one variant on a new cluster; prints its figures as one marked JSON line."""
    strategy, coordinator, _servers = pss.cluster()
    timed = _time_fit if args.variant in VARIANTS["fit"] else _time_loop
    cpu, wall = timed(args, strategy, coordinator)
    result = {"variant": args.variant, "cpu_per_step": cpu / args.steps}
    result["wall_per_step"] = wall / args.steps
    print(CHILD_MARK + json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)  # the servers' threads keep an orderly exit waiting


def _time_loop(args, strategy, coordinator):
    """`(cpu, wall)` seconds of `--steps` scheduled steps of the custom loop and the join."""
    import tensorflow as tf

    import tb_replica_plugin

    with strategy.scope():
        weights = tf.Variable(tf.ones([3]))
    iterator = pss.per_worker_iterator(strategy, coordinator, pss.uneven_dataset_fn)
    probe = None
    schedule = coordinator.schedule
    if args.variant == "probe_schedule":
        probe = tb_replica_plugin.ReplicaProbe(args.log_dir, strategy)
        schedule = probe.schedule
    step = pss.sum_step(strategy, weights, probe)
    for _ in range(args.warmup):
        schedule(step, args=(iterator,))
    coordinator.join()
    kept = []  # `coordinator_schedule_kept`: the loop keeps every step's RemoteValue
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        result = schedule(step, args=(iterator,))
        if args.variant == "coordinator_schedule_kept":
            kept.append(result)
    coordinator.join()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if probe is not None:
        probe.close()
    return cpu, wall


def _time_fit(args, strategy, coordinator):
    """`(cpu, wall)` seconds of a second tf_keras `fit` of `--steps` steps."""
    del coordinator  # fit finds the strategy's own
    import tf_keras

    import tb_replica_plugin

    with strategy.scope():
        model = tf_keras.Sequential(
            [tf_keras.layers.Dense(64, "relu", input_shape=(3,)), tf_keras.layers.Dense(1)]
        )
        model.compile(tf_keras.optimizers.legacy.SGD(0.01), loss="mse")
    data = tf_keras.utils.experimental.DatasetCreator(pss.uneven_xy_fn)
    callbacks = []
    if args.variant == "fit_replica_callback":
        callbacks.append(tb_replica_plugin.ReplicaCallback(args.log_dir))
    model.fit(data, epochs=1, steps_per_epoch=args.warmup, callbacks=callbacks, verbose=0)
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(data, epochs=1, steps_per_epoch=args.steps, callbacks=callbacks, verbose=0)
    return time.process_time() - cpu, time.perf_counter() - wall


def _run_child(variant, args):
    """One child's figures (`cpu_per_step`, `wall_per_step`, seconds)."""
    log_dir = tempfile.mkdtemp(prefix=f"tb_replica_pss_bench_{variant}_")
    command = [sys.executable, "-m", "benchmarks.pss_overhead", "--child", "--variant", variant]
    command += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--log-dir", log_dir]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    try:
        done = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.child_timeout
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith(CHILD_MARK)]
        if done.returncode != 0 or not lines:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"pss_overhead child {variant} failed ({done.returncode})")
        return json.loads(lines[-1][len(CHILD_MARK) :])
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def _ms(values):
    """`{"median", "min", "max"}` of seconds, in milliseconds (3 decimals)."""
    return {
        key: round(f(values) * 1000, 3)
        for key, f in (("median", statistics.median), ("min", min), ("max", max))
    }


def summarize(runs, variants=VARIANTS["loop"]):
    """The figures of alternated runs.

    Args:
      runs: `{variant: [child figures, one per pair]}`, pairs in the same order.
      variants: `(without, with)` the plugin (`VARIANTS[path]`).

    Returns:
      `{"pairs", "cpu_ms_per_step", "wall_ms_per_step", "cpu_ratio", "wall_ratio",
      "added_cpu_ms_per_step"}`: per variant `{"median", "min", "max"}` across pairs; the
      ratios with / without pair by pair (`common.ratio_range`); the median of the pairs' CPU
      differences.
    """
    without, with_plugin = variants
    figures = {"pairs": len(runs[without])}
    for clock in ("cpu", "wall"):
        seconds = {v: [r[f"{clock}_per_step"] for r in runs[v]] for v in variants}
        figures[f"{clock}_ms_per_step"] = {v: _ms(seconds[v]) for v in variants}
        figures[f"{clock}_ratio"] = common.ratio_range(seconds[with_plugin], seconds[without])
    added = [
        p["cpu_per_step"] - c["cpu_per_step"]
        for p, c in zip(runs[with_plugin], runs[without], strict=True)
    ]
    figures["added_cpu_ms_per_step"] = round(statistics.median(added) * 1000, 3)
    return figures


def _parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=sorted(VARIANTS), default="loop", help="what is timed")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per child")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the timed ones")
    parser.add_argument("--pairs", type=int, default=7, help="alternated pairs of children")
    parser.add_argument("--quick", action="store_true", help="1 pair of 10 steps (CI)")
    parser.add_argument("--child-timeout", type=float, default=300)
    common.add_record_argument(parser)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--variant", choices=[v for pair in VARIANTS.values() for v in pair], help=argparse.SUPPRESS
    )
    parser.add_argument("--log-dir", help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    common.check_record(parser, args)
    if args.quick:
        args.steps, args.warmup, args.pairs = 10, 3, 1
    variants = VARIANTS[args.path]
    runs = {variant: [] for variant in variants}
    for pair in range(args.pairs):
        for variant in variants:
            runs[variant].append(_run_child(variant, args))
            print(f"pair {pair + 1}/{args.pairs} {variant}: done", file=sys.stderr, flush=True)
    figures = {"workers": pss.WORKERS, "ps": pss.PS, "steps": args.steps}
    figures.update(summarize(runs, variants))
    result = {"benchmark": "pss_overhead", "machine": common.machine(), **figures}
    result["raw"] = runs
    print(json.dumps(result, indent=1))
    if args.record:
        common.record_results("pss_overhead", {RECORD_KEYS[args.path]: figures}, argv)
    return result


if __name__ == "__main__":
    main()
