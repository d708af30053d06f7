"""What `ReplicaCallback` adds to one training step, counted (not timed): deterministic figures.

For one model of `benchmarks.fit_overhead` (its sizes, its replicas on logical CPU devices), in one
process, copies of the model are fitted one after the other on the same strategy: without a
callback and with `ReplicaCallback()` (the default). For each:

- from a **profiler trace** (`tf.profiler`, host tracer) of `PROFILED_STEPS` steps of a fit
  (from its step `PROFILE_FROM`): `ops_per_step`, the kernels the executor ran (trace events
  named `<node>:<op type>`), divided by the steps; the window holds one sampled step (every
  16th) of the callback;
- from the **step's partitioned graph** (`RunMetadata.function_graphs` of Keras's train function,
  recorded while a second copy's `fit` instantiates it; one partition per device): `nodes`, the
  nodes of every partition, and `transfers`, the cross-device edges (`_Send` nodes whose
  receiving device is another: each is a send and a receive at every step), by sending and
  receiving device.

Printed: one JSON document with both and their differences (`added`), with
`transfers_per_replica`: the added transfers divided by the replicas that are not on the host's
device (replica 0's logical CPU is the host's own, so on R logical CPU replicas R - 1 replicas
send; on R GPUs all R would).

    python -m benchmarks.step_counts --model mlp     # 4 replicas
    python -m benchmarks.step_counts --model cnn     # MobileNetV2, 2 replicas
"""

import argparse
import atexit
import collections
import glob
import json
import os
import shutil
import sys
import tempfile

from benchmarks import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Steps of the profiled window: one sampling period of the examples family at its default.
PROFILED_STEPS = 16
# The step the profiled window starts at (after the first steps' warm-up).
PROFILE_FROM = 4


def train_function_graph(metadata):
    """The function graph of Keras's train function: of those whose arguments include the
    iterator (tf.data's own functions too), the largest one that all-reduces (a
    `CollectiveReduceV2` in a partition), else the largest as traced; when that one has no
    partitions, the largest partitioned function of the metadata that all-reduces, else the
    largest partitioned one.

    Raises:
      RuntimeError: when no function takes an iterator (the train function was instantiated
        before the run metadata was enabled).
    """
    found = []
    for function in metadata.function_graphs:
        arguments = [
            node.name for node in function.pre_optimization_graph.node if node.op == "_Arg"
        ]
        if any(name.startswith("iterator") for name in arguments):
            found.append(function)
    if not found:
        raise RuntimeError("no train function in the run metadata")

    def reduces(function):
        return any(
            node.op.startswith("CollectiveReduce")
            for partition in function.partition_graphs
            for node in partition.node
        )

    def size(function):
        return sum(len(p.node) for p in function.partition_graphs)

    reducing = [function for function in found if reduces(function)]
    if reducing:
        chosen = max(reducing, key=size)
    else:  # by its graph as traced: tf.data's own small functions may be partitioned when it is not
        chosen = max(found, key=lambda function: len(function.pre_optimization_graph.node))
    if not chosen.partition_graphs:
        # A large step (MobileNetV2 with the callback) is recorded as two entries: the function
        # taking the iterator, without partitions, and its partitioned graph, without a
        # pre-optimization graph: then the largest partitioned function that all-reduces, else
        # (MirroredStrategy on logical CPUs reduces without a collective) the largest one.
        partitioned = [f for f in metadata.function_graphs if f.partition_graphs]
        partitioned = [f for f in partitioned if reduces(f)] or partitioned
        chosen = max(partitioned, key=size) if partitioned else chosen
    return chosen


def graph_counts(function):
    """`{"nodes", "transfers", "transfers_by_devices"}` of one function's partitioned graph."""
    nodes, pairs = 0, collections.Counter()
    for partition in function.partition_graphs:
        nodes += len(partition.node)
        for node in partition.node:
            if node.op not in ("_Send", "_HostSend"):
                continue
            source = node.attr["send_device"].s.decode()
            target = node.attr["recv_device"].s.decode()
            if source != target:
                pairs[f"{_short(source)}->{_short(target)}"] += 1
    return {
        "nodes": nodes,
        "transfers": sum(pairs.values()),
        "transfers_by_devices": dict(sorted(pairs.items())),
    }


def _short(device):
    """`/job:localhost/replica:0/task:0/device:CPU:1` -> `CPU:1`."""
    return device.rsplit("device:", 1)[-1]


def profiled_ops(trace_dir, steps):
    """Kernels run per step in a profiler trace of `steps` steps (events `<node>:<op type>`)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    space = xplane_pb2.XSpace()
    with open(path, "rb") as handle:
        space.ParseFromString(handle.read())
    count = 0
    for plane in space.planes:
        names = {key: value.name for key, value in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                if ":" in name and "::" not in name and not name.startswith(" "):
                    count += 1
    return count / steps


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
    """Counts one variant's step: a profiled window of a model's fit, then the partitioned graph
    of a second copy's (the run metadata TensorFlow records while a function is instantiated
    changes how that function's kernels are traced, so the two are kept apart).

    Args:
      build: a function of no arguments returning `(model, dataset)`.
      callbacks: a function of no arguments returning the variant's callbacks.
      keras: the Keras module.

    Returns:
      The figures of `graph_counts` and `ops_per_step`.
    """
    from tensorflow.python.eager import context

    model, dataset = build()
    trace_dir = tempfile.mkdtemp(prefix="tb_replica_step_counts_")
    try:
        profile = _profile_callback(keras, trace_dir)
        model.fit(dataset, epochs=1, verbose=0, callbacks=[*callbacks(), profile])
        ops_per_step = round(profiled_ops(trace_dir, PROFILED_STEPS), 2)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)
    model, dataset = build()
    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks(), steps_per_epoch=2)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    return {**graph_counts(train_function_graph(metadata)), "ops_per_step": ops_per_step}


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
    added = {key: with_callback[key] - base[key] for key in ("nodes", "transfers")}
    added["ops_per_step"] = round(with_callback["ops_per_step"] - base["ops_per_step"], 2)
    sending = sum(1 for d in devices if tf.DeviceSpec.from_string(d).device_index != 0)
    added["transfers_per_replica"] = round(added["transfers"] / max(sending, 1), 2)
    return {
        "model": model_name,
        "replicas": sizes["replicas"],
        "steps_per_epoch": sizes["steps_per_epoch"],
        **counts,
        "added": added,
    }


def main(argv=None):
    from benchmarks import fit_overhead

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(fit_overhead.FULL_SIZES), default="mlp")
    parser.add_argument("--keras", choices=("keras3", "tf_keras"), default="keras3")
    parser.add_argument("--sizes", help="JSON sizes (default: fit_overhead's full sizes)")
    common.add_record_argument(parser)
    args = parser.parse_args(argv)
    sizes = json.loads(args.sizes) if args.sizes else fit_overhead.FULL_SIZES[args.model]
    result = count_model(args.model, sizes, args.keras)
    print(json.dumps(result, indent=1))
    if args.record:
        key = args.model if args.keras == "keras3" else f"{args.model}_{args.keras}"
        figures = {"replicas": result["replicas"], "added": result["added"]}
        common.record_results("step_counts", {key: figures}, argv)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
