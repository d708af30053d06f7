"""The base of a family's write side: its state, created before any step is traced.

A family's write side (`Family.write_side`, usually its `record` module) is a `Recorder` subclass
and, for the public API, a `Recording` mixin whose `observe_*` methods become methods of
`ReplicaProbe`. The probe creates one recorder per family of the registry and calls, host side:

- `create_state()` when it builds (outside any graph, before the first step is traced: variables
  created inside a `tf.function`'s first trace make TensorFlow trace it a second time);
- `delivered(delivery)` after each transfer was delivered (`core.transfer`: the step time);
- `write_window()` when the dense series' pending window must be written (epoch ends, `flush`,
  `close`): host-side writes of what was kept in the state;
- `step_set(step)` when the step axis is set (each `fit` starts from its step);
- `begun(how)`, `before_flush(now)` and `ended(ending)` around a stretch of training: when it
  begins, before each background flush, when it ends (the status family's heartbeat and end
  record; the others do nothing);
- under Keras `fit`, `fit_step(fit)` when `ReplicaCallback` instruments the model (the family's
  part of the train step and the hooks it installs), and `fit_begin`, `fit_epoch_begin`,
  `fit_epoch_end` at the callback's own hooks: a family's fit-time code is its own;
- `close()` when the probe closes.

Everything a recorder does in-graph goes through its probe: it puts its per-replica values in the
step's transfer (`probe.transfer()`, `core.transfer`) with a host handler, which records at
`probe.step_of(...)` (the one step axis, `write.steps`); `probe.write(...)` queues a summary;
`probe.logged(step)` / `probe.sampled(step)` are the one step-level decision every family shares;
`run_if(condition, body)` runs work only where such a decision holds.
"""

from typing import NamedTuple

import tensorflow as tf


class FaultState(NamedTuple):
    """The every-step fault state a family keeps on the host (`Recorder.fault_state`).

    Attributes:
      steps: how many steps had a fault so far (the host notices a new one by its growth).
      last: the step of the latest fault.
      job: whether the latest fault is one every worker stops at (the all-reduced flag; False at
        an expected loss-scale overflow).
      synced: whether `job` is all-reduced across the workers at every step (`sync_faults`).
    """

    steps: int
    last: int
    job: bool
    synced: bool


def run_if(condition, body, as_function=False):
    """Runs `body()` (for its writes and assigns) only when the bool tensor `condition` holds.

    A `tf.cond` whose branches return nothing: no output tensors to trace, lower and keep, which
    matters for conds traced with every training step and almost never taken.

    Args:
      condition: a bool scalar tensor (or a Python bool).
      body: a function of no arguments; its return value is ignored.
      as_function: keep the cond a functional `If` instead of letting TensorFlow lower it into
        switch and merge nodes of the step's graph. The branch is then compiled on its own when
        the step first runs (Grappler does not optimize it as part of the step), and a step that
        does not take it does not propagate "dead" values through its ops. But the `If`'s inputs
        are moved to its device (the host CPU, where the writer and the probe's state are) at
        every step: only for replicas on CPU devices (`ProbeCore.branches_as_functions`), where
        that move is a reference, never for accelerators (a GPU's gradients would be copied).
    """
    if isinstance(condition, bool):
        if condition:
            body()
        return

    def taken():
        body()

    cond_value(condition, taken, lambda: None, as_function=as_function)


def cond_value(condition, true_fn, false_fn, as_function=False):
    """`tf.cond(condition, true_fn, false_fn)`, kept a functional `If` when `as_function`.

    Args:
      condition: a bool scalar tensor.
      true_fn, false_fn: functions of no arguments returning the same structure (or None).
      as_function: as in `run_if`; the `If` runs on the device scope it is built under, so an
        `If` built under a replica's device takes that replica's tensors without a transfer.

    Returns:
      The output of the branch taken.
    """
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    first = len(graph.get_operations()) if graph is not None else 0
    result = tf.cond(condition, true_fn, false_fn)
    if as_function and graph is not None:
        from tensorflow.core.framework import attr_value_pb2

        for op in graph.get_operations()[first:]:
            if op.type in ("If", "StatelessIf"):
                # What cond_v2 sets to True inside a tf.function (no public switch for it).
                op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))  # noqa: SLF001
    return result


def host_variable(initial, shape=None, name=None):
    """A plain (not distributed) non-trainable resource variable on the current device.

    `tf.Variable` inside a `tf.distribute` strategy's scope (where a probe may be built: `fit`, or
    the first traced step of a custom loop) makes a mirrored variable, one copy per replica
    device, which every assign of the probe's state would update. The class itself bypasses the
    strategy's variable creator.

    Args:
      initial: the initial value (a tensor or a value `tf.constant` accepts).
      shape: a `tf.TensorShape` to allow other shapes later, or None.
      name: the variable name.

    Returns:
      A `tf.Variable` (ResourceVariable).
    """
    from tensorflow.python.ops import resource_variable_ops

    return resource_variable_ops.ResourceVariable(initial, trainable=False, shape=shape, name=name)


class Recorder:
    """State and host-side writes of one family (see the module docstring).

    Args:
      probe: the `ReplicaProbe` this family records for.

    Attributes:
      name: the family name (as in the registry), e.g. "gradients".
      probe: the probe.
    """

    name = ""

    def __init__(self, probe):
        self.probe = probe
        self.state = {}

    def variable(self, name, initial, dtype=None, shape=None):
        """Creates one state variable on the host CPU (called from `create_state`).

        Args:
          name: short name, unique in the family.
          initial: the initial value.
          dtype: its dtype (default: inferred from `initial`).
          shape: a `tf.TensorShape` to allow other shapes later (e.g. `tf.TensorShape(None)`).

        Returns:
          The `tf.Variable` (also kept in `self.state[name]`).
        """
        with tf.init_scope(), tf.device("/cpu:0"):
            value = tf.constant(initial, dtype) if dtype is not None else initial
            created = host_variable(value, shape=shape, name=f"probe_{self.name}_{name}")
        self.state[name] = created
        return created

    def create_state(self):
        """Creates the family's variables (host side, once). Default: none."""

    def delivered(self, delivery):
        """Called after every transfer was delivered, in the step's graph (cross-replica
        context, on the host; `delivery`: a `core.transfer.Delivery`). Default: nothing."""

    def write_window(self):
        """Writes what the in-graph steps kept but did not write (host side). Default: nothing."""

    def fault_state(self):
        """Host side: the every-step fault state (`FaultState`) of a family that
        checks every step for faults (gradients: NaN/Inf), else None (the default)."""
        return None

    def begun(self, how):
        """Host side: a stretch of training begins (`ProbeCore.begin_run`: the probe's first
        record, each Keras `fit`). Default: nothing."""

    def step_set(self, step):
        """Host side: the probe's step axis was set (`ProbeCore.set_step`): the next step
        records at `step`. Default: nothing."""

    def before_flush(self, now):
        """Host side, in the background flush thread, before each periodic flush (the probe's
        host lock held; `now`: `time.time()`). Default: nothing."""

    def flush_due(self):
        """Host side: the `time.monotonic()` by which this family wants the next background
        flush, when sooner than `flush_secs` from now (the status family's first heartbeats of
        a stretch), else None (the default). Asked after each flush; cheap."""
        return None

    def ended(self, ending):
        """Host side: a stretch of training ended (`ProbeCore.end_run`; `ending`: a
        `core.run_end.RunEnd`), before the probe flushes. Default: nothing."""

    def fit_step(self, fit):
        """Keras `fit`: this family's part of the train step `ReplicaCallback` instruments.

        Called when the callback instruments the model, before Keras traces the step. Hooks the
        family installs go through `fit` (`keras.hooks.Fit`: the model, the callback's options,
        the compute-loss and optimizer hooks), which undoes them when training ends.

        Args:
          fit: the callback's `keras.hooks.Fit`.

        Returns:
          `(before, after)`: `before(batch)` is called in replica context before the model's own
          step with the step's named batch (`core.nest.name_fit_batch`), `after()` after it;
          either None. Default: `(None, None)`.
        """
        return None, None

    def pss_fit_step(self, fit):
        """tf_keras `fit` under `ParameterServerStrategy` (`keras.pss_fit`): as `fit_step`, in
        a step run on a worker, where a family records only what it `pss_capture`s (and
        `pss_deliver`s on the coordinator). Default: `(None, None)`, nothing recorded."""
        return None, None

    def pss_fit_epoch_end(self, fit, final=False):
        """tf_keras `fit` under `ParameterServerStrategy`, host side (the coordinator): an epoch
        ended (`final`: training ended). Default: nothing."""

    def fit_begin(self, fit):
        """Keras `fit`, host side: training begins (the probe's step axis is at the step before
        the first). Default: nothing."""

    def fit_epoch_begin(self, fit):
        """Keras `fit`, host side: an epoch begins. Default: nothing."""

    def fit_epoch_end(self, fit, final=False):
        """Keras `fit`, host side: an epoch ended, before the probe flushes (`final`: training
        ended, after the last epoch). Default: nothing."""

    def close(self):
        """Drops the state (the probe records nothing after closing)."""
        self.state = {}
