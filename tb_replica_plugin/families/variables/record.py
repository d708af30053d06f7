"""Variables family, write side: where each copy of every variable lives, and how far it drifts.

At the steps it is called for (logged steps), every copy of every variable is fingerprinted on its
own device (`check.VariablesStats`: a bitwise hash, min/max/sum/sum of squares and a
61-bucket sketch), so no copy leaves its device; the placement document is written at the first
check and whenever it changes. With a budget, a check inside a `tf.function` reads a slice of
each large variable that rotates with the logged step (`rotation.py`; `variables/window` says
which); host-side checks read everything.
"""

import contextlib
import functools
import hashlib

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from tb_replica_plugin.core import distribute
from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from tb_replica_plugin.families.variables import check, fingerprint, pss, rotation, schema
from tb_replica_plugin.families.variables import fit as fit_side

# The family's state vector: placement written, placement fingerprint.
_HAS_PLACEMENT, _PLACEMENT_FP = range(2)


@contextlib.contextmanager
def _without_graph_optimizer():
    """Calls of `tf.function`s in this thread skip Grappler while inside.

    The eager drift check is one traced function of a few ops per variable copy; Grappler's
    passes took about 2 s of CPU when it was first run on a model of 580 variables and buy it
    nothing at run time. The option is the calling thread's own (`function_call_options` is
    thread-local), so the training step is not affected.
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    previous = ctx.function_call_options
    config = previous.config_proto_serialized
    options = context.FunctionCallOptions(executor_type=previous.executor_type)
    proto = config_pb2.ConfigProto()
    proto.ParseFromString(config)
    proto.graph_options.rewrite_options.disable_meta_optimizer = True
    options.config_proto_serialized = proto
    ctx.function_call_options = options
    try:
        yield
    finally:
        ctx.function_call_options = previous


def fingerprint_rows(stats):
    """The written `variables/fingerprint` (version 2): one row per copy that is not replica 0's.

    Args:
      stats: a `check.VariablesStats`.

    Returns:
      float64 [U, 2 + 4 + K]: `(v, r, fingerprint[v, r])` for every copy on replica 0 and every
      other copy unless its variable is shareable and its hash equals replica 0's copy's (its
      row is then replica 0's exactly; the reader takes it from there), in (v, r) order. In the
      normal case, every copy bit-identical, that is V rows instead of V * R.
    """
    num, replicas = stats.present.shape
    ids = np.stack(np.meshgrid(np.arange(num), np.arange(replicas), indexing="ij"), axis=-1)
    table = tf.concat([tf.constant(ids.astype(np.float64)), stats.fingerprint], axis=-1)
    kept = stats.present & ~stats.shareable[:, None]
    kept[:, 0] = stats.present[:, 0]
    keep = tf.constant(kept)
    if replicas > 1 and stats.shareable.any():
        differs = tf.not_equal(stats.hash, stats.hash[:, :1])
        keep = tf.logical_or(keep, tf.logical_and(differs, tf.constant(stats.present)))
    return tf.boolean_mask(table, keep)


def _numeric_size(entry):
    """Elements of a numeric variable of known shape, else None (such variables are not cut)."""
    if not fingerprint.is_numeric(entry.dtype) or any(d is None for d in entry.shape):
        return None
    return int(np.prod(entry.shape, dtype=np.int64))


def _slicer(index, period, sizes, chunks):
    """The in-graph slice of a rotating check at logged check `index` (an int64 tensor).

    Returns:
      `(part, extent)`: `part(v, value)` gives the checked elements of variable v's copy (flat;
      the copy itself when v is checked whole) and `extent` the int64 [V, 2] window tensor.
    """
    size = np.array([n or 0 for n in sizes], dtype=np.int64)
    chunk = np.array([c or 0 for c in chunks], dtype=np.int64)
    first = tf.minimum((index % period) * chunk, size - chunk)  # rotation.py's slice starts
    cut = [n is not None and c < n for n, c in zip(sizes, chunks, strict=True)]
    on_device = {}  # device -> (slice starts, [-1]) there: one transfer per device, not per copy

    def part(v, value):
        if not cut[v]:
            return value
        if value.device not in on_device:
            with tf.device(value.device):  # each variable's start, by one split
                on_device[value.device] = (tf.split(first, len(sizes)), tf.constant([-1]))
        starts, flat = on_device[value.device]
        return tf.slice(tf.reshape(value, flat), starts[v], [int(chunks[v])])

    counts = np.where(cut, chunk, [-1 if n is None else n for n in sizes])
    return part, tf.stack([first, tf.constant(counts, tf.int64)], axis=1)


class Recorder(RecorderBase):
    """State and writes of the variables family."""

    name = "variables"
    # The step of the last full check of a `fit` (`ReplicaCallback`'s epoch-end checks, spaced
    # by the rotation period), None outside one.
    whole_checked_at = None
    pss_placement = None  # `pss.Placement` under ParameterServerStrategy

    def create_state(self):
        self.variable("counters", [0, 0], tf.int64)
        self._plans = {}
        self._layouts = {}

    def close(self):
        super().close()
        self._plans = {}
        self._layouts = {}

    def warn(self, error):
        self.probe.warn_failed("variables", error)

    def pss_variables(self, variables, step):
        """`ParameterServerStrategy`, on the coordinator: the placement of `variables` (added to
        those seen so far) written at `step` when any is new (`pss.add`). Warns on failure."""
        try:
            pss.add(self, variables, step)
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def fit_step(self, fit):
        """Keras `fit`: the check of the logged steps after the model's step (`fit.py`)."""
        return None, fit_side.step_observer(fit)

    def fit_begin(self, fit):
        """Keras `fit`: no full check in this fit yet (the step axis is at its step before)."""
        self.whole_checked_at = self.probe.step_axis.current()

    def pss_fit_epoch_end(self, fit, final=False):
        """tf_keras `fit` under `ParameterServerStrategy`: where the model's and its optimizer's
        variables live (which parameter server holds each, `pss.add`), once the first epoch
        created the optimizer's (written when any is new)."""
        if not fit.options.variables:
            return
        variables = list(fit.model.variables)
        optimizer = fit.optimizer()
        if optimizer is not None:
            known = {id(v) for v in variables}
            variables += [v for v in optimizer.variables() if id(v) not in known]
        self.probe.observe_variables(variables)

    def fit_epoch_end(self, fit, final=False):
        """Keras `fit`: the full check at epoch ends and at the end of training (`fit.py`)."""
        fit_side.check_whole(self, fit, final)

    def _plan(self, variables, exact, budget=None):
        """Entries, placement JSON, rotation and the traced check for one variable list (cached).

        Returns:
          `(variables, record, host, period)`: `record(step)` checks in the caller's graph (a
          rotating slice when `period` > 1), `host(step)` is the full check traced once for
          host-side calls.
        """
        key = (tuple(id(v) for v in variables), exact, budget)
        plan = self._plans.get(key)
        if plan is None:
            probe = self.probe
            entries = fingerprint.describe_variables(variables, probe.static["devices"])
            sizes = [_numeric_size(entry) for entry in entries]
            period, chunks = rotation.plan(sizes, None if exact else budget)
            static = dict(probe.static, central=distribute.central_storage(probe.strategy))
            if period > 1:
                static["rotation"] = {
                    "period": period,
                    "budget": budget,
                    "whole_elements": rotation.WHOLE_ELEMENTS,
                }
            placement = fingerprint.placement_json(entries, static)
            digest = hashlib.blake2b(placement.encode("utf-8"), digest_size=7).digest()
            window = (period, sizes, chunks) if period > 1 else None
            record = functools.partial(
                self._record, entries, placement, int.from_bytes(digest, "little"), exact, window
            )
            # The host-side check (epoch ends) is traced for a call per epoch: its cost is the
            # trace, so every device's copies are summarized at once (a few ops per device).
            host = tf.function(
                functools.partial(record, fused_min_copies=1, rotate=False), autograph=False
            )
            # Keeps the variables alive with the plan, so their ids cannot be reused.
            plan = (variables, record, host, period)
            self._plans[key] = plan
        return plan

    def period(self, variables, exact=False, budget=None):
        """P of checks of `variables` with this `budget` (`rotation.plan`; 1: every check is
        full). `ReplicaCallback` also spaces its full checks at epoch ends by it."""
        return self._plan(list(variables), bool(exact), budget)[3]

    def rotates(self, variables, exact=False, budget=None):
        """Whether checks of `variables` with this `budget` read rotating slices (period > 1)."""
        return self.period(variables, exact, budget) > 1

    def check_whole(self, variables, step, budget):
        """Host side: the full check of `variables` at `step`, whatever `update_freq` says.

        `ReplicaCallback` calls it at each epoch end when its steps' checks rotate: it shares
        their plan (placement event and `variables/window` tag) and, at a step that also had a
        rotating check, its events come later and replace that check's when read.
        """
        if not self.probe.build():
            return
        try:
            _, _, traced, _ = self._plan(list(variables), False, budget)
            self._run_host_check(traced, tf.constant(int(step), tf.int64))
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _run_host_check(self, traced, step):
        with self.probe.host_lock:  # host side: the flush thread shares the writer
            if not self.probe.disabled_reason:
                with _without_graph_optimizer():
                    traced(step)

    def merge(self, strategy, *, variables, step, exact, budget=None):
        """Cross-replica part of `observe_variables`: the check runs where the step's transfer
        is delivered (`_deliver`: at the end of a step scope, or now)."""
        probe = self.probe
        transfer = None
        try:
            del strategy  # the copies are read from the variables themselves
            plan = self._plan(variables, exact, budget)
            transfer = probe.transfer()
            transfer.on_host(self.name, functools.partial(self._deliver, plan=plan, step=step))
        except Exception as error:  # noqa: BLE001 - must never break training
            if transfer is not None:
                transfer.drop(self.name)
            self.warn(error)
            return
        probe.ship(transfer)

    def _deliver(self, delivery, *, plan, step):
        """Step, gating, then the check (eagerly: the traced host check)."""
        probe = self.probe
        try:
            _, record, traced, _ = plan
            step_value = probe.step_of(delivery, self.name, step)
            if tf.executing_eagerly():
                if probe.update_freq is None or int(step_value) % probe.update_freq == 0:
                    self._run_host_check(traced, step_value)
            elif probe.update_freq is None:
                record(step_value)
            else:
                # With the other families' writes of a logged step, in one cond (`when`).
                probe.when(probe.gated(probe.logged(step_value)), lambda: record(step_value))
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _record(
        self,
        entries,
        placement,
        placement_fp,
        exact,
        window,
        step,
        fused_min_copies=check.FUSED_MIN_COPIES,
        rotate=True,
    ):
        """Fingerprints every copy (or this step's slices, see `rotation.py`) and writes the
        variables tags at `step`, in named steps: which slices this step checks
        (`_window_extent`), the placement when it changed (`_write_placement`), the stats
        (`_write_stats`), then the placement's fingerprint kept for the next check."""
        part, extent = self._window_extent(window, step, rotate)
        stats = check.VariablesStats(
            entries, self.probe.num_replicas, exact, self._layouts, fused_min_copies, part
        )
        self._write_placement(placement, placement_fp, step)
        self._write_stats(stats, extent, step)
        counters = self.state["counters"]
        counters.assign(
            tf.tensor_scatter_nd_update(
                counters,
                [[_HAS_PLACEMENT], [_PLACEMENT_FP]],
                tf.constant([1, placement_fp], tf.int64),
            )
        )

    def _window_extent(self, window, step, rotate):
        """Step 1: `(part, extent)` of a rotating check: the slices `step` fingerprints and the
        `[start, stop]` rows written for them (`rotation.py`); `(None, None)` without a window.

        Args:
          window: `(period, sizes, chunks)` of the rotation, or None (every copy in full).
          step: the step the check records at.
          rotate: False: the whole of every variable (its extent `[0, n]`), no slicing.

        Returns:
          `(part, extent)`: the slicer's part (None: whole) and an int64 [V, 2] tensor or None.
        """
        if window is None:
            return None, None
        period, sizes, chunks = window
        if rotate:
            return _slicer(step // (self.probe.update_freq or 1), period, sizes, chunks)
        whole = [-1 if n is None else n for n in sizes]
        return None, tf.constant([[0, n] for n in whole], tf.int64)

    def _write_placement(self, placement, placement_fp, step):
        """Step 2: the placement event, where no placement was written yet or its fingerprint
        `placement_fp` differs from the last one written."""
        current = self.state["counters"].read_value()
        changed = tf.logical_or(
            tf.equal(current[_HAS_PLACEMENT], 0),
            tf.not_equal(current[_PLACEMENT_FP], placement_fp),
        )
        self.probe.write(
            changed,
            schema.TAG_VARIABLE_PLACEMENT,
            lambda: tf.constant(placement),
            step,
            schema.KIND_VARIABLE_PLACEMENT,
        )

    def _write_stats(self, stats, extent, step):
        """Step 3: the hash and fingerprint rows of `stats` (a `check.VariablesStats`), the
        window's `extent` when one is checked, and the exact values when kept."""
        probe = self.probe
        writes = [
            (schema.TAG_VARIABLE_HASH, lambda: stats.hash, schema.KIND_VARIABLE_HASH),
            (
                schema.TAG_VARIABLE_FINGERPRINT,
                lambda: fingerprint_rows(stats),
                schema.KIND_VARIABLE_FINGERPRINT,
            ),
        ]
        if extent is not None:
            writes.append((schema.TAG_VARIABLE_WINDOW, lambda: extent, schema.KIND_VARIABLE_WINDOW))
        if stats.exact is not None:
            writes.append(
                (schema.TAG_VARIABLE_EXACT, lambda: stats.exact, schema.KIND_VARIABLE_EXACT)
            )
        probe.write_all(True, writes, step)  # one cond, on the recording gate


class Recording:
    """`ReplicaProbe` methods of the variables family."""

    def observe_variables(self, variables, step=None, exact=False, budget=None):
        """Records where each copy of every variable lives and how far it drifts from replica 0.

        For every variable (trainable or not; Keras or TensorFlow, mirrored or not), each copy is
        fingerprinted on its own device: a bitwise hash, min/max/sum/sum of squares and a
        61-bucket random projection (see `families/variables/fingerprint.py`), so no copy leaves
        its device and the traffic per variable does not depend on its size. With `exact=True`
        each copy is also sent to replica 0's device for the exact element-wise difference. The
        variables' placement is written at the first call and whenever it changes.

        Call it at the steps you want to log, in cross-replica context (after `strategy.run`,
        eagerly or in a `tf.function`) or in replica context (inside `strategy.run`, through a
        `merge_call`). When the probe has an integer `update_freq`, only steps that are a
        multiple of it are recorded (inside a `tf.function` the check runs under a `tf.cond`, so
        other steps cost a counter increment). Eager calls run one traced function over all the
        variables. Pass the same list at every call (one list per probe). A failure warns once
        and never stops training. Under `ParameterServerStrategy` (one copy of each variable,
        on a parameter server) it records which server holds each variable or shard and its
        bytes, once per new variable (docs/parameter-server.md); `exact` and `budget` do not
        apply there.

        Args:
          variables: an iterable of variables, e.g. `model.variables + optimizer.variables`.
          step: the step to record at (int or int tensor). When omitted, the step of the step
            axis (see `observe_inputs`): called once per step after the update (after the step
            function, eagerly, or at the end of `probe.step()`), it records the step just run:
            the values at step s are those after step s's update.
          exact: also compute the exact max-abs and L2 difference of every copy from replica 0
            (copies whole variables across devices).
          budget: None (default: every check reads every element), or about how many elements
            per replica a check inside a `tf.function` reads: variables of more than 4,096
            elements are cut into P slices (P = their total size / `budget`, rounded up) and
            logged check i reads slice i mod P of each, so every element is checked once every
            P logged checks (see `families/variables/rotation.py`). Eager calls, and any call
            with `exact=True`, check every element.

        Raises:
          ValueError: if `budget` is neither None nor an integer >= 1.

        Example:
          ```python
          probe = tb_replica_plugin.ReplicaProbe("logs/replicas", strategy, update_freq=10)
          for batch in dist_dataset:
              strategy.run(step_fn, args=batch)
              probe.observe_variables(model.variables + optimizer.variables)
          probe.close()
          ```
        """
        rotation.check_budget(budget, "budget")
        if self.pss_variables_seen(variables, step):  # ParameterServerStrategy: placement only
            return
        if not self.build():
            return
        recorder = self.recorder("variables")
        try:
            variables = list(variables)
            if not variables:
                self.warn_once(
                    "no_variables", "tb_replica_plugin: observe_variables got no variables."
                )
                return
            merge = functools.partial(
                recorder.merge, variables=variables, step=step, exact=bool(exact), budget=budget
            )
            replica_context = tf.distribute.get_replica_context()
            if replica_context is not None:
                replica_context.merge_call(merge)
            else:
                merge(self.strategy)
        except Exception as error:  # noqa: BLE001 - must never break training
            recorder.warn(error)

    def warn_variables_failed(self, error):
        """Warns once that the variables family failed (training goes on)."""
        self.recorder("variables").warn(error)
