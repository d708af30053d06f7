"""Backend speed: the tab's data requests against TensorBoard's scalars plugin, same points.

Writes a synthetic log dir with one run of R replicas × S steps: this plugin's series at every step
(the densest a run can be: `update_freq=1`, a shape event every 1000 steps) and, in the same run,
R scalar series of S steps (one per replica) for the scalars plugin. Both plugins are served from
one `MultiplexerDataProvider` that keeps every sample, like `tensorboard --samples_per_plugin
replicas=0,scalars=0`. Times, after loading:

- `replicas`: the requests the tab makes when it opens a run (`/runs`, `/inputs?run=`,
  `/findings?run=`), through the plugin's WSGI apps, with an empty cache each time (the ratio);
  `replicas_tab_requests_cached` repeats them with the plugin's cache kept;
- `scalars`: the requests TensorBoard's scalars dashboard makes for the same points (`/tags`,
  then `/scalars?run=&tag=` for each of the R tags).

Prints one JSON document with medians over `--repeats` and the ratio replicas / scalars.

    python -m benchmarks.backend [--replicas 8] [--steps 100000] [--repeats 5]
"""

import argparse
import json
import os
import tempfile
import time

from benchmarks import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def write_synthetic_logdir(logdir, replicas, steps, run="synthetic", scalars=True):
    """Writes this plugin's series and R scalar series for `steps` steps, without TensorFlow.

    Args:
      logdir: the log dir to create the run in.
      replicas: number of replicas R.
      steps: number of steps S.
      run: the run (sub-directory) name.
      scalars: also write one scalar series per replica (for the scalars plugin).

    Returns:
      The run directory.
    """
    import numpy as np
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    from tb_replica_plugin import metadata
    from tb_replica_plugin.families.inputs import schema as inputs_schema

    run_dir = os.path.join(logdir, run)
    writer = EventFileWriter(run_dir, max_queue_size=1000, flush_secs=3600)
    dense_meta = metadata.create_summary_metadata(inputs_schema.KIND_BATCH_SIZE)
    shapes_meta = metadata.create_summary_metadata(inputs_schema.KIND_SHAPES)
    devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(replicas)]
    per_replica = np.full(replicas, 32, np.int32)
    for step in range(steps):
        values = []
        sizes = per_replica.copy()
        if step % 1000 == 999:
            sizes[-1] = 7  # an odd batch now and then: a shape event at that step and the next
        if step % 1000 in (0, 999):
            values.append(_shapes_value(sizes, devices, shapes_meta))
        values.append(
            summary_pb2.Summary.Value(
                tag=inputs_schema.TAG_BATCH_SIZE,
                metadata=dense_meta,
                tensor=tensor_util.make_tensor_proto(np.stack([sizes, sizes, sizes])),
            )
        )
        for replica in range(replicas if scalars else 0):
            values.append(
                summary_pb2.Summary.Value(tag=f"loss/replica_{replica}", simple_value=0.5)
            )
        writer.add_event(
            event_pb2.Event(
                step=step, wall_time=1.0e9 + step, summary=summary_pb2.Summary(value=values)
            )
        )
    writer.close()
    return run_dir


def _shapes_value(sizes, devices, shapes_meta):
    """The inputs family's shape document of a step whose replicas' batches are `sizes`."""
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.util import tensor_util

    from tb_replica_plugin.families.inputs import schema as inputs_schema

    replicas = len(sizes)
    document = {
        "inputs": [
            {"name": "x", "dtypes": ["float32"] * replicas, "shapes": [[int(s), 64] for s in sizes]}
        ],
        "devices": devices,
        "replicas": list(range(replicas)),
        "source": "custom_loop",
    }
    return summary_pb2.Summary.Value(
        tag=inputs_schema.TAG_SHAPES,
        metadata=shapes_meta,
        tensor=tensor_util.make_tensor_proto(json.dumps(document).encode()),
    )


def _serving(logdir):
    """`(context, seconds)`: a `TBContext` over a multiplexer that loaded every sample of
    `logdir` (scalars and this plugin's tensors), and the seconds the load took."""
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin

    from tb_replica_plugin import metadata

    start = time.perf_counter()
    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        size_guidance={"scalars": 0, "tensors": 0},
        tensor_size_guidance={metadata.PLUGIN_NAME: 0, "scalars": 0},
        max_reload_threads=1,
    )
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    load_seconds = time.perf_counter() - start
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    context = base_plugin.TBContext(data_provider=provider, multiplexer=multiplexer, logdir=logdir)
    return context, load_seconds


def _client_for(plugin):
    """`get(route, query="") -> body bytes` over the plugin's apps (asserting a 200)."""
    from werkzeug import test as werkzeug_test

    apps = plugin.get_plugin_apps()

    def get(route, query=""):
        response = werkzeug_test.Client(apps[route]).get(f"{route}?{query}")
        assert response.status_code == 200, (route, response.status_code, response.data[:200])
        return response.data

    return get


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    common.add_record_argument(parser)
    args = parser.parse_args(argv)

    from tensorboard.plugins.scalar import scalars_plugin

    from tb_replica_plugin.plugin import ReplicasPlugin

    logdir = tempfile.mkdtemp(prefix="tb_replica_backend_")
    start = time.perf_counter()
    write_synthetic_logdir(logdir, args.replicas, args.steps)
    write_seconds = time.perf_counter() - start
    context, load_seconds = _serving(logdir)
    plugin = ReplicasPlugin(context)
    replicas_get = _client_for(plugin)
    scalars_get = _client_for(scalars_plugin.ScalarsPlugin(context))
    tags = [f"loss/replica_{r}" for r in range(args.replicas)]

    def replicas_requests(cold=True):
        if cold:
            plugin.store.forget()  # the run opened for the first time: nothing read or cached
        replicas_get("/runs")
        replicas_get("/inputs", "run=synthetic")
        replicas_get("/findings", "run=synthetic")

    def scalars_requests():
        scalars_get("/tags")
        for tag in tags:
            scalars_get("/scalars", f"run=synthetic&tag={tag}")

    replicas_requests(), scalars_requests()  # warm-up (imports, caches)
    replicas_seconds = common.median_seconds(replicas_requests, args.repeats)
    cached_seconds = common.median_seconds(lambda: replicas_requests(cold=False), args.repeats)
    scalars_seconds = common.median_seconds(scalars_requests, args.repeats)
    inputs_bytes = len(replicas_get("/inputs", "run=synthetic"))
    result = {
        "benchmark": "backend",
        "machine": common.machine(),
        "replicas": args.replicas,
        "steps": args.steps,
        "points_per_plugin": args.replicas * args.steps,
        "write_seconds": round(write_seconds, 3),
        "load_seconds": round(load_seconds, 3),
        "median_seconds": {
            "replicas_tab_requests": round(replicas_seconds, 4),
            "replicas_tab_requests_cached": round(cached_seconds, 4),
            "scalars_dashboard_requests": round(scalars_seconds, 4),
        },
        "ratio_replicas_to_scalars": round(replicas_seconds / scalars_seconds, 3),
        "inputs_response_bytes": inputs_bytes,
    }
    print(json.dumps(result, indent=1))
    if args.record:
        keys = ("replicas", "steps", "median_seconds", "ratio_replicas_to_scalars")
        common.record_results("backend", {"default": {k: result[k] for k in keys}}, argv)
    return result


if __name__ == "__main__":
    main()
