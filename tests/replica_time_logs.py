"""Synthetic runs with replica ready times (`step_time/replicas`), written without TensorFlow.

TensorBoard's own `EventFileWriter` writes the tags, metadata and layouts the probe writes (one
shapes event naming the replicas, the dense batch sizes and the ready times at every logged
step), so the read side, the routes and the tab can be tested before any training writes them.
"""

import json
import os

import numpy as np

from tb_replica_plugin.families.step_time import schema

# Logged steps of the synthetic runs: a first window of one step (the warm-up), then windows of 10.
STEPS = (0, 10, 20, 30)
WARM_UP = 0.5  # seconds: every replica's ready time in the first (one-step) window


def ready_sample(median, maximum=None, wait=None, window=10):
    """One `step_time/replicas` value, float64 [4, R], from per-replica medians.

    Args:
      median: each replica's median ready seconds over the window.
      maximum: their maximum over the window (default: the medians + 5 ms).
      wait: each replica's median wait (default: the slowest median minus its own).
      window: the steps of the window.

    Returns:
      float64 [4, R].
    """
    median = np.asarray(median, np.float64)
    # Rounded to the nanosecond, so that tests compare with decimal literals (0.035, 0.01).
    maximum = np.round(median + 0.005, 9) if maximum is None else np.asarray(maximum, np.float64)
    wait = np.round(median.max() - median, 9) if wait is None else np.asarray(wait, np.float64)
    return np.stack([median, maximum, wait, np.full(median.shape, float(window))])


def ready_points(medians, steps=STEPS):
    """`[(step, value)]`: a warm-up window of one step at `steps[0]`, then `medians` at every
    later logged step."""
    first = ready_sample(np.full(len(medians), WARM_UP), window=1)
    return [(steps[0], first)] + [(step, ready_sample(medians)) for step in steps[1:]]


def shapes_document(replicas, devices, worker=None, num_workers=1):
    """The JSON of an `inputs/shapes` event naming `replicas` (and the worker of a job)."""
    document = {
        "inputs": [
            {"name": "x", "dtypes": ["float32"] * len(replicas), "shapes": [[8, 3]] * len(replicas)}
        ],
        "devices": list(devices),
        "replicas": list(replicas),
        "source": "custom_loop",
    }
    if worker is not None:
        document["worker"] = {
            "task_type": "worker",
            "task_index": worker,
            "worker": worker,
            "num_workers": num_workers,
            "job": "synthetic",
        }
    return json.dumps(document)


def devices_of(replicas, kind="GPU", worker=None):
    """Device names of `replicas` on one machine: `/job:localhost/.../device:GPU:<i>` (or of
    task `worker` of a job), i counting from 0 on each machine."""
    job = "localhost" if worker is None else "worker"
    task = 0 if worker is None else worker
    return [f"/job:{job}/replica:0/task:{task}/device:{kind}:{i}" for i in range(len(replicas))]


def write_run(logdir, run, replicas, points, devices=None, worker=None, num_workers=1):
    """Writes one run: a shapes event, batch sizes and `points` of `step_time/replicas`.

    Args:
      logdir: the log dir.
      run: the run's sub-directory (a job's worker: `<job>/worker_<i>`).
      replicas: its global replica ids.
      points: `[(step, float64 [4, R])]` of ready times (None: no such tag).
      devices: its replicas' devices (default: `devices_of(replicas, "GPU", worker)`).
      worker, num_workers: the worker's index and the job's worker count (None: a single run).

    Returns:
      The run directory.
    """
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    from tb_replica_plugin import metadata
    from tb_replica_plugin.families.inputs import schema as inputs_schema

    devices = devices_of(replicas, "GPU", worker) if devices is None else devices
    run_dir = os.path.join(logdir, run)
    writer = EventFileWriter(run_dir, max_queue_size=1000, flush_secs=3600)

    def write(step, tag, kind, value):
        summary = summary_pb2.Summary(
            value=[
                summary_pb2.Summary.Value(
                    tag=tag,
                    metadata=metadata.create_summary_metadata(kind),
                    tensor=tensor_util.make_tensor_proto(value),
                )
            ]
        )
        writer.add_event(_event(step, summary))

    document = shapes_document(replicas, devices, worker, num_workers).encode()
    write(0, inputs_schema.TAG_SHAPES, inputs_schema.KIND_SHAPES, document)
    sizes = np.full((3, len(replicas)), 8, np.int32)
    logged = [step for step, _ in points or []] or list(STEPS)
    for step in range(logged[-1] + 1):
        write(step, inputs_schema.TAG_BATCH_SIZE, inputs_schema.KIND_BATCH_SIZE, sizes)
    for step, value in points or []:
        write(step, schema.TAG_REPLICA_TIME, schema.KIND_REPLICA_TIME, np.asarray(value))
    writer.close()
    return run_dir


def _event(step, summary):
    import time

    from tensorboard.compat.proto import event_pb2

    return event_pb2.Event(wall_time=time.time(), step=step, summary=summary)


def write_logdir(logdir):
    """The synthetic log dir of the route, report and browser tests.

    - `slow_gpu`: 4 GPUs of one machine, replica 1 ready at 0.030 s against 0.020 s;
    - `even_gpus`: its twin with every replica at 0.020 s;
    - `job`: 2 workers of 2 GPUs each (global replicas 0–3), replica 3 on worker_1 slow.

    Returns:
      `logdir`.
    """
    write_run(logdir, "slow_gpu", [0, 1, 2, 3], ready_points([0.020, 0.030, 0.020, 0.020]))
    write_run(logdir, "even_gpus", [0, 1, 2, 3], ready_points([0.020] * 4))
    write_run(logdir, "job/worker_0", [0, 1], ready_points([0.020, 0.021]), worker=0, num_workers=2)
    write_run(logdir, "job/worker_1", [2, 3], ready_points([0.020, 0.030]), worker=1, num_workers=2)
    return logdir
