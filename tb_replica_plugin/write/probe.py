"""The probe's core: writer, recording gate, step decision, warn-once and dispatch to families.

    replica context ── merge_call ──► cross-replica context
        per-replica tensors of this step → family recorders (in-graph, small) → queued summaries

`ProbeCore` knows no family: `ReplicaProbe` (`tb_replica_plugin.probe`) is this class plus each
registered family's `Recording` mixin (its `observe_*` methods), and the recorders come from the
registry (each family's `Family.write_side`). The core reaches the families only through the
recorders' public hooks (`core.recorder.Recorder`): `write.halt` (the `halt_on` decision) reads
the fault state a recorder keeps (`Recorder.fault_state`, the gradients family's NaN/Inf check)
through `ProbeCore.fault_state`, and the status family hears `write.lifecycle`.

Everything runs in the graph of the training step; the host is not synchronised at any step.
Reliability: nothing in the step's graph touches the event file. In-graph writes only queue events
in the writer (gated by one `recording` variable; the writer never flushes by itself); the file is
written by host-side flushes (`write.flusher`, `flush`, `close`). An I/O error surfaces on the host,
is warned about once and turns recording off; it can never fail a training step.
"""

import contextlib
import logging
import os
import re
import threading
import time
import warnings

import tensorflow as tf

from tb_replica_plugin import registry
from tb_replica_plugin.core import distribute
from tb_replica_plugin.core.recorder import host_variable
from tb_replica_plugin.write.flusher import FLUSHER
from tb_replica_plugin.write.lifecycle import Lifecycle
from tb_replica_plugin.write.pss import ParameterServer
from tb_replica_plugin.write.shipping import Shipping
from tb_replica_plugin.write.steps import StepAxis
from tb_replica_plugin.write.summary_writes import SummaryWrites
from tb_replica_plugin.write.variants import Variants

logger = logging.getLogger("tb_replica_plugin.probe")

SOURCES = ("fit", "custom_loop", "inspect_dataset")

# Default sampling period of the examples family (per-example fingerprints and overlaps): every
# this many steps, and always at logged steps (docs/benchmarks.md).
DEFAULT_EXAMPLES_EVERY = 16
# Default seconds between background flushes: at most this much recorded data is lost when the
# process is killed (SIGKILL, OOM killer) without running any Python.
DEFAULT_FLUSH_SECS = 5.0
# The writer never flushes from inside the step's graph (where an I/O error would fail the step):
# the queue is emptied by host-side flushes only. The queue bound (events, whatever their size) is
# a memory guard reached only if the host stops flushing.
_MAX_QUEUE = 1_000_000
_NEVER_FLUSH_MILLIS = 2**31 - 1
# The sampled and fault branches as functional `If`s (`core.recorder.run_if(as_function=...)`):
# None decides per probe (every local replica device a CPU); True or False forces it (tests
# compare both ways on the same training).
BRANCHES_AS_FUNCTIONS = None


def check_examples_every(examples_every):
    """Raises ValueError unless `examples_every` is an integer >= 1 (the examples' period)."""
    if (
        isinstance(examples_every, bool)
        or not isinstance(examples_every, int)
        or examples_every < 1
    ):
        raise ValueError(f"`examples_every` must be an integer >= 1. Received: {examples_every!r}")


def check_update_freq(update_freq, words=None):
    """Raises ValueError unless `update_freq` is a period its caller takes.

    Args:
      update_freq: the value given.
      words: None for a probe, which takes an integer >= 1 or None (the host writes the
        window); for `ReplicaCallback` the words it takes besides a positive integer
        ("epoch", "batch"), named by the message.

    Raises:
      ValueError: naming what is taken and what was received.
    """
    if isinstance(update_freq, int) and not isinstance(update_freq, bool) and update_freq >= 1:
        return
    if words is None:
        if update_freq is not None:
            raise ValueError(
                f"`update_freq` must be an integer >= 1 or None. Received: {update_freq!r}"
            )
    elif not (isinstance(update_freq, str) and update_freq in words):
        raise ValueError(
            f"`update_freq` must be {', '.join(repr(w) for w in words)} or a positive integer. "
            f"Received: update_freq={update_freq!r}"
        )


def check_flush_secs(flush_secs):
    """Raises ValueError unless `flush_secs` is a number > 0 (seconds between flushes)."""
    if (
        isinstance(flush_secs, bool)
        or not isinstance(flush_secs, (int, float))
        or not flush_secs > 0
    ):
        raise ValueError(f"`flush_secs` must be a number > 0. Received: {flush_secs!r}")


class ProbeCore(Shipping, SummaryWrites, Lifecycle, Variants, ParameterServer):
    """Writer, recording gate, step decision, warn-once and family dispatch of `ReplicaProbe`.

    See `tb_replica_plugin.ReplicaProbe` for the arguments.
    """

    def __init__(
        self,
        log_dir,
        strategy=None,
        update_freq=100,
        source="custom_loop",
        flush_secs=DEFAULT_FLUSH_SECS,
        per_worker_run=True,
        examples_every=DEFAULT_EXAMPLES_EVERY,
    ):
        check_update_freq(update_freq)
        if source not in SOURCES:
            raise ValueError(f"`source` must be one of {SOURCES}. Received: {source!r}")
        check_examples_every(examples_every)
        check_flush_secs(flush_secs)
        self.log_dir = os.fspath(log_dir)
        self.update_freq = update_freq
        self.source = source
        self.flush_secs = float(flush_secs)
        self.per_worker_run = per_worker_run
        self.examples_every = examples_every
        self._strategy = strategy
        self._worker = None
        self._run_dir = None
        self._writer = None
        self._core = None  # the core's state variables once built
        self._static = None
        self._disabled_reason = None
        self._warned = set()
        self._lock = threading.RLock()  # host-side writer use (main and flush threads)
        self._next_flush = 0.0
        self._dir_identity = None
        self._axis = StepAxis()  # the one step every family records at (`write.steps`)
        self._gated = {}  # id -> weakref of the tensors `gated` returned
        self._init_lifecycle()
        self._init_shipping()
        self._init_variants()
        self._recorders = {name: cls(self) for name, cls in recorder_classes()}

    # ------------------------------------------------------------------ set-up

    @property
    def strategy(self):
        return self._strategy or tf.distribute.get_strategy()

    @property
    def worker(self):
        """This worker's place in a multi-worker job (see `core.distribute.worker_info`), None on
        one worker. Known once the probe has recorded (or `set_step` was called)."""
        return self._worker

    @property
    def run_dir(self):
        """The directory this probe writes: `log_dir`, or `log_dir/<task_type>_<task_index>` for
        a worker of a multi-worker job (with `per_worker_run`). None before the first record."""
        return self._run_dir

    @property
    def disabled_reason(self):
        """Why recording stopped (None while recording; set by `close` too)."""
        return self._disabled_reason

    @property
    def static(self):
        """What is known before any step: `devices`, `replicas` (global ids), `source`, and
        `worker` in a multi-worker job (dict, JSON-serialisable)."""
        return self._static

    @property
    def num_replicas(self):
        return len(self._static["devices"])

    @property
    def step_axis(self):
        """The probe's step axis (`write.steps.StepAxis`)."""
        return self._axis

    @property
    def branches_as_functions(self):
        """Whether the sampled and fault branches stay functions (`run_if(as_function=True)`):
        where every local replica device is a CPU (their inputs move to the host by
        reference), unless `BRANCHES_AS_FUNCTIONS` says otherwise."""
        if BRANCHES_AS_FUNCTIONS is not None:
            return bool(BRANCHES_AS_FUNCTIONS)
        return all(
            tf.DeviceSpec.from_string(device).device_type == "CPU"
            for device in self._static["devices"]
        )

    def recorder(self, name):
        """The recorder of family `name` (see `core.recorder.Recorder`).

        Raises:
          KeyError: if no registered family of that name has a write side.
        """
        return self._recorders[name]

    def recorders(self):
        """Every family's recorder, in registry order."""
        return list(self._recorders.values())

    def build(self):
        """Creates the writer and every family's state once, outside any graph.

        Called by the first `observe_*` or `set_step`; call it before the first step is traced
        (`ReplicaCallback` does) so the step is traced once: variables created inside a
        `tf.function`'s first trace make TensorFlow trace it again.

        Returns:
          True when recording, False when recording is off (warned once).
        """
        if self.pss_refuses():  # ParameterServerStrategy: only steps given to `schedule`
            return False
        if self._core is not None or self._disabled_reason:
            return self._core is not None
        with tf.init_scope():
            strategy = self.strategy
            try:
                self._worker = distribute.worker_info(strategy)
            except Exception as error:  # noqa: BLE001 - a single-worker view is still useful
                self._warn_once("worker", f"tb_replica_plugin: unknown worker of the job: {error}")
                self._worker = None
            run_dir = self.log_dir
            if self._worker is not None and self.per_worker_run:
                worker = self._worker
                run_dir = os.path.join(run_dir, f"{worker['task_type']}_{worker['task_index']}")
            self._run_dir = run_dir
            try:
                self._writer = tf.summary.create_file_writer(
                    run_dir, max_queue=_MAX_QUEUE, flush_millis=_NEVER_FLUSH_MILLIS
                )
                self._writer.flush()  # creates the event file now: unwritable dirs fail here
                self._dir_identity = _dir_identity(run_dir)
            except Exception as error:  # noqa: BLE001 - any failure must not stop training
                self._disable(f"cannot write summaries to {run_dir!r}: {error}")
                return False
            devices = distribute.local_devices(strategy)
            # Global replica ids: MultiWorkerMirroredStrategy numbers the replicas of the worker
            # with id `worker` from `worker * local replicas` (replica_id_in_sync_group).
            first = self._worker["worker"] * len(devices) if self._worker else 0
            self._static = {
                "devices": devices,
                "replicas": list(range(first, first + len(devices))),
                "source": self.source,
                **self.pss_static(strategy),
            }
            if self._worker is not None:
                self._static["worker"] = dict(self._worker)
            with tf.device("/cpu:0"):
                self._core = {
                    # Gates every in-graph write: False once recording is disabled. Its own
                    # variable: the host may turn it off while a step runs.
                    "recording": host_variable(True, name="probe_recording"),
                    # A step sampled and logged whatever the period says (-1: none);
                    # `ReplicaCallback` sets it to the last step of each epoch.
                    "log_at": host_variable(tf.constant(-1, tf.int64), name="probe_log_at"),
                }
            self._axis.create(self._axis.start)
            for recorder in self._recorders.values():
                recorder.create_state()
        self._next_flush = time.monotonic() + self.flush_secs
        FLUSHER.register(self)
        if self.source != "fit":
            # A custom loop's run begins at its first record. `ReplicaCallback` ("fit") begins
            # each fit's itself (`on_train_begin`): an `evaluate` or `predict` given the
            # callback builds its probe but trains nothing, and must not read as running.
            self.begin_run(self.source)
        return True

    # ------------------------------------------------------------ the step decision

    def recording(self):
        """The recording gate (bool tensor): False once recording stopped (read once per step)."""
        return self._decision("recording", None, self._core["recording"].read_value)

    def logged(self, step):
        """Whether `step` writes the dense series in-graph (bool tensor): every `update_freq`
        steps; never with `update_freq=None` (the host writes the window then)."""
        if self.update_freq is None:
            return tf.constant(False)
        return self._decision("logged", step, lambda: tf.equal(step % self.update_freq, 0))

    def sampled(self, step):
        """Whether `step` runs the sampled work (bool tensor): every `examples_every` steps, every
        logged step, and the step set by `sample_last_of`."""

        def compute():
            sampled = tf.equal(step % self.examples_every, 0)
            if self.update_freq is not None and self.update_freq != self.examples_every:
                sampled = tf.logical_or(sampled, tf.equal(step % self.update_freq, 0))
            return tf.logical_or(sampled, tf.equal(step, self._core["log_at"].read_value()))

        return self._decision("sampled", step, compute)

    def sample_last_of(self, steps):
        """Host side: also sample the last of the next `steps` steps (the callback's epoch
        ends: the step the host writes the window at)."""
        if self._core is not None and not self._disabled_reason:
            self._log_at_host = self._axis.current() + int(steps)
            self._core["log_at"].assign(self._log_at_host)

    def set_step(self, step):
        """Sets the step the next step scope, and the next call of every family without
        `step=`, records at (`write.steps`).

        Args:
          step: an int (or int tensor).
        """
        if self.build():
            self._axis.set(int(step))
            self._set_host_origin(int(step))
            self._tell_recorders("step_set", int(step))

    def next_step(self):
        """The step the next step scope records at (host side), None before the probe is built
        or after it is closed."""
        if self._core is None:
            return None
        return self._axis.current() + 1

    # -------------------------------------------------------------- dispatch helpers

    def merge_leaves(self, merge, leaves):
        """Calls `merge(strategy, leaves)` in cross-replica context with PerReplica leaves.

        From replica context only the leaves go through `merge_call` (no computation), which
        regroups them into PerReplica values; distributed leaves are passed as they are.
        """
        replica_context = tf.distribute.get_replica_context()
        distributed = any(isinstance(leaf, tf.distribute.DistributedValues) for leaf in leaves)
        if replica_context is not None and not distributed:
            replica_context.merge_call(merge, args=(leaves,))
        else:
            merge(self.strategy, leaves)

    def run_local_then_merge(self, local_fn, merge_fn, args):
        """Runs `local_fn(*args)` on every replica (replica context), then `merge_fn` across.

        In replica context `local_fn` runs on this replica and its result goes through
        `merge_call`; in cross-replica context (arguments may be `PerReplica` values) the same
        happens through `strategy.run`.
        """
        replica_context = tf.distribute.get_replica_context()
        distributed = any(
            isinstance(a, tf.distribute.DistributedValues) for a in tf.nest.flatten(args)
        )
        if replica_context is not None and not distributed:
            replica_context.merge_call(merge_fn, args=(local_fn(*args),))
            return

        def replica_fn(*replica_args):
            tf.distribute.get_replica_context().merge_call(
                merge_fn, args=(local_fn(*replica_args),)
            )

        self.strategy.run(replica_fn, args=args)

    def local_values(self, strategy, value, composite=False):
        """The per-replica tensors of `value`, checked against this probe's replica count.

        Args:
          strategy: the strategy (cross-replica context).
          value: a `PerReplica` value (or one value for every replica).
          composite: keep `tf.RaggedTensor` and `tf.SparseTensor` values as they are (else
            every value is converted to a dense tensor).

        Raises:
          ValueError: if `value` has another number of replicas than the probe was built for.
        """
        kept = (tf.RaggedTensor, tf.SparseTensor) if composite else ()
        values = [
            t if isinstance(t, kept) else tf.convert_to_tensor(t)
            for t in strategy.experimental_local_results(value)
        ]
        count = len(self._static["devices"])
        distributed = isinstance(value, tf.distribute.DistributedValues)
        if len(values) == 1 and count > 1 and not distributed:
            # One object given to every replica (e.g. a tensor passed to `strategy.run` as it
            # is): `merge_call` regroups identical objects into that one value.
            values = values * count
        self.check_replicas(len(values))
        return values

    def fault_state(self):
        """The every-step fault state of the first family that keeps one (a
        `core.recorder.FaultState`, host side), or None."""
        for recorder in self._recorders.values():
            state = recorder.fault_state()
            if state is not None:
                return state
        return None

    def check_replicas(self, count, what="values"):
        """Raises ValueError unless `count` is the number of replicas the probe was built for."""
        if count != len(self._static["devices"]):
            raise ValueError(
                f"got {what} of {count} replicas, the probe was built for "
                f"{len(self._static['devices'])}; create the probe with this strategy"
            )

    @property
    def host_lock(self):
        """The lock of host-side writer use (the main thread and the flush thread share it)."""
        return self._lock

    # ------------------------------------------------------------------ warnings

    def _warn_once(self, key, message):
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
            logger.warning(message)

    def warn_failed(self, family, error, what=None):
        """Warns once that `family` could not record (training goes on without it).

        Args:
          family: the family name (one warning per family).
          error: the exception.
          what: the words for what was not recorded (default: the family name).
        """
        self._warn_once(
            family,
            f"tb_replica_plugin: could not record {what or family}, training goes on without "
            f"it: {type(error).__name__}: {error}",
        )

    def warn_once(self, key, message):
        """Warns `message` once per `key` (`RuntimeWarning` and the logger)."""
        self._warn_once(key, message)

    def _disable(self, reason):
        """Turns recording off for good (in-graph writes too) and warns once."""
        with self._lock:
            self._disabled_reason = self._disabled_reason or reason
            if self._core is not None:
                with contextlib.suppress(Exception):
                    self._core["recording"].assign(False)
        FLUSHER.unregister(self)
        self._warn_once(
            "disabled",
            f"tb_replica_plugin: recording stopped, training goes on without it: {reason}",
        )

    # ------------------------------------------------------------- host side

    def write_window(self):
        """Writes the dense series of every family for steps observed since its last write.

        Called by `flush`/`close` and by `ReplicaCallback` at each epoch end. Host side (eager).
        """
        self.pss_harvest(block=True)  # ParameterServerStrategy: the steps the workers ran
        with self._lock:
            if self._core is None or self._disabled_reason:
                return
            try:
                for recorder in self._recorders.values():
                    recorder.write_window()
            except Exception as error:  # noqa: BLE001
                self._disable(f"could not write the pending windows: {error}")

    def flush(self, window=True):
        """Writes the pending window of the dense series and flushes the event file.

        Safe to call at any time, from any thread; a failure warns once and stops recording.

        Args:
          window: also write the dense series' pending window (False: only flush the file).
        """
        if window:
            self.write_window()
        with self._lock:
            self._flush_writer()

    def _flush_writer(self):
        """Flushes the event file (lock held); disables recording on any failure."""
        if self._writer is None or self._disabled_reason:
            return
        self._next_flush = time.monotonic() + self.flush_secs
        for recorder in self._recorders.values():  # a family wanting the next one sooner
            due = recorder.flush_due()
            if due is not None and due < self._next_flush:
                self._next_flush = due
        run_dir = self._run_dir or self.log_dir
        if self._dir_identity is not None and _dir_identity(run_dir) != self._dir_identity:
            self._disable(
                f"the log dir {run_dir!r} was removed or replaced while training; summaries "
                "written since the last flush are lost"
            )
            return
        try:
            with tf.init_scope():  # never an op of a step being traced (the probe's first build)
                self._writer.flush()
        except Exception as error:  # noqa: BLE001 - full disk, I/O error, closed writer...
            self._disable(
                f"could not write summaries to {run_dir!r}: {type(error).__name__}: "
                f"{_first_line(error)}"
            )

    def flush_if_due(self, now):
        """Called by the flush thread: flushes when due (each family's `before_flush` first: the
        status family's heartbeat), returns seconds until the next one.

        Args:
          now: `time.monotonic()`.
        """
        if self._disabled_reason:
            return self.flush_secs
        # Never block the flush thread behind a long host-side operation of the main thread.
        if now >= self._next_flush and self._lock.acquire(timeout=0.1):
            try:
                if self._core is not None:
                    wall = time.time()
                    self._tell_recorders("before_flush", wall)  # the flush goes on
                self._flush_writer()
            finally:
                self._lock.release()
        return max(self._next_flush - time.monotonic(), 0.0)

    def flush_soon(self):
        """The background flush thread flushes (and heartbeats) at its next wake-up."""
        self._next_flush = 0.0
        FLUSHER.wake()

    def close(self):
        """Ends the stretch of training (if not ended), flushes and closes the writer. The probe
        records nothing afterwards."""
        self.end_run("close")
        FLUSHER.unregister(self)
        with self._lock:
            if self._core is not None:
                with contextlib.suppress(Exception):
                    self._core["recording"].assign(False)
            if self._writer is not None and not self._disabled_reason:
                try:
                    self._writer.close()
                except Exception as error:  # noqa: BLE001
                    self._disable(f"could not close the writer: {error}")
            self._disabled_reason = self._disabled_reason or "the probe was closed"
            self._core = None
            for recorder in self._recorders.values():
                recorder.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, error, traceback):
        if error is not None:
            self.end_run("context", error)
        self.close()


def _dir_identity(path):
    """`(device, inode)` of a local directory, to notice it being removed; None if not local."""
    if "://" in path:
        return None  # remote file systems report failures through the writer itself
    try:
        stat = os.stat(path)
    except OSError:
        return ("missing",)
    return (stat.st_dev, stat.st_ino)


def _first_line(error):
    """The first line of an error message, without TensorFlow's `{{function_node ...}}` prefix."""
    lines = str(error).strip().splitlines()
    text = re.sub(r"^\{\{[^}]*\}\}\s*", "", lines[0]) if lines else ""
    return text or type(error).__name__


def write_sides():
    """`[(family name, Recorder class, Recording mixin or None)]` of every registered family with
    a write side (`Family.write_side`), in registry order."""
    sides = []
    for family in registry.families():
        if family.write_side is not None:
            recorder, recording = family.write_side()
            sides.append((family.name, recorder, recording))
    return sides


def recorder_classes():
    """`[(family name, Recorder class)]` of every registered family with a write side."""
    return [(name, recorder) for name, recorder, _ in write_sides()]


def recording_mixins():
    """The `Recording` mixins (public `observe_*` methods) of every registered family."""
    return tuple(recording for _, _, recording in write_sides() if recording is not None)
