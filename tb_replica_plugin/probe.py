"""ReplicaProbe: per-replica collection for `strategy.run` loops, written as TensorBoard summaries.

The probe is the one place that turns per-replica values into summaries:

    replica context ── merge_call ──► cross-replica context
        per-replica tensors of this step → collectors (in-graph, small) → tf.summary.write

Everything runs in the graph of the training step; the host is not synchronised at any step.
`ReplicaCallback` uses a probe for Keras `fit`; custom loops use it directly.
"""

import functools
import logging
import os
import warnings

import tensorflow as tf

from tb_replica_plugin import metadata
from tb_replica_plugin.collectors import inputs as inputs_collector

logger = logging.getLogger(__name__)

SOURCES = ("fit", "custom_loop", "inspect_dataset")
# Slots of the probe's packed int64 counters variable.
_STEP, _HAS_PREV, _PREV_FP, _LAST_STEP, _WIN_COUNT = range(5)


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


class _DefaultWriter:
    """`writer.as_default()` for in-graph writes, without the flush on exit.

    `SummaryWriter.as_default()` flushes the writer when the block exits; inside a `tf.function`
    that is a FlushSummaryWriter op run at EVERY step (a file write per step). The probe's writer
    flushes on its own (queue full, `flush_millis`) and at `flush`/`close`. This sets TensorFlow's
    default-writer state directly, falling back to `as_default()` if that state ever moves.
    """

    def __init__(self, writer):
        self._writer = writer
        self._fallback = None

    def __enter__(self):
        from tensorflow.python.ops import summary_ops_v2

        state = getattr(summary_ops_v2, "_summary_state", None)
        if state is None or not hasattr(state, "writer"):
            self._fallback = self._writer.as_default()
            return self._fallback.__enter__()
        self._state, self._old = state, state.writer
        state.writer = self._writer
        return self._writer

    def __exit__(self, *exc_info):
        if self._fallback is not None:
            return self._fallback.__exit__(*exc_info)
        self._state.writer = self._old
        return False


class ReplicaProbe:
    """Records, per replica and step, what each replica of a `tf.distribute` strategy was fed.

    Use it in a custom training loop, inside the function given to `strategy.run` (replica
    context) or on the per-replica values after it (cross-replica context). Works eagerly and
    inside `tf.function`. Summaries go to `log_dir` (one TensorBoard run).

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

    Raises:
      ValueError: if `update_freq` or `source` is invalid (raised at construction, never during
        training).

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

    def __init__(self, log_dir, strategy=None, update_freq=100, source="custom_loop"):
        if update_freq is not None and (
            isinstance(update_freq, bool) or not isinstance(update_freq, int) or update_freq < 1
        ):
            raise ValueError(
                f"`update_freq` must be an integer >= 1 or None. Received: {update_freq!r}"
            )
        if source not in SOURCES:
            raise ValueError(f"`source` must be one of {SOURCES}. Received: {source!r}")
        self.log_dir = os.fspath(log_dir)
        self.update_freq = update_freq
        self.source = source
        self._strategy = strategy
        self._writer = None
        self._state = None
        self._disabled_reason = None
        self._warned = set()

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
                self._writer = tf.summary.create_file_writer(self.log_dir)
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
                }
        return True

    def _disable(self, reason):
        self._disabled_reason = reason
        self._warn_once("disabled", f"tb_replica_plugin: recording disabled, {reason}")

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
        with _DefaultWriter(self._writer), tf.summary.record_if(changed):
            tf.summary.write(
                metadata.TAG_SHAPES,
                lambda: stats.shapes_json(static),
                step=step_value,
                metadata=metadata.create_summary_metadata(metadata.KIND_SHAPES),
            )
        if self.update_freq is None:
            # Host-written only (e.g. at epoch ends): no dense write op in the step's graph.
            next_count = counters[_WIN_COUNT] + 1
        else:
            write_dense = tf.equal(step_value % self.update_freq, 0)
            with tf.summary.record_if(write_dense):
                self._write_dense(lambda: tf.stack([batch_size, win_min, win_max]), step_value)
            next_count = tf.where(write_dense, tf.constant(0, tf.int64), counters[_WIN_COUNT] + 1)
        one = tf.constant(1, tf.int64)
        state["counters"].assign(
            tf.stack([next_step, one, stats.fingerprint, step_value, next_count])
        )
        state["window"].assign(tf.stack([batch_size, win_min, win_max]))

    def _write_dense(self, value, step):
        """Writes one sample of the dense batch-size series (in-graph or eagerly)."""
        with _DefaultWriter(self._writer):
            tf.summary.write(
                metadata.TAG_BATCH_SIZE,
                value,
                step=step,
                metadata=metadata.create_summary_metadata(metadata.KIND_BATCH_SIZE),
            )

    # ------------------------------------------------------------- host side

    def write_window(self):
        """Writes the dense batch-size series for steps observed since its last write.

        Called by `flush`/`close` and by `ReplicaCallback` at each epoch end. Host side (eager).
        """
        if self._state is None:
            return
        try:
            counters = self._state["counters"]
            values = counters.numpy()
            if int(values[_WIN_COUNT]) == 0:
                return
            self._write_dense(self._state["window"].read_value(), int(values[_LAST_STEP]))
            counters.assign(tf.tensor_scatter_nd_update(counters, [[_WIN_COUNT]], [0]))
        except Exception as error:  # noqa: BLE001
            self._warn_once("window", f"tb_replica_plugin: could not write window: {error}")

    def flush(self):
        """Writes the pending window of the dense series and flushes the event file."""
        self.write_window()
        self.flush_events()

    def flush_events(self):
        """Flushes written events to the event file (the training step itself never flushes)."""
        if self._writer is not None:
            try:
                self._writer.flush()
            except Exception as error:  # noqa: BLE001
                self._warn_once("flush", f"tb_replica_plugin: could not flush summaries: {error}")

    def close(self):
        """Flushes and closes the writer. The probe records nothing afterwards."""
        self.flush()
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception as error:  # noqa: BLE001
                self._warn_once("close", f"tb_replica_plugin: could not close writer: {error}")
        self._disabled_reason = self._disabled_reason or "the probe was closed"
        self._state = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
