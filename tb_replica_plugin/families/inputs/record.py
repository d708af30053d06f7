"""Inputs family, write side: per-replica batch size, shape and dtype of every input leaf.

Every step, per replica, the shapes of the input leaves go into the step's one transfer
(`shapes.put_shapes`: taken by the replica's one `ShapeN`, `core.transfer`); on the host they give
the batch sizes (the leading dimension of the first leaf) and one fingerprint of every shape and
dtype. The shapes are formatted to JSON in-graph only at a step whose fingerprint differs from the
previous step's (`inputs/shapes`, a sparse event, so an odd batch is never lost to sampling). The
dense `inputs/batch_size` series keeps per-window minima and maxima.
"""

import functools

import numpy as np
import tensorflow as tf

from tb_replica_plugin.core.nest import (  # noqa: F401 - named here too
    FIT_BATCH_NAMES,
    flatten_with_names,
    name_fit_batch,
)
from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from tb_replica_plugin.families.inputs import pss, schema, shapes
from tb_replica_plugin.families.inputs.shapes import (  # noqa: F401 - the family's public helpers
    DENSE,
    RAGGED,
    RAGGED_DIM,
    SPARSE,
    InputsStats,
    as_leaf,
    leaf_kind,
    leaf_rank,
    shape_vector,
    structure_vector,
)

# Slots of the int64 state before the window: the previous step's shapes fingerprint (0: none
# yet), the last step recorded.
_PREV_FP, _LAST_STEP = range(2)
_COUNTERS = 2
# Rows of the window (R values each, after the counters; written as int32 [3, R]): batch size
# at the last step, window minimum, window maximum.
_BATCH, _MIN, _MAX = range(3)
# The window's minimum and maximum when it holds no step (so a step's min and max are its own).
_EMPTY_MIN, _EMPTY_MAX = np.iinfo(np.int32).max, np.iinfo(np.int32).min


class Recorder(RecorderBase):
    """State and writes of the inputs family."""

    name = "inputs"
    pss_window = None  # `pss.Window` under ParameterServerStrategy

    def create_state(self):
        # One int64 vector, the counters then the window's rows: a step reads it once and
        # writes it once.
        self.variable("packed", [0, -1, *np.ravel(self._empty_window())], tf.int64)

    def _empty_window(self):
        count = self.probe.num_replicas
        return [[0] * count, [_EMPTY_MIN] * count, [_EMPTY_MAX] * count]

    def _host_state(self):
        """Host side: `(counters, window)` as numpy int64 [2] and int64 [3, R]."""
        values = self.state["packed"].numpy()
        return values[:_COUNTERS], values[_COUNTERS:].reshape([3, -1])

    def warn(self, error):
        self.probe.warn_failed("inputs", error)

    def merge(self, strategy, leaves, *, names, step):
        """Cross-replica part of `observe_inputs`: every replica's shapes into the step's
        transfer, the host's part (`_deliver`) once it is delivered."""
        probe = self.probe
        transfer = None
        try:
            per_replica = [probe.local_values(strategy, leaf, composite=True) for leaf in leaves]
            transfer = probe.transfer()
            layout = shapes.LeafLayout.of(names, per_replica)
            shapes.put_shapes(transfer, self.name, layout, per_replica)
            transfer.on_host(self.name, functools.partial(self._deliver, step=step))
        except Exception as error:  # noqa: BLE001 - must never break training
            if transfer is not None:
                transfer.drop(self.name)
            self.warn(error)
            return
        probe.ship(transfer)

    def _deliver(self, delivery, *, step):
        try:
            stats = shapes.received(delivery, self.name)
            self._write(stats, self.probe.step_of(delivery, self.name, step))
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _write(self, stats, step_value):
        """In-graph: the shapes event where the fingerprint changed, the batch-size window (and
        its dense write at logged steps), then the state, read once and written once.

        Args:
          stats: the step's `InputsStats`.
          step_value: the int64 step it records at.
        """
        probe = self.probe
        count = probe.num_replicas
        state = self.state["packed"].read_value()
        previous = state[_PREV_FP]
        win_min, win_max = tf.unstack(tf.reshape(state[_COUNTERS + count :], [2, count]))
        batch_size = stats.batch_size_int64
        win_min, win_max = tf.minimum(win_min, batch_size), tf.maximum(win_max, batch_size)
        static = probe.static
        # Also after steps not observed (`write.variants`: plain steps record no shapes): the
        # event names the last observed step before it (`"previous"`), so the reader knows the
        # steps between are unknown.
        last = state[_LAST_STEP]
        probe.write(
            tf.logical_or(
                tf.not_equal(previous, stats.fingerprint),
                tf.not_equal(last, tf.cast(step_value, tf.int64) - 1),
            ),
            schema.TAG_SHAPES,
            lambda: stats.shapes_json(
                static, tail=[tf.strings.join([', "previous": ', tf.strings.as_string(last)])]
            ),
            step_value,
            schema.KIND_SHAPES,
        )
        if probe.update_freq is not None:
            write_dense = probe.logged(step_value)
            window = (batch_size, win_min, win_max)
            probe.write(
                write_dense,
                schema.TAG_BATCH_SIZE,
                lambda: tf.cast(tf.stack(window), tf.int32),
                step_value,
                schema.KIND_BATCH_SIZE,
            )
            # A written window starts again empty.
            win_min = tf.where(write_dense, tf.constant(_EMPTY_MIN, tf.int64), win_min)
            win_max = tf.where(write_dense, tf.constant(_EMPTY_MAX, tf.int64), win_max)
        # Scalars as [1] vectors (reshapes, no kernel of their own): one concat.
        counters = [tf.reshape(tf.cast(v, tf.int64), [1]) for v in (stats.fingerprint, step_value)]
        self.state["packed"].assign(tf.concat([*counters, batch_size, win_min, win_max], axis=0))

    def pss_deliver(self, per_worker, step):
        """`ParameterServerStrategy`: every worker's `step`-th step (see `pss.deliver`)."""
        if self.pss_window is None:
            self.pss_window = pss.Window()
        pss.deliver(self, per_worker, step)

    def write_window(self):
        if self.pss_window is not None:  # ParameterServerStrategy: the coordinator's window
            pss.write_window(self)
            return
        if self.state.get("packed") is None:
            return
        counters, values = self._host_state()
        if int(values[_MIN, 0]) == _EMPTY_MIN:
            return  # no step since the last write
        step = int(counters[_LAST_STEP])
        window = values.astype(np.int32)
        self.probe.write_now(
            schema.TAG_BATCH_SIZE, lambda: tf.constant(window), step, schema.KIND_BATCH_SIZE
        )
        empty = self._empty_window()
        empty[_BATCH] = values[_BATCH].tolist()
        self.state["packed"].assign([*counters.tolist(), *np.ravel(empty)])

    def fit_step(self, fit):
        """Keras `fit`: every step's batch is observed, before the model's step."""
        return self.probe.observe_inputs, None

    def pss_fit_step(self, fit):
        """tf_keras `fit` under `ParameterServerStrategy`: each worker's batch, in its step."""
        return self.probe.observe_inputs, None

    def last_step(self):
        if self.pss_window is not None:
            return None if self.pss_window.last_step < 0 else self.pss_window.last_step
        if self.state.get("packed") is None:
            return None
        step = int(self._host_state()[0][_LAST_STEP])
        return None if step < 0 else step


class Recording:
    """`ReplicaProbe` methods of the inputs family."""

    def observe_inputs(self, batch, step=None):
        """Records the batch size and the shape and dtype of every input leaf, per replica.

        Call it in replica context (inside `strategy.run`) with the replica's local batch, or in
        cross-replica context with the distributed batch (leaves are `PerReplica` values).
        Nested dicts, lists and tuples are named by their path ("x/image", "0"); pass a dict to
        choose names. A failure inside the probe warns once and never stops training. Under
        `ParameterServerStrategy`, call it in a step given to `probe.schedule`
        (docs/parameter-server.md).

        Args:
          batch: the (nested) structure of input tensors.
          step: the step to record at (int or int tensor). When omitted, the step of the step
            axis: inside `probe.step()`, its step; outside, the first call records step 0 (or
            what `set_step` set), and the next step begins with the next call of a family that
            already recorded at this one (`write.steps`).

        Example:
          ```python
          def step_fn(x, y):
              probe.observe_inputs({"x": x, "y": y})  # replica context
              ...
          ```
        """
        if self.pss_capturing():  # a step given to `schedule` (ParameterServerStrategy)
            try:
                pss.observe(self, batch)
            except Exception as error:  # noqa: BLE001 - must never break training
                self.recorder("inputs").warn(error)
            return
        if not self.build():
            return
        recorder = self.recorder("inputs")
        try:
            names_and_leaves = flatten_with_names(batch)
            names = [name for name, _ in names_and_leaves]
            leaves = [leaf for _, leaf in names_and_leaves]
            if not leaves:
                self.warn_once("no_inputs", "tb_replica_plugin: observe_inputs got no tensors.")
                return
            self.merge_leaves(functools.partial(recorder.merge, names=names, step=step), leaves)
        except Exception as error:  # noqa: BLE001 - must never break training
            recorder.warn(error)

    def last_step(self):
        """The step of the latest `observe_inputs` call (host side), or None before any (or
        once the probe is closed)."""
        return self.recorder("inputs").last_step()
