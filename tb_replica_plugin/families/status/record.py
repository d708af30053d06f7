"""The status family, write side: heartbeats, how a run ends, and the stacks of a stalled process.

Nothing here runs in the training step. The probe calls the recorder on the host:

- `begun(how)`: a stretch of training begins (the probe's first record, each `fit`): a start
  event (who, where, which replicas) and the heartbeat's clocks reset; the thread it begins in
  is the *training thread* (the main one, or the thread a loop or `fit` runs in);
- `before_flush(now)`: in the probe's background flush thread, every `flush_secs` (and at the
  few earlier times `flush_due` asks for in a stretch's first seconds): a heartbeat (the last
  step recorded, whether the training thread is inside a TensorFlow function call, when it last
  made progress) and, once per stall, every thread's Python stack;
- `ended(ending)`: the stretch ended (`fit` returned or raised, `close`, a `with` block, an
  uncaught exception, interpreter exit): an end event with the exception, its Python frames and
  the replicas, devices and workers TensorFlow's message names. A Keras `fit` that stopped
  without returning (an exception raised between two steps and caught by the script) and a
  stretch a SIGINT stopped are not recorded "finished": "interrupted" when the chained SIGINT
  handler (`_SigintWatch`) saw one, else "crashed" saying what is known (`_unseen_end`).

Uncaught exceptions reach the recorders through chained `sys.excepthook` and
`threading.excepthook` (the training thread's ends its stretch; another thread's is an event and
the run goes on); interpreter exit through `atexit`; `SIGUSR1` (where the platform has it
and nothing else handles it) asks for the stacks at once: `faulthandler` wakes a small thread
through a pipe even while the main thread is blocked inside TensorFlow, where a Python signal
handler would never run. Everything is written through the probe's own writer, so it reaches
TensorBoard's data provider with the rest of the run.
"""

import atexit
import contextlib
import faulthandler
import json
import os
import signal
import socket
import sys
import threading
import time
import weakref

import numpy as np
import tensorflow as tf

from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from tb_replica_plugin.core.run_end import run_end
from tb_replica_plugin.families.status import attribution, schema

# Seconds without progress before the heartbeat thread writes every thread's stack (once per
# stall). Recorded in the start event: the reader judges the run by it (`Thresholds.stall_seconds`
# None, the default), unless told another stall time.
DEFAULT_STALL_SECS = 60.0
# `RunEnd.how` of a stretch a notebook cell ended (`notebook.py`: IPython's `post_run_cell`).
CELL = "cell"
# The most the process hooks (`sys.excepthook`, `atexit`) wait for a probe's host lock.
HOOK_WAIT_SECS = 10.0
# Extra heartbeats this many seconds after a stretch begins and again after the first heartbeat
# that sees a step (those under `flush_secs`): a process killed in its first seconds, before the
# first regular heartbeat, still says which step it reached (Keras `fit` asks for a heartbeat at
# its first completed step too: `Lifecycle.mark_call`). At most 4 more heartbeats per stretch.
FIRST_BEATS_SECS = (1.0, 2.0, 4.0, 8.0)
# The signal that asks for the stacks (`SIGUSR1`) once a probe installed it, else None.
STACKS_SIGNAL = None
# The innermost Python frame of a thread running a TensorFlow function (a step, or a wait at its
# all-reduce): what tells that the training thread is "inside a step".
_FUNCTION_CALL = ("execute.py", "quick_execute")
# MirroredStrategy's replica threads (`strategy.run` runs each replica's function in one), and the
# frame of the thread that called `strategy.run` while they run.
_REPLICA_THREAD = "_MirroredReplicaThread"
_RUN_FOR_REPLICAS = ("mirrored_run.py", "_call_for_each_replica")


def check_stall_secs(stall_secs):
    """Raises ValueError unless `stall_secs` is a number > 0."""
    if isinstance(stall_secs, bool) or not isinstance(stall_secs, (int, float)) or stall_secs <= 0:
        raise ValueError(f"`stall_secs` must be a number > 0. Received: {stall_secs!r}")


class Recorder(RecorderBase):
    """Heartbeats and events of one probe (see the module docstring).

    Attributes:
      heartbeat: whether the heartbeat (and the stall's stacks) is written; start and end events
        are written either way.
      stall_secs: seconds without progress before the stacks are written.
      stacks_written: how many stacks events it wrote.
    """

    name = "status"

    def __init__(self, probe):
        super().__init__(probe)
        self.heartbeat = True
        self.stall_secs = DEFAULT_STALL_SECS
        self._open = False  # a stretch of training begun and not ended
        self._how = None  # how the last stretch began ("fit", "custom_loop", ...)
        # `(step,)` where a notebook cell ended the last stretch (`notebook.py`): a step recorded
        # after it begins a new one (the loop run again in another cell); None otherwise.
        self._ended_by_cell = None
        # The thread that began the stretch (`begin_run`: a custom loop's first trace, `fit`'s
        # `on_train_begin`): the heartbeat watches it, its death by an exception ends the
        # stretch, and notebook cells leave a stretch trained in a thread of its own alone.
        self._thread = None
        self._clock = _StepClock()
        self._last_written = {}  # tag -> last wall-clock step written (strictly increasing)
        self._stacks_requested = False
        self.stacks_written = 0
        self._first_beats = []  # `time.monotonic()` of the extra heartbeats still due
        self._begin_step = None  # the step the stretch began at (until a heartbeat sees another)
        # What `_on_sigint` saw while the stretch was open: `{"wall", "step", "frames"}`.
        self._sigint = None
        # Events other threads saw (`note_event`), written at the next `write_noted`.
        self._noted = []
        self._noted_lock = threading.Lock()

    # ------------------------------------------------------------------ probe hooks

    @property
    def training_thread(self):
        """The thread that began the last stretch (None before any)."""
        return self._thread

    @property
    def is_open(self):
        """Whether a stretch has begun and not ended."""
        return self._open

    def begun(self, how):
        self._begin(how, _training_thread())

    def _begin(self, how, thread):
        if self._open:
            if not (how == "fit" and self._how == "fit"):
                return
            # The previous `fit` never returned (its on_train_end did not run): say so first.
            self.ended(run_end("fit", unreturned=True))
        self._open, self._how, self._ended_by_cell, self._thread = True, how, None, thread
        self._sigint = None
        LIVE.add(self)
        _SIGINT.watch()
        now = time.time()
        self._clock = _StepClock(now)
        static = self.probe.static or {}
        self._event(
            schema.EVENT_START,
            now,
            pid=os.getpid(),
            host=socket.gethostname(),
            source=static.get("source", how),
            how=how,
            replicas=list(static.get("replicas", [])),
            devices=list(static.get("devices", [])),
            worker=static.get("worker"),
            heartbeat_secs=float(self.probe.flush_secs) if self.heartbeat else None,
            stall_secs=float(self.stall_secs) if self.heartbeat else None,
            thread=None if self._thread is threading.main_thread() else self._thread.name,
        )
        self._begin_step = self._beat(now)  # a run killed before the first flush has one too
        self._plan_first_beats()

    def before_flush(self, now):
        self.write_noted()
        if not self._open:
            self._resume_after_cell()
            return
        step = self._beat(now)
        due = time.monotonic() + 0.05
        self._first_beats = [t for t in self._first_beats if t > due]
        if self._begin_step is not None and step is not None and step != self._begin_step:
            self._begin_step = None  # the first heartbeat that sees a step: a few more soon
            self._plan_first_beats()
        stalled = self.heartbeat and now - self._clock.active_wall > self.stall_secs
        if self._stacks_requested or (stalled and self._clock.take_stall()):
            reason = "signal" if self._stacks_requested else "stall"
            self._stacks_requested = False
            self.write_stacks(now, reason, step)

    def ended(self, run_end):
        self.write_noted()  # before the end record
        self._resume_after_cell()  # a loop run again and ended before a heartbeat saw it
        if not self._open:
            return
        self._open, self._first_beats = False, []
        LIVE.discard(self, ended_by_cell=run_end.how == CELL)
        _SIGINT.unwatch()
        now = time.time()
        self._beat(now)  # where it ended
        step = run_end.step if run_end.step is not None else self.probe.recorded_step()
        if run_end.how == CELL:
            self._ended_by_cell = (step,)
        state, error = run_end.state, None
        if run_end.error is not None:
            error = self._exception(run_end.error, step, run_end.context)
        elif self._stopped_unseen(run_end):
            state, error = self._unseen_end(run_end.how, step)
        self._event(
            schema.EVENT_END,
            now,
            state=state,
            how=run_end.how,
            step=step,
            exception=error,
            findings=[_finding_json(f) for f in run_end.findings],
        )

    def write_window(self):
        self.write_noted()

    def close(self):
        LIVE.discard(self)
        _SIGINT.unwatch()
        self._open, self._ended_by_cell, self._first_beats = False, None, []
        super().close()

    def flush_due(self):
        """The next extra heartbeat of a stretch's first seconds (`FIRST_BEATS_SECS`), or None."""
        if not (self._open and self.heartbeat and self._first_beats):
            return None
        return self._first_beats[0]

    def _plan_first_beats(self):
        start = time.monotonic()
        flush_secs = self.probe.flush_secs
        self._first_beats = [start + s for s in FIRST_BEATS_SECS if s < flush_secs]

    # ------------------------------------------------------------------ ends nobody saw

    def sigint_arrived(self, wall, frame):
        """`_on_sigint`, in the main thread between two bytecodes (no lock, no TensorFlow: the
        thread may hold any of them): notes the first SIGINT of the open stretch."""
        if self._open and self._sigint is None:
            self._sigint = {
                "wall": wall,
                "step": self.probe.host_steps[0],  # plain ints (Keras `fit`), else None
                "frames": attribution.frames_from_stack(frame),
            }

    def _stopped_unseen(self, run_end):
        """Whether a clean-looking end hides how training stopped: a Keras `fit` that never
        returned (ended by anything but its own `on_train_end`), or a stretch a SIGINT
        interrupted (the script caught the KeyboardInterrupt, then closed or exited)."""
        if run_end.state != schema.END_FINISHED or run_end.findings:
            return False
        if self._how == "fit":
            return run_end.how != "fit" or run_end.unreturned
        return self._sigint is not None

    def _unseen_end(self, how, step):
        """`(state, EXCEPTION)` of an end `_stopped_unseen` found: "interrupted" with a
        KeyboardInterrupt at the frames where a SIGINT landed when one did; else (a `fit` whose
        exception the script caught: Python tells nobody its type) "crashed" with an exception
        of unknown class whose message says what is known."""
        fit = self._how == "fit"
        if self._sigint is not None:
            at = self._sigint["step"] if self._sigint["step"] is not None else step
            stopped = "fit stopped without returning (on_train_end never ran)" if fit else ""
            if fit and at != step:
                stopped = f"fit stopped at step {step} without returning (on_train_end never ran)"
            message = (
                f"SIGINT (Ctrl-C) at step {at}: {stopped + '; ' if stopped else ''}the script "
                f"caught the KeyboardInterrupt, then {_AFTERWARDS.get(how, how)}"
            )
            record = self._exception(KeyboardInterrupt(message), step, ())
            record["frames"] = self._sigint["frames"]
            return schema.END_INTERRUPTED, record
        stopped = f"fit stopped at step {step} without returning (on_train_end never ran)"
        thread = self._thread
        running = thread is not None and thread.is_alive()
        if how == "exit" and running and thread is not threading.current_thread():
            message = (
                f"{stopped}: the interpreter exited while fit still ran in thread "
                f"{thread.name!r} (a daemon thread)"
            )
            return schema.END_CRASHED, self._unknown_exception(message, step)
        message = f"{stopped}: an exception left fit and {_CAUGHT.get(how, how)}"
        return schema.END_CRASHED, self._unknown_exception(message, step)

    def _unknown_exception(self, message, step):
        record = self._exception(RuntimeError(message), step, ())
        record.update({"class": None, "module": None})
        return record

    def _resume_after_cell(self):
        """After a notebook cell ended the stretch (`notebook.py`): once the probe records a
        step past where it ended (the loop run again in a later cell), a new stretch begins (a
        "start" event: a new segment; a crash stays listed in the earlier one)."""
        if self._ended_by_cell is None:
            return
        step = self.probe.recorded_step()
        if step is not None and step != self._ended_by_cell[0]:
            self._begin(self._how or "custom_loop", self._thread)

    # ------------------------------------------------------------------ events

    def thread_died(self, args):
        """Thread `args.thread` died of `args.exc_value`: the stretch's training thread ends it
        (crashed, as an uncaught exception of the main thread does); another thread's death is
        an "exception" event (the run goes on)."""
        if not self._open:
            return
        if args.thread is self._thread:
            self.probe.end_run("exception", args.exc_value, wait=HOOK_WAIT_SECS)
            return
        now = time.time()
        thread = getattr(args.thread, "name", None) or "unknown"
        record = self._exception(args.exc_value, self.probe.recorded_step(), ())
        self._event(schema.EVENT_EXCEPTION, now, thread=thread, exception=record)

    def write_stacks(self, now, reason, step):
        """Writes a "stacks" event: every thread's Python stack, outermost frame first."""
        main = threading.main_thread().ident
        training = (self._thread or threading.main_thread()).ident
        names = {t.ident: t for t in threading.enumerate()}
        threads = []
        for ident, frame in sys._current_frames().items():  # noqa: SLF001 - as faulthandler
            thread = names.get(ident)
            threads.append(
                {
                    "name": thread.name if thread is not None else f"thread {ident}",
                    "ident": ident,
                    "main": ident == main,
                    "training": ident == training,
                    "daemon": bool(thread.daemon) if thread is not None else None,
                    "frames": attribution.frames_from_stack(frame),
                }
            )
        threads.sort(key=lambda t: (not t["main"], t["name"]))
        self.stacks_written += 1
        self._event(
            schema.EVENT_STACKS,
            now,
            reason=reason,
            step=step,
            active_wall=self._clock.active_wall,
            threads=threads,
        )

    def request_stacks(self):
        """The next heartbeat writes every thread's stack (`SIGUSR1`)."""
        self._stacks_requested = True

    def note_event(self, event_type, wall, **fields):
        """Keeps an event seen by another thread (e.g. a `ClusterCoordinator`'s worker thread:
        `write.pss_failures`), written at the next `write_noted`. Takes no lock of the
        probe's and runs no TensorFlow: safe from any thread, at any time.

        Args:
          event_type: one of `schema.EVENT_TYPES`.
          wall: when it happened (seconds since the epoch): the event's "wall_time".
          **fields: the event's other fields (JSON values).
        """
        with self._noted_lock:
            self._noted.append((event_type, wall, fields))

    def write_noted(self):
        """Writes the events `note_event` kept (in the order noted; the probe's host lock is
        taken for each). Called at each background flush, at `flush`/`close` (`write_window`),
        before the end record, and by `write.pss_failures` at each `probe.schedule`."""
        with self._noted_lock:
            noted, self._noted = self._noted, []
        for event_type, wall, fields in noted:
            self._event(event_type, wall, **fields)

    # ------------------------------------------------------------------ writing

    def _beat(self, now):
        """Writes a heartbeat (when on); returns the step it recorded."""
        step = self.probe.recorded_step()
        if self.heartbeat:
            frame = _frame_of(self._thread)
            self._clock.tick(now, step, _frame_key(frame))
            values = self._clock.heartbeat(now, step, _in_function_call(frame), self.probe)
            self._write(schema.TAG_HEARTBEAT, schema.KIND_HEARTBEAT, now, values)
        return step

    def _exception(self, error, step, context):
        static = self.probe.static or {}
        replicas = list(static.get("replicas", []))

        def global_replica(local):
            return replicas[local] if 0 <= local < len(replicas) else local

        record = attribution.exception_record(
            error, step=step, replicas_of=global_replica, devices=static.get("devices")
        )
        if context:
            above = [attribution.make_frame(f.filename, f.lineno, f.name) for f in context]
            record["frames"] = (above + record["frames"])[-schema.MAX_FRAMES :]
        return record

    def _event(self, event_type, now, **fields):
        document = json.dumps({"type": event_type, "wall_time": now, **fields}, default=str)
        self._write(schema.TAG_EVENT, schema.KIND_EVENT, now, document.encode("utf-8"))

    def _write(self, tag, kind, now, value):
        """Queues one summary at the wall-clock step of `now` (strictly increasing per tag)."""
        with self.probe.host_lock:  # the flush thread, the main thread, a dying thread
            step = max(int(now * 1000), self._last_written.get(tag, -1) + 1)
            self._last_written[tag] = step
            self.probe.write_now(tag, lambda: tf.constant(value), step, kind)


class _StepClock:
    """When training last made progress: a new step, or another innermost frame of its thread."""

    def __init__(self, now=None):
        now = time.time() if now is None else now
        self.step = None
        self.step_wall = now
        self.active_wall = now
        self._frame = None
        self._stall_reported = None  # the active_wall of the stall whose stacks were written

    def tick(self, now, step, frame_key):
        if step != self.step:
            self.step, self.step_wall, self.active_wall = step, now, now
        if frame_key != self._frame:
            self._frame, self.active_wall = frame_key, now

    def take_stall(self):
        """True once per stall (per `active_wall`): its stacks are to be written."""
        if self._stall_reported == self.active_wall:
            return False
        self._stall_reported = self.active_wall
        return True

    def heartbeat(self, now, step, in_step, probe):
        values = np.full(schema.HEARTBEAT_FIELDS, -1.0)
        completed = probe.host_steps[1]
        values[schema.HB_WALL] = now
        values[schema.HB_STEP] = -1 if step is None else step
        values[schema.HB_STEP_WALL] = self.step_wall
        values[schema.HB_ACTIVE_WALL] = self.active_wall
        values[schema.HB_IN_STEP] = 1.0 if in_step else 0.0
        values[schema.HB_COMPLETED] = -1 if completed is None else completed
        values[schema.HB_INTERVAL] = probe.flush_secs
        values[schema.HB_PID] = os.getpid()
        return values


def _training_thread():
    """The thread training runs in: this one, or, in a MirroredStrategy replica thread (where
    `strategy.run` traces each replica's function, and the probe's first record may begin the
    stretch), the thread waiting in `strategy.run` for it (the main thread when none is found)."""
    current = threading.current_thread()
    if type(current).__name__ != _REPLICA_THREAD:
        return current
    threads = {t.ident: t for t in threading.enumerate() if type(t).__name__ != _REPLICA_THREAD}
    for ident, frame in sys._current_frames().items():  # noqa: SLF001 - as faulthandler
        if ident not in threads:
            continue
        while frame is not None:
            code = frame.f_code
            if code.co_name == _RUN_FOR_REPLICAS[1] and code.co_filename.endswith(
                _RUN_FOR_REPLICAS[0]
            ):
                return threads[ident]
            frame = frame.f_back
    return threading.main_thread()


def _frame_of(thread):
    """The innermost frame of `thread` (None: the main thread), or None once it has ended."""
    thread = thread or threading.main_thread()
    if not thread.is_alive():
        return None  # (its ident may be another thread's now)
    return sys._current_frames().get(thread.ident)  # noqa: SLF001


def _frame_key(frame):
    """What identifies where a thread is: the innermost frame (id, code, instruction)."""
    if frame is None:
        return None
    return (id(frame), frame.f_code, frame.f_lasti)


def _in_function_call(frame):
    """Whether the stack from `frame` outwards runs a TensorFlow function (`quick_execute`)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == _FUNCTION_CALL[1] and code.co_filename.endswith(_FUNCTION_CALL[0]):
            return True
        frame = frame.f_back
    return False


# What the script did after catching the exception that stopped training, by `RunEnd.how`.
_AFTERWARDS = {
    "exit": "exited normally",
    "close": "closed the probe",
    "context": "left the probe's `with` block",
    "fit": "began another fit",
    "evaluate": "began evaluate with the callback",
    "predict": "began predict with the callback",
    "cell": "the notebook cell ended",
}
_CAUGHT = {
    "exit": (
        "the script exited normally (it caught the exception, or the exception was SystemExit)"
    ),
    "close": "the script caught it, then closed the probe",
    "fit": "the script caught it, then began another fit",
    "evaluate": "the script caught it, then began evaluate with the callback",
    "predict": "the script caught it, then began predict with the callback",
    "cell": "the notebook cell caught it",
}


def _finding_json(finding):
    to_json = getattr(finding, "to_json", None)
    return to_json() if to_json is not None else {"message": str(finding)}


# ---------------------------------------------------------------------- process-wide hooks


class _Live:
    """The status recorders of open stretches of training (and of those a notebook cell ended,
    which may begin again), and the process hooks they need.

    The first recorder that begins installs, once per process, the chained `sys.excepthook` and
    `threading.excepthook`, the `atexit` handler, the `SIGUSR1` stacks request and, in IPython,
    the notebook cells' events (`notebook.py`).
    """

    def __init__(self):
        self._recorders = weakref.WeakSet()
        self._ended_by_cell = weakref.WeakSet()
        self._lock = threading.Lock()
        self._installed = False
        # Weak references to the open ones, replaced whole under the lock: what a signal
        # handler reads (it may run while its own thread holds the lock).
        self.snapshot = ()

    def add(self, recorder):
        with self._lock:
            self._recorders.add(recorder)
            self._ended_by_cell.discard(recorder)
            self.snapshot = tuple(weakref.ref(r) for r in self._recorders)
            if not self._installed:
                self._installed = True
                _install_hooks()

    def discard(self, recorder, ended_by_cell=False):
        """No longer open; with `ended_by_cell`, kept among those a cell ended."""
        with self._lock:
            self._recorders.discard(recorder)
            self.snapshot = tuple(weakref.ref(r) for r in self._recorders)
            if ended_by_cell:
                self._ended_by_cell.add(recorder)
            else:
                self._ended_by_cell.discard(recorder)

    def recorders(self, ended_by_cell=False):
        """The open ones; with `ended_by_cell`, also those a notebook cell ended."""
        with self._lock:
            found = list(self._recorders)
            return found + list(self._ended_by_cell) if ended_by_cell else found


LIVE = _Live()


def _install_hooks():
    previous_hook = sys.excepthook
    previous_thread_hook = threading.excepthook

    def excepthook(exc_type, error, tb):
        for recorder in LIVE.recorders():
            _quietly(recorder.probe.end_run, "exception", error, wait=HOOK_WAIT_SECS)
        previous_hook(exc_type, error, tb)

    def thread_excepthook(args):
        if args.thread is not threading.main_thread():
            for recorder in LIVE.recorders():
                _quietly(recorder.thread_died, args)
        previous_thread_hook(args)

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
    atexit.register(_at_exit)
    _listen_for_stacks_signal()
    from tb_replica_plugin.families.status import notebook

    notebook.watch_cells(
        lambda: LIVE.recorders(ended_by_cell=True),
        lambda recorder, *error: _quietly(
            recorder.probe.end_run, CELL, *error, wait=HOOK_WAIT_SECS
        ),
    )


class _SigintWatch:
    """A SIGINT handler chained before Python's own while a stretch is open, so that a stretch
    that Ctrl-C stopped reads "interrupted" even when the script caught the KeyboardInterrupt
    (e.g. `try: model.fit(...) except KeyboardInterrupt: model.save(...)`): `fit` then never
    returns nor sees the exception (it leaves from another callback or between two steps),
    and Python tells nobody what left it.

    Installed only from the main thread and only over Python's `default_int_handler` (a handler
    of the user's, IPython's or asyncio's is left alone); the handler notes the SIGINT in each
    open stretch (`Recorder.sigint_arrived`) and calls `default_int_handler`, which raises the
    KeyboardInterrupt as before (its traceback shows one more frame, `_on_sigint`). Put back
    when no stretch is open. Nothing runs per step.
    """

    def watch(self):
        """Installs the handler (main thread, over `default_int_handler` only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        with contextlib.suppress(ValueError, OSError, RuntimeError):
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                signal.signal(signal.SIGINT, _on_sigint)

    def unwatch(self):
        """Puts `default_int_handler` back once no stretch is open (if still ours)."""
        if LIVE.snapshot or threading.current_thread() is not threading.main_thread():
            return
        with contextlib.suppress(ValueError, OSError, RuntimeError):
            if signal.getsignal(signal.SIGINT) is _on_sigint:
                signal.signal(signal.SIGINT, signal.default_int_handler)


def _on_sigint(signum, frame):
    """SIGINT: every open stretch notes it, then Python's own handler raises KeyboardInterrupt."""
    wall = time.time()
    for ref in LIVE.snapshot:
        recorder = ref()
        if recorder is not None:
            _quietly(recorder.sigint_arrived, wall, frame)
    signal.default_int_handler(signum, frame)


_SIGINT = _SigintWatch()


def _at_exit():
    """The interpreter exits normally with probes still open: a clean end for each."""
    for recorder in LIVE.recorders():
        _quietly(recorder.probe.end_run, "exit", wait=HOOK_WAIT_SECS)


def _quietly(function, *args, **kwargs):
    """`function(*args, **kwargs)`; a hook must never fail the user's program."""
    with contextlib.suppress(Exception):
        function(*args, **kwargs)


def _listen_for_stacks_signal():
    """`SIGUSR1` writes every thread's stack at the next heartbeat, even while the main thread
    is blocked inside TensorFlow: `faulthandler`'s C handler writes into a pipe that a daemon
    thread reads (a Python signal handler would wait for the main thread). Only where the
    platform has `SIGUSR1` and no Python handler is set for it."""
    signum = getattr(signal, "SIGUSR1", None)
    if signum is None or signal.getsignal(signum) not in (signal.SIG_DFL, None):
        return
    try:
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)  # a full pipe drops the dump, never blocks the handler
        faulthandler.register(signum, file=os.fdopen(write_end, "w"), all_threads=True)
    except (OSError, RuntimeError, ValueError, AttributeError):
        return
    name = "tb_replica_plugin-stacks"
    threading.Thread(target=_stacks_requests, args=(read_end,), name=name, daemon=True).start()
    global STACKS_SIGNAL
    STACKS_SIGNAL = signum


def _stacks_requests(read_end):
    """The `SIGUSR1` thread: each dump `faulthandler` writes into the pipe asks every open
    probe for its stacks at the next heartbeat (due at once)."""
    while True:
        try:
            data = os.read(read_end, 65536)
        except OSError:
            return
        if not data:
            return
        while True:  # drain the rest of this dump
            try:
                os.set_blocking(read_end, False)
                if not os.read(read_end, 65536):
                    break
            except BlockingIOError:
                break
            finally:
                os.set_blocking(read_end, True)
        for recorder in LIVE.recorders():
            recorder.request_stacks()
            recorder.probe.flush_soon()
