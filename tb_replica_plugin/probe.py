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
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
import warnings
import weakref

import tensorflow as tf

from tb_replica_plugin import metadata
from tb_replica_plugin.collectors import data as data_collector
from tb_replica_plugin.collectors import gradients as gradients_collector
from tb_replica_plugin.collectors import inputs as inputs_collector
from tb_replica_plugin.collectors import rng as rng_collector
from tb_replica_plugin.collectors import variables as variables_collector

logger = logging.getLogger(__name__)

SOURCES = ("fit", "custom_loop", "inspect_dataset")
# Slots of the probe's packed int64 counters variable.
_STEP, _HAS_PREV, _PREV_FP, _LAST_STEP, _WIN_COUNT = range(5)
# Slots of the probe's family step counters.
_FAMILY_STEP = {"rng": 0, "data": 1}
# Slots of the float64 timing variable of a multi-worker worker's probe.
_LAST_TIME, _LAST_PERIOD, _WIN_TIME, _WIN_STEPS = range(4)
# The variables family's state vector: its step counter, placement written, placement fingerprint.
_VAR_STEP, _VAR_HAS_PLACEMENT, _VAR_PLACEMENT_FP = range(3)
# What the recorded gradient norms are the norms of (stored in the `gradients/variables` event).
SCALING_REPLICA_LOSS = "replica_loss"  # the gradient of the replica's own loss (fit, Keras losses)
SCALING_AS_GIVEN = "as_given"  # the gradients as given, divided by `scale`
# Slots of the gradients family's packed int64 counters variable (one assign per step).
_G_STEP, _G_HAS_NAMES, _G_NAMES_FP, _G_LAST_STEP, _G_PENDING = range(5)

# Default sampling period of the data family (per-example fingerprints and overlaps): every this
# many steps, and always at logged steps. Chosen by measurement (README, "Benchmarks"): at 16 the
# data family's share of a step of the `fit_overhead` MLP is within noise.
DEFAULT_EXAMPLES_EVERY = 16

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


def check_examples_every(examples_every):
    """Raises ValueError unless `examples_every` is an integer >= 1 (the data family's period)."""
    if (
        isinstance(examples_every, bool)
        or not isinstance(examples_every, int)
        or examples_every < 1
    ):
        raise ValueError(f"`examples_every` must be an integer >= 1. Received: {examples_every!r}")


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


def worker_info(strategy):
    """This worker's place in a multi-worker job, or None for a single-worker strategy.

    Args:
      strategy: a `tf.distribute.Strategy`.

    Returns:
      None unless the strategy spans several workers (`MultiWorkerMirroredStrategy` with a
      `TF_CONFIG` cluster of 2 or more workers); else a dict with `task_type`, `task_index`,
      `worker` (the worker's index among the workers, chief first: global replica ids start at
      `worker * local replicas`), `num_workers` and `job` (a fingerprint of the cluster spec, the
      same on every worker of one job).
    """
    extended = getattr(strategy, "extended", None)
    num_workers = getattr(extended, "_num_workers", 1)
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(num_workers, int) or num_workers < 2 or resolver is None:
        return None
    from tensorflow.python.distribute import multi_worker_util

    task_type, task_index = resolver.task_type, resolver.task_id
    cluster = resolver.cluster_spec()
    worker = getattr(extended, "_id_in_cluster", None)
    if worker is None:
        worker = multi_worker_util.id_in_cluster(cluster, task_type, task_index)
    spec = json.dumps(cluster.as_dict(), sort_keys=True).encode("utf-8")
    return {
        "task_type": str(task_type),
        "task_index": int(task_index),
        "worker": int(worker),
        "num_workers": int(num_workers),
        "job": hashlib.blake2b(spec, digest_size=6).hexdigest(),
    }


def _central_storage(strategy):
    """True when the strategy keeps one copy of each variable on a parameter device on purpose
    (CentralStorageStrategy) instead of mirroring it on the replica devices."""
    try:
        parameter = {
            tf.DeviceSpec.from_string(d).to_string() for d in strategy.extended.parameter_devices
        }
    except (AttributeError, RuntimeError, NotImplementedError, ValueError):
        return False
    return len(_local_devices(strategy)) > 1 and parameter != set(_local_devices(strategy))


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
      per_worker_run: under a multi-worker strategy (`MultiWorkerMirroredStrategy` with 2 or
        more workers), write to `log_dir/<task_type>_<task_index>` (e.g. `worker_1`) so every
        worker has its own run; the tab and the report show the runs of one job as one job
        (see `run_dir`). With False every worker writes `log_dir` itself: give each worker its
        own `log_dir` then.

    Raises:
      ValueError: if `update_freq`, `source`, `flush_secs` or `examples_every` is invalid
        (raised at construction, never during training).

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
        per_worker_run=True,
        examples_every=DEFAULT_EXAMPLES_EVERY,
    ):
        if update_freq is not None and (
            isinstance(update_freq, bool) or not isinstance(update_freq, int) or update_freq < 1
        ):
            raise ValueError(
                f"`update_freq` must be an integer >= 1 or None. Received: {update_freq!r}"
            )
        if source not in SOURCES:
            raise ValueError(f"`source` must be one of {SOURCES}. Received: {source!r}")
        check_examples_every(examples_every)
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
        self.per_worker_run = per_worker_run
        self.examples_every = examples_every
        self._strategy = strategy
        self._worker = None
        self._run_dir = None
        self._writer = None
        self._state = None
        self._disabled_reason = None
        self._warned = set()
        self._grad_state = None
        self._grad_start_step = 0
        self._lock = threading.RLock()  # host-side writer use (main and flush threads)
        self._next_flush = 0.0
        self._dir_identity = None
        self._step_origin = 0
        self._variables_state = None
        self._variables_plans = {}

    # ------------------------------------------------------------------ set-up

    @property
    def strategy(self):
        return self._strategy or tf.distribute.get_strategy()

    @property
    def worker(self):
        """This worker's place in a multi-worker job (see `worker_info`), None on one worker.

        Known once the probe has recorded (or `set_step` was called).
        """
        return self._worker

    @property
    def run_dir(self):
        """The directory this probe writes: `log_dir`, or `log_dir/<task_type>_<task_index>` for
        a worker of a multi-worker job (with `per_worker_run`). None before the first record."""
        return self._run_dir

    def _build(self):
        """Creates the writer and the state variables once, outside any graph."""
        if self._state is not None or self._disabled_reason:
            return self._state is not None
        with tf.init_scope():
            strategy = self.strategy
            try:
                self._worker = worker_info(strategy)
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
            devices = _local_devices(strategy)
            num_replicas = len(devices)
            # Global replica ids: MultiWorkerMirroredStrategy numbers the replicas of the worker
            # with id `worker` from `worker * local replicas` (replica_id_in_sync_group).
            first = self._worker["worker"] * num_replicas if self._worker else 0
            self._static = {
                "devices": devices,
                "replicas": list(range(first, first + num_replicas)),
                "source": self.source,
            }
            if self._worker is not None:
                self._static["worker"] = dict(self._worker)
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
                    # steps of the rng and data families (each counts its own calls)
                    "family_steps": tf.Variable(
                        [0, 0], dtype=tf.int64, trainable=False, name="probe_family_steps"
                    ),
                    # A step the data family samples whatever `examples_every` says (-1: none);
                    # `ReplicaCallback` sets it to the last step of each epoch (its logged step).
                    "examples_at": tf.Variable(
                        -1, dtype=tf.int64, trainable=False, name="probe_examples_at"
                    ),
                }
                if self._worker is not None:
                    # Step timing (multi-worker jobs only), wall-clock seconds, NaN until known:
                    # last arrival, last period, arrival at the window start, steps in window.
                    self._state["timing"] = tf.Variable(
                        tf.constant([math.nan, math.nan, math.nan, 0.0], tf.float64),
                        trainable=False,
                        name="probe_timing",
                    )
        self._families = {}
        self._next_flush = time.monotonic() + self.flush_secs
        _FLUSHER.register(self)
        return True

    def _family_state(self, family, shapes):
        """The int64 state variables of one family, created on its first use (outside any graph).

        Args:
          family: the family name ("rng", "data").
          shapes: `{name: shape}`; variables start at 0 (-1 for names ending in "step").

        Raises:
          ValueError: if the family was first used with other shapes (e.g. another number of
            generators): a probe records one layout per family.
        """
        existing = self._families.get(family)
        if existing is None:
            with tf.init_scope(), tf.device("/cpu:0"):
                existing = {
                    name: tf.Variable(
                        tf.fill(shape, tf.constant(-1 if name.endswith("step") else 0, tf.int64)),
                        trainable=False,
                        name=f"probe_{family}_{name}",
                    )
                    for name, shape in shapes.items()
                }
            self._families[family] = existing
            return existing
        for name, shape in shapes.items():
            if tuple(existing[name].shape) != tuple(shape):
                raise ValueError(
                    f"{family}: {name} has shape {tuple(shape)}, first recorded with "
                    f"{tuple(existing[name].shape)}; use one probe per layout"
                )
        return existing

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
        """Sets the step the next `observe_inputs` (and `observe_variables`) call without `step=`
        records at.

        Args:
          step: an int (or int tensor); following calls count up from it. Every family
            (`observe_inputs`, `observe_rng`, `observe_examples`) counts its own calls from it.
        """
        if self._build():
            counters = self._state["counters"]
            counters.assign(
                tf.tensor_scatter_nd_update(counters, [[_STEP]], [tf.cast(step, tf.int64)])
            )
            family_steps = self._state["family_steps"]
            family_steps.assign(tf.fill([2], tf.cast(step, tf.int64)))
            self._step_origin = step
            if self._variables_state is not None:
                self._variables_state.assign(
                    tf.tensor_scatter_nd_update(
                        self._variables_state, [[_VAR_STEP]], [tf.cast(step, tf.int64)]
                    )
                )
            self._grad_start_step = step
            if self._grad_state is not None:
                counters = self._grad_state["counters"]
                counters.assign(
                    tf.tensor_scatter_nd_update(counters, [[_G_STEP]], [tf.cast(step, tf.int64)])
                )

    def last_step(self):
        """The step of the latest `observe_inputs` call (host side), or None before any."""
        if self._state is None:
            return None
        step = int(self._state["counters"].numpy()[_LAST_STEP])
        return None if step < 0 else step

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
            self._merge_leaves(
                functools.partial(self._merge_inputs, names=names, step=step), leaves
            )
        except Exception as error:  # noqa: BLE001 - must never break training
            self._warn_inputs_failed(error)

    def _merge_leaves(self, merge, leaves):
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
            now = None
            if self._worker is not None:
                # Host wall-clock time once this step's inputs are ready (cheap, CPU, no sync).
                with tf.control_dependencies([t for leaf in per_replica for t in leaf]):
                    now = tf.timestamp()
            self._write_inputs(stats, step, now)
        except Exception as error:  # noqa: BLE001 - must never break training
            self._warn_inputs_failed(error)

    def _write_inputs(self, stats, step, now=None):
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
            write_dense = tf.constant(False)
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
        if now is not None:
            self._record_time(now, step_value, write_dense, recording)
        one = tf.constant(1, tf.int64)
        state["counters"].assign(
            tf.stack([next_step, one, stats.fingerprint, step_value, next_count])
        )
        state["window"].assign(tf.stack([batch_size, win_min, win_max]))

    def _record_time(self, now, step, write, recording):
        """Step timing of a multi-worker job: arrival time, period, window mean (in-graph)."""
        timing = self._state["timing"]
        last_time, _, win_time, win_steps = tf.unstack(timing.read_value())
        period = now - last_time
        steps = win_steps + 1.0
        mean = (now - win_time) / steps
        if self.update_freq is not None:
            self._write(
                tf.logical_and(write, recording),
                metadata.TAG_STEP_TIME,
                lambda: tf.stack([now, period, mean]),
                step,
                metadata.KIND_STEP_TIME,
            )
        timing.assign(
            tf.stack(
                [
                    now,
                    period,
                    tf.where(write, now, win_time),
                    tf.where(write, tf.constant(0.0, tf.float64), steps),
                ]
            )
        )

    def _write_time_window(self, step):
        """Host side: the step time of the last step of a window that had no in-graph write."""
        timing = self._state.get("timing")
        if timing is None or float(timing.numpy()[_WIN_STEPS]) == 0:
            return
        last, period, start, steps = (float(v) for v in timing.numpy())
        with tf.init_scope():
            self._write(
                tf.constant(True),
                metadata.TAG_STEP_TIME,
                lambda: tf.constant([last, period, (last - start) / steps], tf.float64),
                step,
                metadata.KIND_STEP_TIME,
            )
        timing.assign([last, period, last, 0.0])

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

    # ------------------------------------------------------- rng and data families

    def _next_step(self, family, step):
        """The step to record at: `step`, or the family's own call counter (then advanced)."""
        if step is not None:
            return tf.cast(step, tf.int64)
        index = _FAMILY_STEP[family]
        counter = self._state["family_steps"]
        value = counter.read_value()[index]
        counter.assign(tf.tensor_scatter_nd_add(counter.read_value(), [[index]], [1]))
        return value

    def _run_local_then_merge(self, local_fn, merge_fn, args):
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

    def _local_values(self, strategy, value):
        values = [tf.convert_to_tensor(t) for t in strategy.experimental_local_results(value)]
        if len(values) != len(self._static["devices"]):
            raise ValueError(
                f"got values for {len(values)} replicas, the probe was built for "
                f"{len(self._static['devices'])}; create the probe with this strategy"
            )
        return values

    def _warn_family_failed(self, family, error):
        self._warn_once(
            family,
            f"tb_replica_plugin: could not record {family}, training goes on without it: "
            f"{type(error).__name__}: {error}",
        )

    def _window_write(self, family, step_value, write_fn):
        """Writes in-graph every `update_freq` steps; returns the next window count.

        `write_fn(condition)` queues the family's summaries when `condition` holds (a write step
        while recording).
        """
        count = family["win_count"]
        if self.update_freq is None:
            return count + 1
        write = tf.equal(step_value % self.update_freq, 0)
        write_fn(tf.logical_and(write, self._state["recording"].read_value()))
        return tf.where(write, tf.constant(0, tf.int64), count + 1)

    def observe_rng(self, generators=None, step=None, include_global=True):
        """Records, per replica, the state and the stream fingerprint of random generators.

        Call it at the start of the step, before the model draws, in replica context (inside
        `strategy.run`) or in cross-replica context (it then runs itself through `strategy.run`).
        The stream fingerprint hashes the first numbers the generator's *next* draw would give
        on each replica, computed statelessly (the generator is not advanced), so equal
        fingerprints mean the replicas draw the same numbers (see `collectors/rng.py`).
        A failure warns once and never stops training.

        Args:
          generators: what to observe: a `tf.random.Generator`, a `keras.random.SeedGenerator`,
            a Keras layer or model (every SeedGenerator of its layers, named by layer, e.g.
            Dropout's), a dict `{name: any of these}`, or a list of them. Create
            `tf.random.Generator`s under `strategy.scope()` so each replica has its own stream.
          step: the step to record at; when omitted the probe counts `observe_rng` calls from 0
            (or from `set_step`).
          include_global: also observe TensorFlow's global generator and Keras's global seed
            generator if they already exist (they are never created here).

        Example:
          ```python
          with strategy.scope():
              noise = tf.random.Generator.from_seed(1)

          def step_fn(x):
              probe.observe_rng({"noise": noise, "model": model})
              x = x + noise.normal(tf.shape(x))
              ...
          ```
        """
        if not self._build():
            return
        try:
            infos = rng_collector.find_generators(generators, include_global=include_global)
            if not infos:
                self._warn_once("rng_none", "tb_replica_plugin: observe_rng found no generator.")
                return
            width = max(info.state_size for info in infos)
            num = len(self._static["devices"])
            self._family_state(
                "rng",
                {"last": [len(infos), num, 1 + width], "last_step": [], "win_count": [], "doc": []},
            )
            document = json.dumps(
                {"generators": [info.to_json() for info in infos], **self._static},
                sort_keys=True,
            )
            self._rng_document = document
            local = functools.partial(rng_collector.local_streams, infos, width)
            merge = functools.partial(self._merge_rng, document=document, step=step)
            self._run_local_then_merge(local, merge, ())
        except Exception as error:  # noqa: BLE001 - must never break training
            self._warn_family_failed("rng", error)

    def _merge_rng(self, strategy, rows, *, document, step):
        try:
            streams = tf.stack(self._local_values(strategy, rows), axis=1)  # [G, R, 1 + W]
            family = self._families["rng"]
            step_value = self._next_step("rng", step)
            next_count = self._window_write(
                family,
                step_value,
                lambda condition: self._write_rng(streams, step_value, document, condition),
            )
            family["last"].assign(streams)
            family["last_step"].assign(step_value)
            family["win_count"].assign(next_count)
        except Exception as error:  # noqa: BLE001
            self._warn_family_failed("rng", error)

    def _write_rng(self, streams, step, document, condition):
        """Queues the streams, and the generators document when it differs from the last one.

        The document (names of the G rows) changes only when the step is traced again with other
        generators, so it is written once per layout, not at every logged step.
        """
        family = self._families["rng"]
        document_id = 1 + int.from_bytes(
            hashlib.blake2b(document.encode("utf-8"), digest_size=7).digest(), "little"
        )
        self._write(
            condition, metadata.TAG_RNG_STREAMS, lambda: streams, step, metadata.KIND_RNG_STREAMS
        )
        new_document = tf.logical_and(condition, tf.not_equal(family["doc"], document_id))
        self._write(
            new_document,
            metadata.TAG_RNG_GENERATORS,
            lambda: tf.constant(document),
            step,
            metadata.KIND_RNG_GENERATORS,
        )
        family["doc"].assign(
            tf.where(new_document, tf.constant(document_id, tf.int64), family["doc"])
        )

    def observe_examples(self, batch, step=None):
        """Records a fingerprint of every example each replica is fed, and their overlaps.

        At sampled steps (every `examples_every` steps and every logged step, see the
        constructor) it hashes, per replica, every example of the batch in-graph
        (`tf.fingerprint`, see `collectors/data.py`), counts the examples shared with each other
        replica at this step (exact), and keeps a small sketch of the fingerprints that can be
        compared across workers; the other steps only advance the step counter (the work sits
        under a `tf.cond`). Call it like `observe_inputs`: in replica context with the local
        batch, or in cross-replica context with a distributed batch. A failure warns once and
        never stops training.

        Args:
          batch: the (nested) structure of input tensors; every leaf with a leading batch
            dimension is part of an example's fingerprint.
          step: the step to record at; when omitted the probe counts `observe_examples` calls
            from 0 (or from `set_step`).

        Example:
          ```python
          def step_fn(x, y):
              probe.observe_examples({"x": x, "y": y})
              ...
          ```
        """
        if not self._build():
            return
        try:
            leaves = [leaf for _, leaf in inputs_collector.flatten_with_names(batch)]
            if not leaves:
                self._warn_once("data_none", "tb_replica_plugin: observe_examples got no tensors.")
                return
            num = len(self._static["devices"])
            width = 4 + data_collector.SKETCH_SIZE
            self._family_state(
                "data",
                {
                    "last_examples": [num, width],
                    "last_overlap": [3, num, num],
                    "win_dup": [num],
                    "win_shared": [num, num],
                    "win_steps": [num, num],
                    "win_count": [],
                    "last_step": [],
                },
            )
            # The fingerprints are computed in the merge, on each replica's device, under the
            # sampling tf.cond.
            self._merge_leaves(functools.partial(self._merge_examples, step=step), leaves)
        except Exception as error:  # noqa: BLE001 - must never break training
            self._warn_family_failed("data", error)

    def _examples_sampled(self, step_value):
        """Whether the data family samples this step (bool tensor): every `examples_every`
        steps, every logged step, and the step set by `_sample_examples_in`."""
        sampled = tf.equal(step_value % self.examples_every, 0)
        if self.update_freq is not None and self.update_freq != self.examples_every:
            sampled = tf.logical_or(sampled, tf.equal(step_value % self.update_freq, 0))
        return tf.logical_or(sampled, tf.equal(step_value, self._state["examples_at"].read_value()))

    def _sample_examples_in(self, steps):
        """Host side: the data family also samples the last of its next `steps` steps (the
        callback's epoch ends)."""
        if self._state is not None and not self._disabled_reason:
            first = self._state["family_steps"].numpy()[_FAMILY_STEP["data"]]
            self._state["examples_at"].assign(int(first) + int(steps) - 1)

    def _merge_examples(self, strategy, leaves, *, step):
        try:
            per_replica = [self._local_values(strategy, leaf) for leaf in leaves]
            devices = self._static["devices"]
            step_value = self._next_step("data", step)

            def sample():
                fingerprints = []
                for replica, device in enumerate(devices):
                    with tf.device(device):
                        fingerprints.append(
                            data_collector.example_fingerprints(
                                [leaf[replica] for leaf in per_replica]
                            )
                        )
                self._record_examples(data_collector.OverlapStats(fingerprints), step_value)
                return tf.constant(True)

            tf.cond(self._examples_sampled(step_value), sample, lambda: tf.constant(False))
        except Exception as error:  # noqa: BLE001
            self._warn_family_failed("data", error)

    def _record_examples(self, stats, step_value):
        """Window sums, in-graph write and state of one sampled step of the data family."""
        family = self._families["data"]
        fresh = tf.equal(family["win_count"], 0)

        def accumulate(name, value):
            return tf.where(fresh, tf.zeros_like(value), family[name]) + value

        ones = tf.ones_like(stats.distinct)
        any_shared = tf.linalg.set_diag(tf.cast(stats.shared > 0, tf.int64), ones)
        win_dup = accumulate("win_dup", stats.duplicated)
        win_shared = accumulate("win_shared", stats.shared)
        win_steps = accumulate("win_steps", any_shared)
        column = functools.partial(tf.expand_dims, axis=1)
        examples = tf.concat(
            [
                column(stats.batch_size),
                column(stats.distinct),
                column(stats.duplicated),
                column(win_dup),
                stats.sketch,
            ],
            axis=1,
        )
        overlap = tf.stack([stats.shared, win_shared, win_steps])
        next_count = self._window_write(
            family,
            step_value,
            lambda condition: self._write_data(examples, overlap, step_value, condition),
        )
        for name, value in (
            ("last_examples", examples),
            ("last_overlap", overlap),
            ("win_dup", win_dup),
            ("win_shared", win_shared),
            ("win_steps", win_steps),
            ("last_step", step_value),
            ("win_count", next_count),
        ):
            family[name].assign(value)

    def _write_data(self, examples, overlap, step, condition):
        self._write(
            condition,
            metadata.TAG_DATA_EXAMPLES,
            lambda: examples,
            step,
            metadata.KIND_DATA_EXAMPLES,
        )
        self._write(
            condition, metadata.TAG_DATA_OVERLAP, lambda: overlap, step, metadata.KIND_DATA_OVERLAP
        )

    def _write_family_windows(self):
        """Host side: writes the last step of the rng and data families if not yet written."""
        always = tf.constant(True)
        rng = self._families.get("rng")
        if rng is not None and int(rng["win_count"].numpy()) > 0:
            with tf.init_scope():
                self._write_rng(
                    rng["last"].read_value(),
                    rng["last_step"].read_value(),
                    self._rng_document,
                    always,
                )
            rng["win_count"].assign(0)
        data = self._families.get("data")
        if data is not None and int(data["win_count"].numpy()) > 0:
            with tf.init_scope():
                self._write_data(
                    data["last_examples"].read_value(),
                    data["last_overlap"].read_value(),
                    data["last_step"].read_value(),
                    always,
                )
            data["win_count"].assign(0)

    # ------------------------------------------------------------- variables

    def observe_variables(self, variables, step=None, exact=False):
        """Records where each copy of every variable lives and how far it drifts from replica 0.

        For every variable (trainable or not; Keras or TensorFlow, mirrored or not), each copy is
        fingerprinted on its own device: a bitwise hash, min/max/sum/sum of squares and a
        61-bucket random projection (see `collectors/variables.py`), so no copy leaves its
        device and the traffic per variable does not depend on its size. With `exact=True` each
        copy is also sent to replica 0's device for the exact element-wise difference. The
        variables' placement is written at the first call and whenever it changes.

        Call it at the steps you want to log, in cross-replica context (after `strategy.run`,
        eagerly or in a `tf.function`) or in replica context (inside `strategy.run`, through a
        `merge_call`). When the probe has an integer `update_freq`, only steps that are a
        multiple of it are recorded (inside a `tf.function` the check runs under a `tf.cond`, so
        other steps cost a counter increment). Eager calls run one traced function over all the
        variables. Pass the same list at every call (one list per probe). A failure warns once
        and never stops training.

        Args:
          variables: an iterable of variables, e.g. `model.variables + optimizer.variables`.
          step: the step to record at (int or int tensor). When omitted, the probe counts its
            calls to this method, starting at 0 or at what `set_step` set, so that calling it
            once per step after the update records the same step numbers as `observe_inputs`:
            the values at step s are those after step s's update.
          exact: also compute the exact max-abs and L2 difference of every copy from replica 0
            (copies whole variables across devices).

        Example:
          ```python
          probe = tb_replica_plugin.ReplicaProbe("logs/replicas", strategy, update_freq=10)
          for batch in dist_dataset:
              strategy.run(step_fn, args=batch)
              probe.observe_variables(model.variables + optimizer.variables)
          probe.close()
          ```
        """
        if not self._build():
            return
        try:
            variables = list(variables)
            if not variables:
                self._warn_once(
                    "no_variables", "tb_replica_plugin: observe_variables got no variables."
                )
                return
            merge = functools.partial(
                self._merge_variables, variables=variables, step=step, exact=bool(exact)
            )
            replica_context = tf.distribute.get_replica_context()
            if replica_context is not None:
                replica_context.merge_call(merge)
            else:
                merge(self.strategy)
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn_variables_failed(error)

    def warn_variables_failed(self, error):
        """Warns once that the variables family failed (training goes on)."""
        self._warn_once(
            "variables",
            "tb_replica_plugin: could not record variables, training goes on without them: "
            f"{type(error).__name__}: {error}",
        )

    def _build_variables_state(self):
        if self._variables_state is None:
            with tf.init_scope(), tf.device("/cpu:0"):
                origin = tf.cast(self._step_origin, tf.int64)
                self._variables_state = tf.Variable(
                    tf.stack([origin, tf.constant(0, tf.int64), tf.constant(0, tf.int64)]),
                    trainable=False,
                    name="probe_variables_state",
                )
        return self._variables_state

    def _variables_plan(self, variables, exact):
        """Entries, placement JSON and the traced check for one variable list (cached)."""
        key = (tuple(id(v) for v in variables), exact)
        plan = self._variables_plans.get(key)
        if plan is None:
            entries = variables_collector.describe_variables(variables, self._static["devices"])
            static = dict(self._static, central=_central_storage(self.strategy))
            placement = variables_collector.placement_json(entries, static)
            digest = hashlib.blake2b(placement.encode("utf-8"), digest_size=7).digest()
            record = functools.partial(
                self._record_variables,
                entries,
                placement,
                int.from_bytes(digest, "little"),
                exact,
            )
            # Keeps the variables alive with the plan, so their ids cannot be reused.
            plan = (variables, record, tf.function(record, autograph=False))
            self._variables_plans[key] = plan
        return plan

    def _merge_variables(self, strategy, *, variables, step, exact):
        """Cross-replica part of `observe_variables`: step, gating, then the check."""
        try:
            del strategy  # the copies are read from the variables themselves
            state = self._build_variables_state()
            _, record, traced = self._variables_plan(variables, exact)
            if step is None:
                step_value = state.read_value()[_VAR_STEP]
                state.assign_add(tf.constant([1, 0, 0], tf.int64))
            else:
                step_value = tf.cast(step, tf.int64)
            if tf.executing_eagerly():
                if self.update_freq is None or int(step_value) % self.update_freq == 0:
                    with self._lock:  # host side: the flush thread shares the writer
                        if not self._disabled_reason:
                            traced(step_value)
            elif self.update_freq is None:
                record(step_value)
            else:
                tf.cond(
                    tf.equal(step_value % self.update_freq, 0),
                    lambda: record(step_value),
                    lambda: tf.constant(False),
                )
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn_variables_failed(error)

    def _record_variables(self, entries, placement, placement_fp, exact, step):
        """Fingerprints every copy and writes the variables tags at `step` (returns True)."""
        state = self._variables_state
        stats = variables_collector.VariablesStats(entries, len(self._static["devices"]), exact)
        current = state.read_value()
        changed = tf.logical_or(
            tf.equal(current[_VAR_HAS_PLACEMENT], 0),
            tf.not_equal(current[_VAR_PLACEMENT_FP], placement_fp),
        )
        recording = self._state["recording"].read_value()
        self._write(
            tf.logical_and(changed, recording),
            metadata.TAG_VARIABLE_PLACEMENT,
            lambda: tf.constant(placement),
            step,
            metadata.KIND_VARIABLE_PLACEMENT,
        )
        self._write(
            recording,
            metadata.TAG_VARIABLE_HASH,
            lambda: stats.hash,
            step,
            metadata.KIND_VARIABLE_HASH,
        )
        self._write(
            recording,
            metadata.TAG_VARIABLE_FINGERPRINT,
            lambda: stats.fingerprint,
            step,
            metadata.KIND_VARIABLE_FINGERPRINT,
        )
        if stats.exact is not None:
            self._write(
                recording,
                metadata.TAG_VARIABLE_EXACT,
                lambda: stats.exact,
                step,
                metadata.KIND_VARIABLE_EXACT,
            )
        state.assign(
            tf.tensor_scatter_nd_update(
                state,
                [[_VAR_HAS_PLACEMENT], [_VAR_PLACEMENT_FP]],
                tf.constant([1, placement_fp], tf.int64),
            )
        )
        return tf.constant(True)

    # ----------------------------------------------------------- gradients family

    def observe_gradients(self, grads, variables, loss=None, step=None, scale=1.0):
        """Records each replica's local gradient norms, loss and NaN/Inf counts, before all-reduce.

        Call it in replica context (inside `strategy.run`) with the gradients this replica
        computed, before `optimizer.apply_gradients` all-reduces them; or in cross-replica context
        with `PerReplica` gradients (and loss). Per replica, on its own device, it reduces the
        gradients to one sum of squares per variable and NaN/Inf counts; only those scalars are
        gathered. Written: the norms and loss every `update_freq` steps (`gradients/norms`), and
        at EVERY step where a replica's gradients or loss hold a NaN or an Inf, an event naming
        the replica (`gradients/nonfinite`). The exact NaN/Inf counts are computed only at such
        steps (a `tf.cond` on the squared global norm being finite). A failure warns once and
        never stops training.

        Args:
          grads: this replica's gradients, one per variable (tensors, `tf.IndexedSlices` or
            None; None gradients are skipped).
          variables: the variables, in the same order (their names label the per-variable norms).
          loss: this replica's loss (scalar), or None.
          step: the step to record at (int or int tensor). When omitted, this family counts its
            own calls from 0 (or from `set_step`), so `observe_inputs` and `observe_gradients`
            called once per step record the same step numbers.
          scale: the recorded gradients and loss are divided by this (float or scalar tensor).
            E.g. with `loss = tf.nn.compute_average_loss(per_example, global_batch_size=B)` over
            R replicas, `scale=1 / R` records the gradient of each replica's own mean loss, which
            is comparable across replicas and runs of any size.

        Example:
          ```python
          def step_fn(x, y):
              with tf.GradientTape() as tape:
                  loss = tf.nn.compute_average_loss(loss_fn(y, model(x)), global_batch_size=B)
              grads = tape.gradient(loss, model.trainable_variables)
              probe.observe_gradients(grads, model.trainable_variables, loss=loss,
                                      scale=1 / strategy.num_replicas_in_sync)
              optimizer.apply_gradients(zip(grads, model.trainable_variables))
          ```
        """
        self._observe_gradients(grads, variables, loss, step, scale, scale, SCALING_AS_GIVEN)

    def _warn_gradients_failed(self, error):
        self._warn_once(
            "gradients",
            "tb_replica_plugin: could not record gradients, training goes on without them: "
            f"{type(error).__name__}: {error}",
        )

    def _observe_gradients(
        self, grads, variables, loss, step, grad_scale, loss_scale, scaling, loss_scaled=False
    ):
        """`observe_gradients` with separate divisors for gradients and loss (used by fit).

        `loss_scaled` tells readers that a loss-scale optimizer is in use (its overflow steps
        are expected and skipped, see `analysis`).
        """
        if not self._build():
            return
        try:
            grads, variables = gradients_collector.pair_gradients(grads, variables)
            if not grads:
                self._warn_once(
                    "no_gradients", "tb_replica_plugin: observe_gradients got no gradients."
                )
                return
            names = gradients_collector.variable_names(variables)
            shapes = [gradients_collector.variable_shape(v) for v in variables]
            merge = functools.partial(
                self._merge_gradients,
                names=names,
                shapes=shapes,
                step=step,
                has_loss=loss is not None,
                scaling=scaling,
                loss_scaled=bool(loss_scaled),
            )
            distributed = isinstance(loss, tf.distribute.DistributedValues) or any(
                isinstance(g, tf.distribute.DistributedValues) for g in grads
            )
            replica_context = tf.distribute.get_replica_context()
            if replica_context is not None and not distributed:
                # Stats on this replica's device; they (and the gradients, for the exact
                # NaN/Inf counts at a step that has some) go through merge_call, no copy.
                stats = gradients_collector.replica_stats(grads, loss, grad_scale, loss_scale)
                replica_context.merge_call(merge, args=stats)
            else:
                strategy = self.strategy
                per_grad = [strategy.experimental_local_results(g) for g in grads]
                count = len(per_grad[0])
                losses = (
                    [None] * count
                    if loss is None
                    else list(strategy.experimental_local_results(loss))
                )
                devices = self._static["devices"]
                stats = []
                for replica in range(count):
                    with tf.device(devices[replica] if replica < len(devices) else None):
                        stats.append(
                            gradients_collector.replica_stats(
                                [g[replica] for g in per_grad],
                                losses[replica],
                                grad_scale,
                                loss_scale,
                            )
                        )
                self._write_gradients(
                    [s[0] for s in stats],
                    [s[1] for s in stats],
                    [s[2] for s in stats],
                    [s[3] for s in stats],
                    **merge.keywords,
                )
        except Exception as error:  # noqa: BLE001 - must never break training
            self._warn_gradients_failed(error)

    def _merge_gradients(self, strategy, sq, loss, healthy, values, **keywords):
        """Cross-replica part of `observe_gradients`: gather the small stats, write."""
        try:

            def local(value):
                return [tf.convert_to_tensor(t) for t in strategy.experimental_local_results(value)]

            per_variable = [local(v) for v in values]  # [V][R]; V >= 1
            per_replica = [list(v) for v in zip(*per_variable, strict=True)]
            self._write_gradients(local(sq), local(loss), local(healthy), per_replica, **keywords)
        except Exception as error:  # noqa: BLE001 - must never break training
            self._warn_gradients_failed(error)

    def _gradient_state(self):
        """The state of the gradients family, created on first use (outside any graph)."""
        if self._grad_state is None:
            with tf.init_scope(), tf.device("/cpu:0"):
                start = tf.cast(self._grad_start_step, tf.int64)
                zero = tf.constant(0, tf.int64)
                self._grad_state = {
                    # (next step, names written, names fingerprint, step of `last`, `last`
                    # not written yet), packed so that a step does one assign.
                    "counters": tf.Variable(
                        tf.stack([start, zero, zero, zero - 1, zero]),
                        trainable=False,
                        name="probe_grad_counters",
                    ),
                    # Last raw rows (loss, sums of squares), for host-side writes
                    # (update_freq=None).
                    "last": tf.Variable(
                        tf.zeros([0, 0]), shape=tf.TensorShape(None), trainable=False
                    ),
                }
        return self._grad_state

    def _write_gradients(
        self, sq, loss, healthy, values, *, names, shapes, step, has_loss, scaling, loss_scaled
    ):
        if len(sq) != len(self._static["devices"]):
            raise ValueError(
                f"got gradients of {len(sq)} replicas, the probe was built for "
                f"{len(self._static['devices'])}; create the probe with this strategy"
            )
        state = self._gradient_state()
        counters = state["counters"].read_value()
        if step is None:
            step_value = counters[_G_STEP]
            next_step = step_value + 1
        else:
            step_value = tf.cast(step, tf.int64)
            next_step = counters[_G_STEP]
        text, fingerprint = gradients_collector.variables_document(
            names,
            shapes,
            {
                "loss": bool(has_loss),
                "scaling": scaling,
                "loss_scaled": loss_scaled,
                "replicas": self._static["replicas"],
                "devices": self._static["devices"],
                "source": self.source,
            },
        )
        names_changed = tf.logical_or(
            tf.equal(counters[_G_HAS_NAMES], 0), tf.not_equal(counters[_G_NAMES_FP], fingerprint)
        )
        recording = self._state["recording"].read_value()
        self._write(
            tf.logical_and(names_changed, recording),
            metadata.TAG_GRAD_VARIABLES,
            lambda: tf.constant(text),
            step_value,
            metadata.KIND_GRAD_VARIABLES,
        )
        devices = self._static["devices"]

        def write_nonfinite():
            # Only at a step where some replica's squared norm or loss is not finite.
            per_replica = []
            for replica, device in enumerate(devices):
                with tf.device(device):
                    per_replica.append(
                        gradients_collector.nonfinite_counts(
                            values[replica], loss[replica], has_loss
                        )
                    )
            counts = tf.stack(per_replica, axis=1)  # [4, R]
            self._write(
                tf.reduce_any(counts > 0),
                metadata.TAG_GRAD_NONFINITE,
                lambda: counts,
                step_value,
                metadata.KIND_GRAD_NONFINITE,
            )
            return tf.constant(True)

        tf.cond(
            tf.logical_and(tf.logical_not(tf.reduce_all(tf.stack(healthy))), recording),
            write_nonfinite,
            lambda: tf.constant(False),
        )
        if self.update_freq is None:
            # Every step keeps its raw stats (2 ops); the norms are taken at the host write.
            state["last"].assign(gradients_collector.raw_rows(sq, loss))
            last_step, pending = step_value, tf.constant(1, tf.int64)
        else:
            self._write(
                tf.logical_and(tf.equal(step_value % self.update_freq, 0), recording),
                metadata.TAG_GRAD_NORMS,
                lambda: gradients_collector.dense_rows(gradients_collector.raw_rows(sq, loss)),
                step_value,
                metadata.KIND_GRAD_NORMS,
            )
            last_step, pending = counters[_G_LAST_STEP], counters[_G_PENDING]
        state["counters"].assign(
            tf.stack([next_step, tf.constant(1, tf.int64), fingerprint, last_step, pending])
        )

    def _write_gradient_window(self):
        """Host side: writes the last observed gradient norms if not written yet."""
        state = self._grad_state
        if state is None:
            return
        counters = state["counters"]
        values = counters.numpy()
        if not values[_G_PENDING]:
            return
        last = state["last"]
        with tf.init_scope():
            self._write(
                tf.constant(True),
                metadata.TAG_GRAD_NORMS,
                lambda: gradients_collector.dense_rows(last.read_value()),
                int(values[_G_LAST_STEP]),
                metadata.KIND_GRAD_NORMS,
            )
        counters.assign(tf.tensor_scatter_nd_update(counters, [[_G_PENDING]], [0]))

    # ------------------------------------------------------------- host side

    def write_window(self):
        """Writes the dense series of every family for steps observed since its last write.

        Called by `flush`/`close` and by `ReplicaCallback` at each epoch end. Host side (eager).
        """
        with self._lock:
            if self._state is None or self._disabled_reason:
                return
            try:
                counters = self._state["counters"]
                values = counters.numpy()
                if int(values[_WIN_COUNT]) > 0:
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
                    self._write_time_window(int(values[_LAST_STEP]))
                self._write_family_windows()
                self._write_gradient_window()
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
        run_dir = self._run_dir or self.log_dir
        if self._dir_identity is not None and _dir_identity(run_dir) != self._dir_identity:
            self._disable(
                f"the log dir {run_dir!r} was removed or replaced while training; summaries "
                "written since the last flush are lost"
            )
            return
        try:
            self._writer.flush()
        except Exception as error:  # noqa: BLE001 - full disk, I/O error, closed writer...
            self._disable(
                f"could not write summaries to {run_dir!r}: {type(error).__name__}: "
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
            self._variables_state = None
            self._variables_plans = {}
            self._grad_state = None

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
