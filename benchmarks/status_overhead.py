"""What the status family costs: bytes of heartbeats, and serving a run that heartbeats for an hour.

Two parts, one JSON document:

- `write`: a real `ReplicaProbe` (default strategy, TensorFlow's summary writer) heartbeating
  every `--flush-secs` for `--seconds`; the status summaries' bytes in its event file (each
  record with its 16 bytes of TFRecord framing) divided by the heartbeats it wrote, and that
  times an hour of heartbeats at the default `flush_secs` (5 s: 720). CPU of the heartbeat thread
  is not separable in-process; the per-step CPU with the heartbeat on against off is
  `python -m benchmarks.fit_overhead --models mlp --variants replica_callback_default
  replica_callback_heartbeat_off` (alternated processes).
- `serve`: a synthetic log dir written without TensorFlow (`benchmarks.backend`'s inputs series
  of `--steps` steps, plus an hour of heartbeats (720) and a start event for each of `--workers`
  worker runs of one job, and one single run), served in this process by the plugin over
  TensorBoard's `MultiplexerDataProvider` keeping every sample. Median seconds over `--repeats`
  of what the tab asks when it opens and at each TensorBoard reload: `/overview` cold (empty
  cache), `/overview` again (nothing new: the status judged again from the cached read),
  `/overview` after one more heartbeat per run (only the status tags read again), and
  `/status?run=` of the job; `full_read_after_heartbeat` times the same `/overview` with the
  cache cleared, what every heartbeat would cost if the status counted in the other families'
  data version.

    python -m benchmarks.status_overhead [--seconds 10] [--flush-secs 0.1] [--workers 16]
    python -m benchmarks.status_overhead --quick     # CI: tiny sizes, checks that it runs
"""

import argparse
import json
import os
import statistics
import tempfile
import time

from benchmarks import backend, common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HOUR_OF_HEARTBEATS = 720  # at the default flush_secs of 5 s
DEFAULT_FLUSH_SECS = 5.0


def status_bytes(run_dir):
    """`{"heartbeat": [bytes, count], "event": [bytes, count]}`: the status summaries' TFRecord
    bytes (record and framing) in a run dir, by tag."""
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.compat.proto import event_pb2

    sizes = {"heartbeat": [0, 0], "event": [0, 0]}
    for name in sorted(os.listdir(run_dir)):
        loader = event_file_loader.RawEventFileLoader(os.path.join(run_dir, name))
        for record in loader.Load():
            for value in event_pb2.Event.FromString(record).summary.value:
                family, _, kind = value.tag.partition("/")
                if family == "status":
                    sizes[kind][0] += len(record) + 16  # its length, the CRCs of both
                    sizes[kind][1] += 1
    return sizes


def measure_write(seconds, flush_secs):
    """Heartbeats of a real probe for `seconds`; bytes per heartbeat and per hour."""
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    logdir = tempfile.mkdtemp(prefix="tb_replica_status_write_")
    probe = ReplicaProbe(logdir, tf.distribute.get_strategy(), update_freq=1, flush_secs=flush_secs)
    probe.observe_inputs({"x": tf.zeros([4, 2])})
    cpu, wall = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    probe.close()
    sizes = status_bytes(logdir)
    (beat_bytes, beats), (event_bytes, events) = sizes["heartbeat"], sizes["event"]
    per_heartbeat = beat_bytes / max(beats, 1)
    return {
        "seconds": seconds,
        "flush_secs": flush_secs,
        "heartbeats": beats,
        "bytes_per_heartbeat": round(per_heartbeat, 1),
        "bytes_per_hour_default": round(per_heartbeat * HOUR_OF_HEARTBEATS),
        "events": events,
        "event_bytes": event_bytes,
        "idle_process_cpu_share": round(cpu / wall, 4),
    }


def _heartbeat_values(wall, step):
    import numpy as np

    from tb_replica_plugin.families.status import schema

    values = np.full(schema.HEARTBEAT_FIELDS, -1.0)
    values[schema.HB_WALL] = wall
    values[schema.HB_STEP] = step
    values[schema.HB_STEP_WALL] = wall
    values[schema.HB_ACTIVE_WALL] = wall
    values[schema.HB_IN_STEP] = 1.0
    values[schema.HB_INTERVAL] = DEFAULT_FLUSH_SECS
    values[schema.HB_PID] = 1000
    return values


def write_status(run_dir, start, count, worker=None, first_index=0):
    """Writes `count` heartbeats 5 s apart from `start` (and a start event when `first_index`
    is 0) into a run dir, with TensorBoard's writer (no TensorFlow)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    from tb_replica_plugin import metadata
    from tb_replica_plugin.families.status import schema

    writer = EventFileWriter(run_dir, max_queue_size=1000, flush_secs=3600)
    beat = metadata.create_summary_metadata(schema.KIND_HEARTBEAT)
    event_meta = metadata.create_summary_metadata(schema.KIND_EVENT)

    def add(tag, meta, value, wall):
        proto = tensor_util.make_tensor_proto(value)
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=proto)]
        )
        writer.add_event(event_pb2.Event(step=int(wall * 1000), wall_time=wall, summary=summary))

    if first_index == 0:
        document = {
            "type": "start",
            "wall_time": start - 1,
            "pid": 1000,
            "host": "bench",
            "source": "custom_loop",
            "replicas": [],
            "devices": [],
            "worker": worker,
            "heartbeat_secs": DEFAULT_FLUSH_SECS,
            "stall_secs": 60.0,
        }
        add(schema.TAG_EVENT, event_meta, json.dumps(document).encode(), start - 1)
    for index in range(first_index, first_index + count):
        wall = start + DEFAULT_FLUSH_SECS * index
        add(schema.TAG_HEARTBEAT, beat, _heartbeat_values(wall, index), wall)
    writer.close()


def write_serving_logdir(logdir, workers, steps):
    """One single run and a job of `workers` worker runs, each with inputs and an hour of
    heartbeats ending now; returns `(runs, start)` for `append_heartbeat`."""
    start = time.time() - DEFAULT_FLUSH_SECS * HOUR_OF_HEARTBEATS
    runs = ["single"]
    backend.write_synthetic_logdir(logdir, 4, steps, run="single", scalars=False)
    write_status(os.path.join(logdir, "single"), start, HOUR_OF_HEARTBEATS)
    for index in range(workers):
        run = f"job/worker_{index}"
        info = {
            "task_type": "worker",
            "task_index": index,
            "worker": index,
            "num_workers": workers,
            "job": "bench",
        }
        backend.write_synthetic_logdir(logdir, 1, steps, run=run, scalars=False)
        write_status(os.path.join(logdir, run), start, HOUR_OF_HEARTBEATS, worker=info)
        runs.append(run)
    return runs, start


def measure_serving(workers, steps, repeats):
    """Times of the tab's requests on a log dir whose runs heartbeat for an hour (module doc)."""
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug import test as werkzeug_test

    from tb_replica_plugin import metadata
    from tb_replica_plugin.plugin import ReplicasPlugin

    logdir = tempfile.mkdtemp(prefix="tb_replica_status_serve_")
    runs, start = write_serving_logdir(logdir, workers, steps)
    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={metadata.PLUGIN_NAME: 0}, max_reload_threads=1
    )
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    plugin = ReplicasPlugin(base_plugin.TBContext(logdir=logdir, data_provider=provider))
    plugin.store.listing_reuse_s = 0
    apps = plugin.get_plugin_apps()

    def get(route, query=""):
        response = werkzeug_test.Client(apps[route]).get(f"{route}?{query}")
        assert response.status_code == 200, (route, response.status_code, response.data[:300])
        return response

    beats = [HOUR_OF_HEARTBEATS]

    def new_heartbeat():
        for run in runs:
            write_status(os.path.join(logdir, run), start, 1, first_index=beats[0])
        beats[0] += 1
        multiplexer.Reload()

    def cold():
        plugin.store.forget()
        get("/overview")

    def after_heartbeat():
        new_heartbeat()
        return _timed(lambda: get("/overview"))

    get("/overview")  # warm-up: imports
    figures = {
        "overview_cold": round(common.median_seconds(cold, repeats), 4),
        "overview_again": round(common.median_seconds(lambda: get("/overview"), repeats), 4),
        "status_of_the_job": round(
            common.median_seconds(lambda: get("/status", "run=job"), repeats), 4
        ),
    }
    figures["overview_after_heartbeat"] = round(
        statistics.median(after_heartbeat() for _ in range(repeats)), 4
    )
    figures["full_read_after_heartbeat"] = round(common.median_seconds(cold, repeats), 4)
    body = json.loads(get("/overview").get_data())
    states = {entry["run"]: entry["status"]["state"] for entry in body["runs"]}
    return {
        "workers": workers,
        "steps": steps,
        "heartbeats_per_run": beats[0],
        "states": states,
        "median_seconds": figures,
        "reads_of_live_data": plugin.store.computed["live"],
    }


def _timed(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--flush-secs", type=float, default=0.1)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI)")
    common.add_record_argument(parser)
    args = parser.parse_args(argv)
    common.check_record(parser, args)
    if args.quick:
        args.seconds, args.workers, args.steps, args.repeats = 0.5, 2, 10, 1
    result = {
        "benchmark": "status_overhead",
        "machine": common.machine(),
        "write": measure_write(args.seconds, args.flush_secs),
        "serve": measure_serving(args.workers, args.steps, args.repeats),
    }
    print(json.dumps(result, indent=1))
    if args.record:
        write = {k: result["write"][k] for k in ("bytes_per_heartbeat", "bytes_per_hour_default")}
        serve = {k: result["serve"][k] for k in ("workers", "steps", "heartbeats_per_run")}
        serve["median_seconds"] = result["serve"]["median_seconds"]
        figures = {"write": write, "serve": serve}
        common.record_results("status_overhead", {"default": figures}, argv)
    return result


if __name__ == "__main__":
    main()
