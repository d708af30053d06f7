"""ReplicaProbe: per-replica collection for `strategy.run` loops, written as TensorBoard summaries.

The probe is the one place that turns per-replica values into summaries:

    replica context ── merge_call ──► cross-replica context
        per-replica tensors of this step → collectors (in-graph, small) → queued summaries

Everything runs in the graph of the training step; the host is not synchronised at any step.
`ReplicaCallback` uses a probe for Keras `fit`; custom loops use it directly.

Reliability (README, "Reliability"): nothing in the step's graph touches the event file. In-graph
writes only queue events in the writer (they are gated by a `recording` variable, and the writer
is created so that it never flushes by itself); the file is written by host-side flushes: a
background thread every `flush_secs`, `write_window`/`flush`/`close`, the callback's epoch and
train ends, a failing train step, and interpreter exit. So a full disk, a removed log dir or any
other I/O error surfaces on the host, where it is caught, warned about once, and turns recording
off; it can never fail a training step.
"""

import atexit
import contextlib
import functools
import logging
import os
import re
import threading
import time
import warnings
import weakref

import tensorflow as tf

from tb_replica_plugin import metadata
from tb_replica_plugin.collectors import inputs as inputs_collector

logger = logging.getLogger(__name__)

SOURCES = ("fit", "custom_loop", "inspect_dataset")
# Slots of the probe's packed int64 counters variable.
_STEP, _HAS_PREV, _PREV_FP, _LAST_STEP, _WIN_COUNT = range(5)

# Default seconds between background flushes: at most this much recorded data is lost when the
# process is killed (SIGKILL, OOM killer) without running any Python.
DEFAULT_FLUSH_SECS = 5.0
# The writer never flushes from inside the step's graph (where an I/O error would fail the step):
# the queue is emptied by host-side flushes only. The queue bound is a memory guard reached only if
# the host stops flushing (about 100 bytes per event).
_MAX_QUEUE = 1_000_000
_NEVER_FLUSH_MILLIS = 2**31 - 1


class _Flusher:
    """One daemon thread that flushes every live probe's writer every `flush_secs`.

    Probes are held by weak reference, so a forgotten probe is still collected. `atexit` stops
    the thread and flushes every live probe before the interpreter shuts down.
    """

    def __init__(self):
        self._probes = weakref.WeakSet()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread = None

    def register(self, probe):
        with self._lock:
            if self._stopped:
                return
            self._probes.add(probe)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tb_replica_plugin-flush", daemon=True
                )
                self._thread.start()
                atexit.register(self.stop)
        self._wake.set()  # re-plan with this probe's interval

    def unregister(self, probe):
        with self._lock:
            self._probes.discard(probe)

    def _run(self):
        while True:
            self._wake.clear()
            with self._lock:
                if self._stopped:
                    return
                probes = list(self._probes)
            now = time.monotonic()
            wait = 1.0
            for probe in probes:
                try:
                    wait = min(wait, probe._flush_if_due(now))
                except Exception:  # noqa: BLE001 - e.g. warnings turned into errors: keep going
                    logger.exception("tb_replica_plugin: background flush failed")
            del probes
            self._wake.wait(max(wait, 0.01))

    def stop(self):
        """Stops the thread and flushes every live probe (registered with `atexit`)."""
        with self._lock:
            self._stopped = True
            probes = list(self._probes)
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=10)
        for probe in probes:
            probe.flush()


_FLUSHER = _Flusher()


def _local_devices(strategy):
    """Device names of this worker's replicas, in replica order."""
    try:
        devices = tuple(strategy.extended.worker_devices)
    except (AttributeError, RuntimeError, NotImplementedError):
        devices = ()
    if devices:
        return [tf.DeviceSpec.from_string(d).to_string() for d in devices]
    # The default strategy places ops on the first GPU if there is one, else on the CPU.
    kind = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    return [f"/job:localhost/replica:0/task:0/device:{kind}:0"]


class ReplicaProbe:
    """Records, per replica and step, what each replica of a `tf.distribute` strategy was fed.

    Use it in a custom training loop, inside the function given to `strategy.run` (replica
    context) or on the per-replica values after it (cross-replica context). Works eagerly and
    inside `tf.function`. Summaries go to `log_dir` (one TensorBoard run).

    Failures never reach the training step: an exception while tracing the collectors, a log dir
    that cannot be created, removed while training or on a full disk each warn once
    (`RuntimeWarning`) and stop recording; training goes on.

    Args:
      log_dir: directory of the run to write, e.g. `"logs/replicas"`.
      strategy: the `tf.distribute.Strategy`; defaults to the current one
        (`tf.distribute.get_strategy()`).
      update_freq: write the dense batch-size series every this many steps (int >= 1), or only
        from the host (`write_window`, `flush`, `close`) with None. Shape and
        dtype changes, and so every odd batch, are written at the step they happen whatever
        this is, and the dense series keeps per-window minima and maxima.
      source: what drives the probe, stored with the data: "custom_loop" (default), "fit" or
        "inspect_dataset".
      flush_secs: seconds between background flushes of the event file (default 5): a process
        killed without running Python (SIGKILL) loses at most the data recorded in this
        interval. `flush` and `close` write everything at once.

    Raises:
      ValueError: if `update_freq`, `source` or `flush_secs` is invalid (raised at
        construction, never during training).

    Example:
      ```python
      probe = tb_replica_plugin.ReplicaProbe("logs/replicas", strategy)

      @tf.function
      def train_step(batch):
          def step_fn(x, y):
              probe.observe_inputs({"x": x, "y": y})  # replica context
              ...
          strategy.run(step_fn, args=batch)

      for batch in dist_dataset:
          train_step(batch)
      probe.close()  # writes the last window and flushes
      ```
    """

    def __init__(
        self,
        log_dir,
        strategy=None,
        update_freq=100,
        source="custom_loop",
        flush_secs=DEFAULT_FLUSH_SECS,
    ):
        if update_freq is not None and (
            isinstance(update_freq, bool) or not isinstance(update_freq, int) or update_freq < 1
        ):
            raise ValueError(
                f"`update_freq` must be an integer >= 1 or None. Received: {update_freq!r}"
            )
        if source not in SOURCES:
            raise ValueError(f"`source` must be one of {SOURCES}. Received: {source!r}")
        if (
            isinstance(flush_secs, bool)
            or not isinstance(flush_secs, (int, float))
            or not flush_secs > 0
        ):
            raise ValueError(f"`flush_secs` must be a number > 0. Received: {flush_secs!r}")
        self.log_dir = os.fspath(log_dir)
        self.update_freq = update_freq
        self.source = source
        self.flush_secs = float(flush_secs)
        self._strategy = strategy
        self._writer = None
        self._state = None
        self._disabled_reason = None
        self._warned = set()
        self._lock = threading.RLock()  # host-side writer use (main and flush threads)
        self._next_flush = 0.0
        self._dir_identity = None

    # ------------------------------------------------------------------ set-up

    @property
    def strategy(self):
        return self._strategy or tf.distribute.get_strategy()

    def _build(self):
        """Creates the writer and the state variables once, outside any graph."""
        if self._state is not None or self._disabled_reason:
            return self._state is not None
        with tf.init_scope():
            try:
                self._writer = tf.summary.create_file_writer(
                    self.log_dir, max_queue=_MAX_QUEUE, flush_millis=_NEVER_FLUSH_MILLIS
                )
                self._writer.flush()  # creates the event file now: unwritable dirs fail here
                self._dir_identity = _dir_identity(self.log_dir)
            except Exception as error:  # noqa: BLE001 - any failure must not stop training
                self._disable(f"cannot write summaries to {self.log_dir!r}: {error}")
                return False
            strategy = self.strategy
            devices = _local_devices(strategy)
            num_replicas = len(devices)
            self._static = {
                "devices": devices,
                "replicas": list(range(num_replicas)),
                "source": self.source,
            }
            with tf.device("/cpu:0"):
                # Packed so that a step reads and writes each variable once.
                self._state = {
                    # step counter, has a previous step, its fingerprint, last step, window size
                    "counters": tf.Variable(
                        [0, 0, 0, -1, 0], dtype=tf.int64, trainable=False, name="probe_counters"
                    ),
                    # rows: batch size at the last step, window minimum, window maximum
                    "window": tf.Variable(
                        tf.zeros([3, num_replicas], tf.int32), trainable=False, name="probe_window"
                    ),
                    # Gates every in-graph write: False once recording is disabled. Its own
                    # variable: the host may turn it off while a step runs (counters are
                    # rewritten by every step).
                    "recording": tf.Variable(True, trainable=False, name="probe_recording"),
                }
        self._next_flush = time.monotonic() + self.flush_secs
        _FLUSHER.register(self)
        return True

    def _disable(self, reason):
        """Turns recording off for good (in-graph writes too) and warns once."""
        with self._lock:
            self._disabled_reason = self._disabled_reason or reason
            if self._state is not None:
                with contextlib.suppress(Exception):
                    self._state["recording"].assign(False)
        _FLUSHER.unregister(self)
        self._warn_once(
            "disabled",
            f"tb_replica_plugin: recording stopped, training goes on without it: {reason}",
        )

    @property
    def disabled_reason(self):
        """Why recording stopped (None while recording; set by `close` too)."""
        return self._disabled_reason

    def _warn_once(self, key, message):
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
            logger.warning(message)

    def set_step(self, step):
        """Sets the step the next `observe_inputs` call without `step=` records at.

        Args:
          step: an int (or int tensor); following calls count up from it.
        """
        if self._build():
            counters = self._state["counters"]
            counters.assign(
                tf.tensor_scatter_nd_update(counters, [[_STEP]], [tf.cast(step, tf.int64)])
            )

    def next_step(self):
        """The step the next `observe_inputs` call without `step=` would record at (host side).

        Returns:
          An int, or None before the probe is built or after it is closed.
        """
        if self._state is None:
            return None
        return int(self._state["counters"][_STEP].numpy())

    # ---------------------------------------------------------------- recording

    def observe_inputs(self, batch, step=None):
        """Records the batch size and the shape and dtype of every input leaf, per replica.

        Call it in replica context (inside `strategy.run`) with the replica's local batch, or in
        cross-replica context with the distributed batch (leaves are `PerReplica` values).
        Nested dicts, lists and tuples are named by their path ("x/image", "0"); pass a dict to
        choose names. A failure inside the probe warns once and never stops training.

        Args:
          batch: the (nested) structure of input tensors.
          step: the step to record at (int or int tensor). When omitted, the probe counts calls:
            the first call records step 0 (or what `set_step` set), the next step 1, and so on.
        """
        if not self._build():
            return
        try:
            names_and_leaves = inputs_collector.flatten_with_names(batch)
            names = [name for name, _ in names_and_leaves]
            leaves = [leaf for _, leaf in names_and_leaves]
            if not leaves:
                self._warn_once("no_inputs", "tb_replica_plugin: observe_inputs got no tensors.")
                return
            merge = functools.partial(self._merge_inputs, names=names, step=step)
            replica_context = tf.distribute.get_replica_context()
            distributed = any(isinstance(leaf, tf.distribute.DistributedValues) for leaf in leaves)
            if replica_context is not None and not distributed:
                # Only the leaves go through merge_call: it regroups them into PerReplica values.
                replica_context.merge_call(merge, args=(leaves,))
            else:
                merge(self.strategy, leaves)
        except Exception as error:  # noqa: BLE001 - must never break training
            self._warn_inputs_failed(error)

    def _warn_inputs_failed(self, error):
        self._warn_once(
            "inputs",
            "tb_replica_plugin: could not record inputs, training goes on without them: "
            f"{type(error).__name__}: {error}",
        )

    def _merge_inputs(self, strategy, leaves, *, names, step):
        """Cross-replica part of `observe_inputs`: stats, change detection, summary writes."""
        try:
            per_replica = [
                [tf.convert_to_tensor(t) for t in strategy.experimental_local_results(leaf)]
                for leaf in leaves
            ]
            if len(per_replica[0]) != len(self._static["devices"]):
                raise ValueError(
                    f"got values for {len(per_replica[0])} replicas, the probe was built for "
                    f"{len(self._static['devices'])}; create the probe with this strategy"
                )
            stats = inputs_collector.InputsStats(names, per_replica, self._static["devices"])
            self._write_inputs(stats, step)
        except Exception as error:  # noqa: BLE001 - must never break training
            self._warn_inputs_failed(error)

    def _write_inputs(self, stats, step):
        state = self._state
        counters = state["counters"].read_value()
        window = state["window"].read_value()
        if step is None:
            step_value = counters[_STEP]
            next_step = step_value + 1
        else:
            step_value = tf.cast(step, tf.int64)
            next_step = counters[_STEP]
        changed = tf.logical_or(
            tf.equal(counters[_HAS_PREV], 0), tf.not_equal(counters[_PREV_FP], stats.fingerprint)
        )
        batch_size = stats.batch_size
        window_empty = tf.equal(counters[_WIN_COUNT], 0)
        win_min = tf.where(window_empty, batch_size, tf.minimum(window[1], batch_size))
        win_max = tf.where(window_empty, batch_size, tf.maximum(window[2], batch_size))
        static = self._static
        recording = state["recording"].read_value()
        self._write(
            tf.logical_and(changed, recording),
            metadata.TAG_SHAPES,
            lambda: stats.shapes_json(static),
            step_value,
            metadata.KIND_SHAPES,
        )
        if self.update_freq is None:
            # Host-written only (e.g. at epoch ends): no dense write op in the step's graph.
            next_count = counters[_WIN_COUNT] + 1
        else:
            write_dense = tf.equal(step_value % self.update_freq, 0)
            self._write(
                tf.logical_and(write_dense, recording),
                metadata.TAG_BATCH_SIZE,
                lambda: tf.stack([batch_size, win_min, win_max]),
                step_value,
                metadata.KIND_BATCH_SIZE,
            )
            next_count = tf.where(write_dense, tf.constant(0, tf.int64), counters[_WIN_COUNT] + 1)
        one = tf.constant(1, tf.int64)
        state["counters"].assign(
            tf.stack([next_step, one, stats.fingerprint, step_value, next_count])
        )
        state["window"].assign(tf.stack([batch_size, win_min, win_max]))

    def _write(self, condition, tag, value_fn, step, kind):
        """Queues one summary in the writer when `condition` holds (in-graph or eagerly).

        `tf.summary.write` inside `writer.as_default()` would add a flush op to the step's graph
        on exit, and so an I/O error (full disk, removed directory) would fail the training step.
        The raw `WriteSummary` op only queues the event; host-side flushes write the file.
        """
        serialized = metadata.create_summary_metadata(kind).SerializeToString()
        resource = self._writer._resource  # noqa: SLF001 - the writer's resource handle

        def write():
            with tf.device("/cpu:0"):
                tf.raw_ops.WriteSummary(
                    writer=resource,
                    step=tf.cast(step, tf.int64),
                    tensor=tf.convert_to_tensor(value_fn()),
                    tag=tag,
                    summary_metadata=serialized,
                )
            return tf.constant(True)

        return tf.cond(condition, write, lambda: tf.constant(False))

    # ------------------------------------------------------------- host side

    def write_window(self):
        """Writes the dense batch-size series for steps observed since its last write.

        Called by `flush`/`close` and by `ReplicaCallback` at each epoch end. Host side (eager).
        """
        with self._lock:
            if self._state is None or self._disabled_reason:
                return
            try:
                counters = self._state["counters"]
                values = counters.numpy()
                if int(values[_WIN_COUNT]) == 0:
                    return
                window = self._state["window"]
                with tf.init_scope():
                    self._write(
                        tf.constant(True),
                        metadata.TAG_BATCH_SIZE,
                        window.read_value,
                        int(values[_LAST_STEP]),
                        metadata.KIND_BATCH_SIZE,
                    )
                counters.assign(tf.tensor_scatter_nd_update(counters, [[_WIN_COUNT]], [0]))
            except Exception as error:  # noqa: BLE001
                self._disable(f"could not write the batch-size window: {error}")

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
        if self._dir_identity is not None and _dir_identity(self.log_dir) != self._dir_identity:
            self._disable(
                f"the log dir {self.log_dir!r} was removed or replaced while training; summaries "
                "written since the last flush are lost"
            )
            return
        try:
            self._writer.flush()
        except Exception as error:  # noqa: BLE001 - full disk, I/O error, closed writer...
            self._disable(
                f"could not write summaries to {self.log_dir!r}: {type(error).__name__}: "
                f"{_first_line(error)}"
            )

    def _flush_if_due(self, now):
        """Called by the flush thread: flushes when due, returns seconds until the next one."""
        if self._disabled_reason:
            return self.flush_secs
        # Never block the flush thread behind a long host-side operation of the main thread.
        if now >= self._next_flush and self._lock.acquire(timeout=0.1):
            try:
                self._flush_writer()
            finally:
                self._lock.release()
        return max(self._next_flush - time.monotonic(), 0.0)

    def close(self):
        """Flushes and closes the writer. The probe records nothing afterwards."""
        self.flush()
        _FLUSHER.unregister(self)
        with self._lock:
            if self._state is not None:
                with contextlib.suppress(Exception):
                    self._state["recording"].assign(False)
            if self._writer is not None and not self._disabled_reason:
                try:
                    self._writer.close()
                except Exception as error:  # noqa: BLE001
                    self._disable(f"could not close the writer: {error}")
            self._disabled_reason = self._disabled_reason or "the probe was closed"
            self._state = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
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
