"""Tags and layouts of the status family: how a run is going and how it ended (docs/data-format.md).

Recorded on the host, never inside the training step: a daemon thread of the probe writes a
heartbeat at every background flush, and the probe writes an event when it starts, when the run
ends (cleanly, by an exception or stopped by `halt_on`), when a thread other than the main and
training ones raises, and when it dumps the Python stacks (a stall, or `SIGUSR1`).

Both tags are written at *wall-clock steps*: the TensorBoard step of a status summary is the
wall time in milliseconds since the epoch (strictly increasing per tag and process), not a
training step, so a restarted process that writes the same run appends instead of overwriting
(RustBoard drops the samples at or after a step written again). The training step is inside the
value.

Imported by the writer and the reader; no imports.
"""

# Every `flush_secs` (the heartbeat interval; a few more in a stretch's first seconds): float64
# tensor [HEARTBEAT_FIELDS], the slots below.
TAG_HEARTBEAT = "status/heartbeat"
# Rare: a scalar string tensor holding one JSON object with a "type" (`EVENT_TYPES`).
TAG_EVENT = "status/event"

KIND_HEARTBEAT = "status_heartbeat"
KIND_EVENT = "status_event"

TAGS = {TAG_HEARTBEAT: KIND_HEARTBEAT, TAG_EVENT: KIND_EVENT}

# Heartbeat slots (float64; steps are exact integers below 2**53; -1 where unknown).
HB_WALL = 0  # wall time of this heartbeat (seconds since the epoch)
HB_STEP = 1  # the last training step any family recorded (in-graph counters), -1 before any
HB_STEP_WALL = 2  # wall time when HB_STEP last changed (the probe's start before any step)
HB_ACTIVE_WALL = 3  # wall time of training's last sign of progress: a new step, or another
#                     innermost Python frame of the training thread than at the previous heartbeat
HB_IN_STEP = 4  # 1 when the training thread is inside a TensorFlow function call (a step), else 0
HB_COMPLETED = 5  # the last step the host saw return (Keras `fit`); -1 where unknown (custom loops)
HB_INTERVAL = 6  # seconds between heartbeats (the probe's `flush_secs`)
HB_PID = 7  # the process id
HEARTBEAT_FIELDS = 8

# Event types (the "type" of a TAG_EVENT JSON object):
# - "start": {"wall_time", "pid", "host", "source", "replicas", "devices", "worker" (the probe's
#   `worker` dict, or null), "heartbeat_secs", "stall_secs", "thread" (the training thread's
#   name when the stretch began in a thread other than the main one, else null or absent)} when
#   a stretch of training begins (the training thread: the one it began in).
# - "end": {"wall_time", "state" (one of END_STATES), "how" (what ended it: "fit", "close",
#   "context", "exit", "exception", "cell", "halt"), "step" (the last training step, or null),
#   "exception" (an EXCEPTION object, or null), "findings" (for "halted": the findings that stopped
#   training, as `Finding.to_json()`; else [])}.
# - "exception": {"wall_time", "thread", "exception": EXCEPTION}: a thread other than the main
#   and training ones died of an uncaught exception (the run goes on; the training thread's
#   uncaught exception ends the stretch: an "end" event with how "exception").
# - "stacks": {"wall_time", "reason" ("stall" or "signal"), "step", "active_wall" (HB_ACTIVE_WALL
#   then), "threads": [{"name", "ident", "main", "training" (absent in older runs: the main
#   one), "daemon", "frames": [FRAME, ...] (outermost first)}]}: every thread's Python stack.
# - "worker_failed": {"wall_time", "worker" (the worker's index), "device" (its device, e.g.
#   "/job:worker/replica:0/task:1"), "error_class", "error" (the first line of its message, at most
#   MESSAGE_CHARS characters), "retried" (closures the coordinator put back after this worker's
#   failures so far, this one's included), "step" (the next step the coordinator writes then)}:
#   under `ParameterServerStrategy`, the `ClusterCoordinator` saw a worker fail and put the
#   scheduled step it ran back in its queue (another worker runs it); written by the coordinator.
# - "worker_recovered": {"wall_time", "worker", "device", "step"}: that worker came back (the
#   coordinator reconnected to it).
# EXCEPTION: {"class", "module" (both null when the type is unknown: a Keras `fit` stopped between
#   two steps by an exception the script caught), "message" (at most MESSAGE_CHARS characters),
#   "frames": [FRAME, ...] (the traceback, outermost first), "defined_at": [FRAME, ...]
#   (TensorFlow's "defined at" frames of the failing op, outermost first), "node" (the failing
#   op's node name, or null), "replicas" (global replica ids it names), "devices" (device names
#   it names), "tasks" ([{"task_type", "task_index"}] it names), "unhealthy_tasks" (those it
#   says stopped sending heartbeats), "step" (the training step it was raised at, or null)}.
# FRAME: {"file", "line", "function", "user" (not Python's, TensorFlow's, Keras's or this
#   package's code)}.
EVENT_START = "start"
EVENT_END = "end"
EVENT_EXCEPTION = "exception"
EVENT_STACKS = "stacks"
EVENT_WORKER_FAILED = "worker_failed"
EVENT_WORKER_RECOVERED = "worker_recovered"
EVENT_TYPES = (
    EVENT_START,
    EVENT_END,
    EVENT_EXCEPTION,
    EVENT_STACKS,
    EVENT_WORKER_FAILED,
    EVENT_WORKER_RECOVERED,
)

END_FINISHED = "finished"
END_CRASHED = "crashed"
END_HALTED = "halted"
END_INTERRUPTED = "interrupted"  # KeyboardInterrupt
END_STATES = (END_FINISHED, END_CRASHED, END_HALTED, END_INTERRUPTED)

# Bounds of what an event holds.
MESSAGE_CHARS = 4000
MAX_FRAMES = 64
