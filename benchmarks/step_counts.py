"""What `ReplicaCallback` adds to one training step, counted (not timed): deterministic figures.

For one model of `benchmarks.fit_overhead` (its sizes, its replicas on logical CPU devices), in one
process, copies of the model are fitted one after the other on the same strategy: without a
callback and with `ReplicaCallback()` (the default). For each:

- from a **profiler trace** (`tf.profiler`, host tracer) of `PROFILED_STEPS` steps of a fit
  (from its step `PROFILE_FROM`, after the fit's first steps, which the callback records in full):
  `ops_per_step`, the kernels the executor ran (trace events named `<node>:<op type>`), divided by
  the steps; the window holds one sampled step (`SAMPLED_STEP`) of the callback;
- from the same trace, split at each call of the step function: `plain_step`, the kernels and
  the `_Send` kernels (cross-device transfers: each is a send and a receive) of a step neither
  logged nor sampled (the most common per-step counts of the window), and `sampled_step`, those
  of the sampled step.

Printed: one JSON document with both and their differences (`added`), with `transfers` the
sampled step's added `_Send`s and `transfers_per_replica` those divided by the replicas that are
not on the host's
device (replica 0's logical CPU is the host's own, so on R logical CPU replicas R - 1 replicas
send; on R GPUs all R would). With `--cost-model` (MLP), the MLP is counted again at other
replica and variable counts (`COST_POINTS`, one child process each) and `cost_model` gives the
plain step's added kernels as `a·R + b·R·V + h`; `gpu_estimate` prices them (and a sampled
step's, with the device→host copies) for MobileNetV2, ResNet-50 and BERT-base on 8 GPUs at
published launch and copy latencies, on paper.

    python -m benchmarks.step_counts --model mlp     # 4 replicas
    python -m benchmarks.step_counts --model mlp --cost-model
    python -m benchmarks.step_counts --model cnn     # MobileNetV2, 2 replicas
"""

import argparse
import atexit
import bisect
import collections
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

from benchmarks import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Steps of the profiled window: one sampling period of the examples family at its default.
PROFILED_STEPS = 16
# The step the profiled window starts at: after the warm-up and the fit's first steps, which
# `ReplicaCallback` records in full (`write.variants.FIRST_FULL_STEPS`).
PROFILE_FROM = 20
# The window's sampled step (`examples_every`'s default period).
SAMPLED_STEP = 32
# What the name of Keras's step function holds (Keras 3, tf_keras), as the profiler's
# `EagerLocalExecute: __inference_<name>_<n>` event of each call shows it.
STEP_FUNCTIONS = ("_on_iterator", "train_function")
# Op types of the kernels that send a tensor to another device.
SENDS = ("_Send", "_HostSend")


def _trace_events(trace_dir):
    """`(kernels, step_starts)` of a profiler trace: `(start_ps, op type)` of every kernel event
    (`<node>:<op type>`), and the start of every call of the step function."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    space = xplane_pb2.XSpace()
    with open(path, "rb") as handle:
        space.ParseFromString(handle.read())
    kernels, starts = [], []
    for plane in space.planes:
        names = {key: value.name for key, value in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                at = line.timestamp_ns * 1000 + event.offset_ps
                call = name.startswith("EagerLocalExecute: ")
                if call and any(function in name for function in STEP_FUNCTIONS):
                    starts.append(at)
                elif ":" in name and "::" not in name and not name.startswith(" "):
                    node, kind = name.rsplit(":", 1)
                    # The package's own ops (its `tb_replica/` name scope).
                    kernels.append((at, f"tb_replica/{kind}" if "tb_replica/" in node else kind))
    return kernels, sorted(starts)


def profiled_ops(trace_dir, steps):
    """Kernels run per step in a profiler trace of `steps` steps (events `<node>:<op type>`)."""
    return len(_trace_events(trace_dir)[0]) / steps


def per_call(trace_dir):
    """`[Counter of op types]`: the kernels of each call of the step function in a profiler
    trace, in call order (the last call left out: the trace's end may cut it)."""
    kernels, starts = _trace_events(trace_dir)
    if not starts:
        return []
    calls = [collections.Counter() for _ in starts]
    for at, kind in kernels:
        index = bisect.bisect_right(starts, at) - 1
        if index >= 0:
            calls[index][kind] += 1
    return calls[:-1] or calls


def sends(counts):
    """The `_Send` kernels (cross-device transfers) of one call's `per_call` counts."""
    return sum(n for kind, n in counts.items() if kind.endswith(SENDS))


def plain_step(trace_dir):
    """`{"kernels", "sends", "by_type"}` of a plain step of a profiler trace: the kernels run
    and the `_Send` kernels among them, per call of the step function, their most common value
    (the window's steps but its sampled one; a step neither logged nor sampled), and that
    step's kernels by op type (the probe's own, named `tb_replica/...`, as `tb_replica/<type>`).
    None when the trace shows no step function call."""
    steps = per_call(trace_dir)
    if not steps:
        return None

    def key(step):
        return sum(step.values()), sends(step)

    (found_kernels, found_sends), _ = collections.Counter(map(key, steps)).most_common(1)[0]
    found = next(step for step in steps if key(step) == (found_kernels, found_sends))
    return {"kernels": found_kernels, "sends": found_sends, "by_type": dict(sorted(found.items()))}


def _profile_callback(keras, trace_dir):
    """Traces batches PROFILE_FROM .. PROFILE_FROM + PROFILED_STEPS - 1 of a fit."""
    import tensorflow as tf

    class Profile(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == PROFILE_FROM:
                tf.profiler.experimental.start(trace_dir)

        def on_train_batch_end(self, batch, logs=None):
            if batch == PROFILE_FROM + PROFILED_STEPS - 1:
                tf.profiler.experimental.stop()

    return Profile()


def count_variant(build, callbacks, keras):
    """Counts one variant's steps in a profiled window of a model's fit.

    Args:
      build: a function of no arguments returning `(model, dataset)`.
      callbacks: a function of no arguments returning the variant's callbacks.
      keras: the Keras module.

    Returns:
      `{"ops_per_step", "plain_step", "sampled_step"}`.
    """
    model, dataset = build()
    trace_dir = tempfile.mkdtemp(prefix="tb_replica_step_counts_")
    try:
        profile = _profile_callback(keras, trace_dir)
        model.fit(dataset, epochs=1, verbose=0, callbacks=[*callbacks(), profile])
        ops_per_step = round(profiled_ops(trace_dir, PROFILED_STEPS), 2)
        plain = plain_step(trace_dir)
        calls = per_call(trace_dir)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)
    sampled = calls[SAMPLED_STEP - PROFILE_FROM]
    return {
        "ops_per_step": ops_per_step,
        "plain_step": plain,
        "sampled_step": {"kernels": sum(sampled.values()), "sends": sends(sampled)},
    }


def count_model(model_name, sizes, keras_flavour="keras3"):
    """The counts of `model_name` (`fit_overhead`'s) without and with `ReplicaCallback()`.

    Returns:
      `{"model", "replicas", "steps_per_epoch", "no_callback", "replica_callback_default",
      "added"}`.
    """
    import tensorflow as tf

    from benchmarks import fit_overhead
    from demo.scenarios import configure_devices

    devices = configure_devices(sizes["replicas"])
    keras = fit_overhead.keras_module(keras_flavour)
    strategy = tf.distribute.MirroredStrategy(devices)
    sizes = dict(sizes, steps_per_epoch=max(sizes["steps_per_epoch"], PROFILE_FROM + 20))
    log_dir = tempfile.mkdtemp(prefix="tb_replica_step_counts_logs_")
    # Removed at exit, after the callbacks' probes have flushed (`atexit` runs in reverse).
    atexit.register(shutil.rmtree, log_dir, True)
    counts = {}
    for variant in ("no_callback", "replica_callback_default"):

        def build():
            return fit_overhead.build_model(model_name, strategy, keras, sizes)

        def callbacks(variant=variant):
            return fit_overhead.VARIANTS[variant](keras, tempfile.mkdtemp(dir=log_dir))

        counts[variant] = count_variant(build, callbacks, keras)
    base, with_callback = counts["no_callback"], counts["replica_callback_default"]
    added = {
        "transfers": with_callback["sampled_step"]["sends"] - base["sampled_step"]["sends"],
        "sampled_step_kernels": (
            with_callback["sampled_step"]["kernels"] - base["sampled_step"]["kernels"]
        ),
    }
    added["ops_per_step"] = round(with_callback["ops_per_step"] - base["ops_per_step"], 2)
    if base["plain_step"] and with_callback["plain_step"]:
        plain, plain_base = with_callback["plain_step"], base["plain_step"]
        added["plain_step"] = {key: plain[key] - plain_base[key] for key in ("kernels", "sends")}
        types = set(plain["by_type"]) | set(plain_base["by_type"])
        by_type = {t: plain["by_type"].get(t, 0) - plain_base["by_type"].get(t, 0) for t in types}
        added["plain_step"]["by_type"] = {t: n for t, n in sorted(by_type.items()) if n}
    sending = sum(1 for d in devices if tf.DeviceSpec.from_string(d).device_index != 0)
    added["transfers_per_replica"] = round(added["transfers"] / max(sending, 1), 2)
    return {
        "model": model_name,
        "replicas": sizes["replicas"],
        "steps_per_epoch": sizes["steps_per_epoch"],
        **counts,
        "added": added,
    }


def cost_model(points):
    """The added kernels of a plain step as `a·R + b·R·V + h` (R replicas, V variables), solved
    from three counted points.

    Args:
      points: three `(R, V, added kernels)`: two of one V and two R, and one of another V.

    Returns:
      `{"a", "b", "h", "points"}` (`a`, `b`, `h` rounded to 2 decimals).

    Example:
      >>> cost_model([(2, 6, 22), (4, 6, 40), (4, 8, 48)])["b"]
      1.0
    """
    import numpy as np

    matrix = np.array([[r, r * v, 1.0] for r, v, _ in points])
    added = np.array([float(k) for _, _, k in points])
    a, b, h = np.linalg.solve(matrix, added)
    return {
        "a": round(float(a), 2),
        "b": round(float(b), 2),
        "h": round(float(h), 2),
        "points": [{"replicas": r, "variables": v, "kernels": k} for r, v, k in points],
    }


# The MLP's other points of the cost model: (replicas, hidden layers); V = 2 * (layers + 1).
COST_POINTS = ((2, 2), (4, 3))


def _point(replicas, hidden_layers, keras_flavour):
    """`(R, V, added kernels of a plain step)` of the MLP, counted in a child process (one
    strategy per process)."""
    from benchmarks import fit_overhead

    sizes = dict(fit_overhead.FULL_SIZES["mlp"], replicas=replicas, hidden_layers=hidden_layers)
    command = [sys.executable, "-m", "benchmarks.step_counts", "--model", "mlp"]
    command += ["--keras", keras_flavour, "--sizes", json.dumps(sizes)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"step_counts at {replicas} replicas failed ({done.returncode})")
    counts = json.loads(done.stdout[done.stdout.index("{") :])
    return replicas, 2 * (hidden_layers + 1), counts["added"]["plain_step"]["kernels"]


# What a GPU would pay, on paper (`gpu_estimate`): published host-side costs, in microseconds.
# A kernel launch: 4-6 µs per kernel submitted (driver and runtime calls, measured on an RTX 5070
# Ti, CUDA 13.0); NVIDIA's CUDA Programming Guide (4.2, CUDA Graphs) names the per-kernel
# overhead without a figure.
LAUNCH_US = 5.0
LAUNCH_SOURCES = (
    ("4–6 µs measured", "https://susun-blog.com/blog/pegainfer-3-cuda-graph"),
    (
        "CUDA Programming Guide 4.2",
        "https://docs.nvidia.com/cuda/cuda-programming-guide/04-special-topics/cuda-graphs.html",
    ),
)
# A small device->host copy: "a cudaMemcpy can incur in a 6-7us overhead" (NVIDIA's GDRCopy:
# DGX-1V, pinned host memory; "around 1 µs vs 7 µs with cudaMemcpy" on its product page).
COPY_US = 7.0
COPY_SOURCES = (
    ("NVIDIA GDRCopy: 6–7 µs per cudaMemcpy", "https://github.com/NVIDIA/gdrcopy"),
    ("7 µs, pinned, DGX-1V", "https://developer.nvidia.com/gdrcopy"),
)
# Trainable variables of the models priced, `len(model.trainable_variables)`.
GPU_VARIABLES = {
    "MobileNetV2": 158,  # keras.applications.MobileNetV2(weights=None), Keras 3.15
    "ResNet-50": 214,  # keras.applications.ResNet50(weights=None), Keras 3.15
    # BERT-base (no keras_hub here), from its architecture: embeddings: word, position and
    # segment tables + LayerNorm's gamma and beta = 5; each of 12 layers: query, key, value and
    # output projections (kernel, bias) 8 + their LayerNorm 2 + intermediate and output dense 4
    # + output LayerNorm 2 = 16, so 192; pooler dense 2. 5 + 192 + 2 = 199.
    "BERT-base": 199,
}
# The batch's leaves the examples family reads on the host at a sampled step (images and
# labels; BERT: token ids, segment ids, padding mask, labels).
GPU_BATCH_LEAVES = {"MobileNetV2": 2, "ResNet-50": 2, "BERT-base": 4}


# Device->host copies per replica and step of a GPU `If`'s predicate (its `cond` input lives in
# host memory), beside the counted `_Send`s.
IF_PREDICATE_COPIES = 1


def gpu_estimate(
    cost_model,
    variables_by_model,
    counted,
    replicas=8,
    launch_us=LAUNCH_US,
    copy_us=COPY_US,
    batch_leaves_by_model=None,
):
    """What the default callback would add per step on `replicas` GPUs, on paper: kernels and
    device->host copies from the counts, priced at a launch's and a small copy's host cost.

    - A plain step (neither logged nor sampled): `a·R + b·R·V + h` kernels (`cost_model`) and,
      per replica, the plain step's `_Send`s per sending replica (`counted`: on R logical CPU
      replicas R - 1 send; on GPUs all R would) and its fault `If`'s predicate
      (`IF_PREDICATE_COPIES`).
    - A sampled step (every `PROFILED_STEPS`-th: the examples family's default period; a logged
      step runs the same branches): the plain step's kernels and the extra kernels of the
      counted window's one sampled step, `PROFILED_STEPS` × (mean step's added kernels - plain
      step's); per replica the step's cross-device transfers (its graph's, at least the plain
      step's) and one copy per batch leaf the examples family reads on the host (on logical CPU
      replicas the batch is on the host already, so the counts do not show them; each is
      batch-sized, its bytes at the link's bandwidth come on top).
    - The mean over one sampling period.

    Args:
      cost_model: `{"a", "b", "h"}` of `cost_model`.
      variables_by_model: `{model name: trainable variables}`.
      counted: the figures the cost model's run recorded (`recorded_figures`): `replicas` and
        `added` with `ops_per_step`, `transfers_per_replica` and `plain_step` (`kernels`,
        `sends`).
      replicas: R.
      launch_us, copy_us: microseconds per kernel launch and per device->host copy.
      batch_leaves_by_model: `{model name: leaves}` (default `GPU_BATCH_LEAVES`, else 2).

    Returns:
      `{"replicas", "launch_us", "copy_us", "sampled_every", "sampled_extra_kernels", "models":
      {name: {"variables", "plain", "sampled", "mean_us"}}}`, `plain` and `sampled` each
      `{"kernels", "copies", "us"}`.

    Raises:
      ValueError: when `counted` holds no plain step (a run without a profiled plain step).
    """
    added = counted["added"]
    if not added.get("plain_step"):
        raise ValueError("gpu_estimate needs the plain step's counts (added.plain_step)")
    plain = added["plain_step"]
    sending = max(counted["replicas"] - 1, 1)
    # On a GPU each replica's fault `If` (the plain step's device fault record, the full step's
    # fault branch) reads its one-byte predicate from host memory: one small copy more.
    plain_copies = plain["sends"] / sending + IF_PREDICATE_COPIES
    step_copies = max(added.get("transfers_per_replica", 0) + IF_PREDICATE_COPIES, plain_copies)
    # The window's total, an integer: `ops_per_step` is rounded to 2 decimals.
    extra = round(PROFILED_STEPS * added["ops_per_step"]) - PROFILED_STEPS * plain["kernels"]
    leaves = dict(GPU_BATCH_LEAVES, **(batch_leaves_by_model or {}))

    def priced(kernels, copies):
        kernels, copies = round(kernels), round(copies)
        return {"kernels": kernels, "copies": copies, "us": kernels * launch_us + copies * copy_us}

    models = {}
    for name, variables in variables_by_model.items():
        a, b, h = cost_model["a"], cost_model["b"], cost_model["h"]
        kernels = a * replicas + b * replicas * variables + h
        quiet = priced(kernels, replicas * plain_copies)
        sampled = priced(kernels + extra, replicas * (step_copies + leaves.get(name, 2)))
        mean = quiet["us"] + (sampled["us"] - quiet["us"]) / PROFILED_STEPS
        models[name] = {"variables": variables, "plain": quiet, "sampled": sampled,
                        "mean_us": round(mean, 1)}  # fmt: skip
    return {
        "replicas": replicas,
        "launch_us": launch_us,
        "copy_us": copy_us,
        "sampled_every": PROFILED_STEPS,
        "sampled_extra_kernels": extra,
        "models": models,
    }


def recorded_figures(result):
    """The figures of `result` (`count_model`'s, with `cost_model` when counted) that
    `--record` writes: the replicas, the added counts (with the plain step's by op type), the
    plain step's kernels and `_Send` kernels without and with the callback, the cost model and
    its GPU estimate.
    """
    figures = {"replicas": result["replicas"], "added": result["added"]}
    plain = {
        variant: {key: result[variant]["plain_step"][key] for key in ("kernels", "sends")}
        for variant in ("no_callback", "replica_callback_default")
        if result[variant].get("plain_step")
    }
    if plain:
        figures["plain_step"] = plain
    if "cost_model" in result:
        figures["cost_model"] = result["cost_model"]
    if "gpu_estimate" in result:
        figures["gpu_estimate"] = result["gpu_estimate"]
    return figures


def main(argv=None):
    from benchmarks import fit_overhead

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(fit_overhead.FULL_SIZES), default="mlp")
    parser.add_argument("--keras", choices=("keras3", "tf_keras"), default="keras3")
    parser.add_argument("--sizes", help="JSON sizes (default: fit_overhead's full sizes)")
    common.add_record_argument(parser)
    parser.add_argument(
        "--cost-model",
        action="store_true",
        help="MLP only: also count the MLP at other replica and variable counts (children) and "
        "print the plain step's added kernels as a·R + b·R·V + h",
    )
    args = parser.parse_args(argv)
    sizes = json.loads(args.sizes) if args.sizes else fit_overhead.FULL_SIZES[args.model]
    result = count_model(args.model, sizes, args.keras)
    if args.cost_model:
        if args.model != "mlp" or "plain_step" not in result["added"]:
            raise SystemExit("--cost-model counts the MLP (--model mlp) only")
        own = (
            result["replicas"],
            2 * (sizes.get("hidden_layers", 2) + 1),
            result["added"]["plain_step"]["kernels"],
        )
        others = [_point(r, layers, args.keras) for r, layers in COST_POINTS]
        result["cost_model"] = cost_model([own, *others])
        result["gpu_estimate"] = gpu_estimate(result["cost_model"], GPU_VARIABLES, result)
    print(json.dumps(result, indent=1))
    if args.record:
        key = args.model if args.keras == "keras3" else f"{args.model}_{args.keras}"
        common.record_results("step_counts", {key: recorded_figures(result)}, argv)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
