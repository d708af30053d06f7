"""A job that keeps training while TensorBoard serves it: new steps appended to its event files.

`append_steps(job_dir, count)` appends `count` logged steps to every worker run of a job, as the
workers of a running job do: each worker's values of its last logged step (the tags it writes at
most steps, not its one-off documents) written again at the next steps, its step-time arrival
moved on by its period, and a heartbeat of the status family at the new last step. Records are
appended to each run's newest event file with TensorBoard's record writer, one summary value per
event as TensorFlow's writer appends them, so TensorBoard's loaders and the plugin read them on
from where they were, as they would a running job's.

Used by `benchmarks.job_scale` (the live job) and the tests of the incremental read. No
TensorFlow.
"""

import os
import time

__all__ = ["append_steps", "event_files", "last_step_values", "worker_runs"]


def worker_runs(job_dir):
    """The worker run directories of a job, `job_dir/worker_<i>`, by worker index."""
    names = [n for n in os.listdir(job_dir) if n.startswith(("worker_", "chief_"))]
    return [os.path.join(job_dir, n) for n in sorted(names, key=lambda n: int(n.split("_")[1]))]


def event_files(run_dir):
    """The run's event files, by name (TensorBoard's order)."""
    return sorted(os.path.join(run_dir, n) for n in os.listdir(run_dir) if "tfevents" in n)


def last_step_values(run_dir):
    """`(step, [Summary.Value], heartbeat)` of a run: the values of its last logged step of the
    tags written at more than one step (not the live status tags), and its last heartbeat value
    (None without one)."""
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.compat.proto import event_pb2

    counts, last, values, heartbeat = {}, None, [], None
    for path in event_files(run_dir):
        for record in event_file_loader.RawEventFileLoader(path).Load():
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.tag.startswith("status/"):
                    if value.tag == "status/heartbeat":
                        heartbeat = value
                    continue
                counts[value.tag] = counts.get(value.tag, 0) + 1
                if last is None or event.step > last:
                    last, values = event.step, []
                if event.step == last:
                    values.append(value)
    return last, [v for v in values if counts[v.tag] > 1], heartbeat


def append_steps(job_dir, count, heartbeat=True, now=None, known=None):
    """Appends `count` logged steps (and a heartbeat each) to every worker run of a job.

    Args:
      job_dir: the job's directory (its worker runs `worker_<i>` inside).
      count: steps to append after each worker's last logged step.
      heartbeat: also append a status heartbeat at each new step.
      now: the wall time of the new steps (seconds; default: now).
      known: a dict kept by the caller across calls: `{run_dir: last_step_values(run_dir)}`,
        filled at the first call and moved on by each (a large job's files are then parsed
        once, not at every call).

    Returns:
      The summary values appended, in all.
    """
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer import record_writer
    from tensorboard.util import tensor_util

    now = time.time() if now is None else now
    known = {} if known is None else known
    appended = 0
    for run_dir in worker_runs(job_dir):
        if run_dir not in known:
            known[run_dir] = last_step_values(run_dir)
        step, values, beat = known[run_dir]
        known[run_dir] = (step + count, values, beat)
        with open(event_files(run_dir)[-1], "ab") as handle:
            writer = record_writer.RecordWriter(handle)
            for offset in range(1, count + 1):
                for value in values:
                    event = event_pb2.Event(step=step + offset, wall_time=now + offset * 1e-3)
                    copied = event.summary.value.add()
                    copied.CopyFrom(value)
                    copied.ClearField("metadata")  # written with the tag's first value only
                    if value.tag == "workers/step_time":  # arrival moves on by its period
                        arrival = tensor_util.make_ndarray(value.tensor).copy()
                        period = float(arrival[1]) if float(arrival[1]) > 0 else 1e-3
                        arrival[0] += offset * period
                        copied.tensor.CopyFrom(tensor_util.make_tensor_proto(arrival))
                    writer.write(event.SerializeToString())
                appended += len(values)
                if heartbeat and beat is not None:
                    writer.write(_heartbeat(beat, step + offset, now + offset * 1e-3))
                    appended += 1
            handle.flush()
    return appended


def _heartbeat(value, step, wall):
    """A serialized event holding a status heartbeat at `wall` with `step` its last step."""
    import numpy as np
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    from tb_replica_plugin.families.status import schema

    slots = tensor_util.make_ndarray(value.tensor).astype(np.float64).copy()
    slots[schema.HB_WALL] = slots[schema.HB_STEP_WALL] = slots[schema.HB_ACTIVE_WALL] = wall
    slots[schema.HB_STEP] = slots[schema.HB_COMPLETED] = step
    event = event_pb2.Event(step=int(wall * 1000), wall_time=wall)
    copied = event.summary.value.add(tag=value.tag)
    copied.tensor.CopyFrom(tensor_util.make_tensor_proto(slots))
    return event.SerializeToString()
