"""Gradients family, write side: local (pre all-reduce) gradient norms, loss, NaN/Inf per replica.

`replica_stats` runs on one replica's device, in replica context (or under `tf.device` of that
replica in cross-replica context), on the gradients that replica computed. It reduces them to a
few scalars per variable, so only `V + 2` floats and 4 ints per replica ever leave the device:

- the sum of squares of every variable's gradient (`sq`, float32 [V]), from which the per-variable
  norms and the global norm (`sqrt(sum(sq))`) follow;
- the loss (float32 scalar);
- NaN/Inf counts (int32 [4]: NaN in gradients, Inf in gradients, loss NaN, loss Inf).

The counts are cheap to skip: the global squared norm is finite exactly when no gradient holds a
NaN or an Inf (or the squares overflow float32, beyond ~1.8e19 per element), so each replica
only computes that flag (with the loss check); the exact counts are computed only where a flag
is False: on CPU replicas in one `If` per replica on its device (its gradients stay there), on
accelerators in one `tf.cond` on the host over every replica (`nonfinite_counts_across`). A step
without NaN/Inf costs the V reductions (one `l2_loss` each) and one scalar `is_finite` per
replica.
"""

import functools
import hashlib
import json

import numpy as np
import tensorflow as tf

from tb_replica_plugin.core import distribute
from tb_replica_plugin.core.halt import FaultState
from tb_replica_plugin.core.nest import flatten_with_names
from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from tb_replica_plugin.core.recorder import cond_value, run_if
from tb_replica_plugin.families.gradients import capture, schema

# What the recorded gradient norms are the norms of (stored in the `gradients/variables` event).
SCALING_REPLICA_LOSS = "replica_loss"  # the gradient of the replica's own loss (fit, Keras losses)
SCALING_AS_GIVEN = "as_given"  # the gradients as given, divided by `scale`


# Rows of the int32 [4, R] non-finite counts.
NONFINITE_ROWS = ("grad_nan", "grad_inf", "loss_nan", "loss_inf")


def variable_name(variable, index):
    """A readable name for a variable: Keras 3 `path`, else `name` without ":0"."""
    name = getattr(variable, "path", None) or getattr(variable, "name", None) or f"var_{index}"
    name = str(name)
    return name[:-2] if name.endswith(":0") else name


def variable_names(variables):
    """Names of `variables`, made unique with a `#i` suffix where two share a name."""
    names = []
    seen = {}
    for index, variable in enumerate(variables):
        name = variable_name(variable, index)
        if name in seen:
            seen[name] += 1
            name = f"{name}#{seen[name]}"
        else:
            seen[name] = 0
        names.append(name)
    return names


def variable_shape(variable):
    try:
        return [int(d) if d is not None else -1 for d in variable.shape]
    except (TypeError, ValueError, AttributeError):
        return []


def pair_gradients(grads, variables):
    """Keeps the `(gradient, variable)` pairs whose gradient is not None.

    Args:
      grads: gradients (tensors, `tf.IndexedSlices` or None), one per variable.
      variables: the variables.

    Returns:
      `(grads, variables)` lists without the None gradients.

    Raises:
      ValueError: if the two lists differ in length.
    """
    grads = list(grads)
    variables = list(variables)
    if len(grads) != len(variables):
        raise ValueError(f"got {len(grads)} gradients for {len(variables)} variables")
    kept = [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None]
    return [g for g, _ in kept], [v for _, v in kept]


def _dense_values(grad):
    """The values whose squares sum to the squared norm of `grad` (IndexedSlices combined)."""
    if isinstance(grad, tf.IndexedSlices):
        # Rows repeated in the indices add up in the dense gradient: combine them first.
        unique, position = tf.unique(grad.indices)
        return tf.math.unsorted_segment_sum(grad.values, position, tf.size(unique))
    return grad


def _as_float32(value):
    value = tf.convert_to_tensor(value)
    return value if value.dtype == tf.float32 else tf.cast(value, tf.float32)


def _as_float32_factor(value):
    """A float32 factor: a Python number stays a numpy float32 constant (no op to trace or run at
    every step); anything else (e.g. a dynamic loss scale) becomes a float32 tensor."""
    if isinstance(value, (int, float)):
        return np.float32(value)
    return _as_float32(value)


def _squared_factor(scale):
    """`2 / scale**2` in float32, what a sum of `l2_loss` values is multiplied by: the float32
    ops' result, a constant for a Python number (`_as_float32_factor`)."""
    inverse = np.float32(1.0) / _as_float32_factor(scale)
    return np.float32(2.0) * (inverse * inverse)


def replica_stats(grads, loss=None, scale=1.0, loss_scale=None):
    """The every-step stats of one replica's gradients, computed where they are (no copy).

    Args:
      grads: this replica's gradients (tensors or `tf.IndexedSlices`, no None).
      loss: this replica's loss (scalar tensor), or None when unknown.
      scale: factor the recorded gradients are divided by (float or scalar tensor), e.g. the
        loss scale of a `LossScaleOptimizer`.
      loss_scale: factor the recorded loss is divided by (default: `scale`).

    Returns:
      A tuple `(sq, loss, healthy, values)`: float32 [V] sums of squares of each gradient divided
      by `scale**2`, the float32 loss divided by `loss_scale` (NaN when `loss` is None), a bool
      scalar (the squared global norm and the loss are finite), and the float32 dense gradient
      values (`IndexedSlices` combined) that `nonfinite_counts` counts in when `healthy` is
      False.
    """
    values = [_as_float32(_dense_values(g)) for g in grads]
    if values:
        # One op per variable: l2_loss(v) = sum(v * v) / 2, the same sum (halving is exact).
        sq = tf.stack([tf.nn.l2_loss(v) for v in values]) * _squared_factor(scale)
    else:
        sq = tf.zeros([0], tf.float32)
    if loss is None:
        loss_value = tf.constant(float("nan"), tf.float32)
        healthy = tf.math.is_finite(tf.reduce_sum(sq))
    else:
        loss_divisor = _as_float32_factor(scale if loss_scale is None else loss_scale)
        loss_value = _as_float32(loss)
        if loss_value.shape.rank != 0:
            loss_value = tf.reshape(loss_value, [-1])[0]
        loss_value = loss_value / loss_divisor
        healthy = tf.math.is_finite(tf.reduce_sum(sq) + loss_value)
    return sq, loss_value, healthy, values


def stop_flag(stats, loss_only):
    """float32 1.0 when a replica has a fault that stops the job (`Recorder.sync_faults`), else 0.

    Args:
      stats: the replica's `replica_stats`.
      loss_only: under a loss-scale optimizer (with a loss) only a NaN/Inf loss stops: its
        gradient overflows are expected. Otherwise any NaN/Inf in gradients or loss.
    """
    _, loss_value, healthy, _ = stats
    stop = tf.logical_not(tf.math.is_finite(loss_value) if loss_only else healthy)
    return tf.cast(stop, tf.float32)


def nonfinite_counts(values, loss_value, has_loss):
    """int32 [4] exact NaN/Inf counts of one replica (rows `NONFINITE_ROWS`).

    Only computed (by the probe, under a `tf.cond`) at a step where some replica's `healthy`
    flag is False: a finite sum of squares means no gradient element is NaN or Inf.

    Args:
      values: the replica's float32 gradient values (from `replica_stats`).
      loss_value: its float32 loss (from `replica_stats`).
      has_loss: whether a loss was given (else the loss rows are 0).
    """
    if values:
        # One vector of every gradient element (one shape constant for every reshape), then both
        # counts from one reduction: the branch runs only at a faulty step, but it is traced with
        # every step function, so it is kept to a few ops.
        flat_shape = tf.constant([-1])
        flat = tf.concat([tf.reshape(v, flat_shape) for v in values], axis=0)
        kinds = tf.stack([tf.math.is_nan(flat), tf.math.is_inf(flat)])
        counts = tf.reduce_sum(tf.cast(kinds, tf.int32), axis=1)
    else:
        counts = tf.zeros([2], tf.int32)
    if has_loss:
        loss_kinds = tf.stack([tf.math.is_nan(loss_value), tf.math.is_inf(loss_value)])
        loss_counts = tf.cast(loss_kinds, tf.int32)
    else:
        loss_counts = tf.zeros([2], tf.int32)
    return tf.concat([counts, loss_counts], axis=0)


def nonfinite_counts_across(values, losses, has_loss, devices=None):
    """int32 [4, R]: `nonfinite_counts` of every replica in one set of ops (cross-replica context).

    Where every replica's gradients have the same static shapes (the usual case: one model), each
    variable's R gradients are stacked and the counts taken from one [R, elements] matrix on the
    host CPU: about a third of the ops of one set per replica. The branch runs only at a faulty
    step, so the copy to the host is rare; it is traced with every step function, so its op count
    is what a user pays. Otherwise each replica's counts are taken on its own device. The probe
    uses it where the fault branch is lowered (accelerators); on CPU replicas each replica's
    counts come from its own `If` instead (`_counts_where_unhealthy`).

    Args:
      values: `[R][V]` the replicas' float32 gradient values (from `replica_stats`).
      losses: `[R]` their float32 losses (from `replica_stats`).
      has_loss: whether a loss was given (else the loss rows are 0).
      devices: the replicas' devices, where each replica's counts are taken when the shapes
        differ (default: where `tf.device` says).

    Returns:
      One column per replica, the rows of `NONFINITE_ROWS`.

    Example:
      >>> nan = float("nan")
      >>> nonfinite_counts_across([[tf.constant([nan, 1.0])], [tf.constant([2.0, nan])]],
      ...                         [tf.constant(1.0), tf.constant(nan)], True).numpy()
      array([[1, 1],
             [0, 0],
             [0, 1],
             [0, 0]], dtype=int32)
    """
    count = len(values)
    shapes = [[v.shape for v in replica] for replica in values]
    joinable = (
        count > 1
        and values[0]
        and all(shape.is_fully_defined() for shape in shapes[0])
        and all(replica == shapes[0] for replica in shapes)
    )
    if not joinable:
        per_replica = []
        for replica in range(count):
            with tf.device(devices[replica] if devices else None):
                per_replica.append(nonfinite_counts(values[replica], losses[replica], has_loss))
        return tf.stack(per_replica, axis=1)
    with tf.device("/cpu:0"):
        # [R, elements]: each variable's gradients stacked over replicas, then flattened.
        flat = tf.concat(
            [tf.reshape(tf.stack(column), [count, -1]) for column in zip(*values, strict=True)],
            axis=1,
        )
        kinds = tf.stack([tf.math.is_nan(flat), tf.math.is_inf(flat)])  # [2, R, elements]
        counts = tf.reduce_sum(tf.cast(kinds, tf.int32), axis=2)  # [2, R]
        if has_loss:
            loss = tf.stack(losses)
            loss_counts = tf.cast(tf.stack([tf.math.is_nan(loss), tf.math.is_inf(loss)]), tf.int32)
        else:
            loss_counts = tf.zeros([2, count], tf.int32)
        return tf.concat([counts, loss_counts], axis=0)


def _counts_where_unhealthy(values, loss_value, healthy, has_loss, devices, replica):
    """One replica's `nonfinite_counts` where its `healthy` flag is False (else zeros), in a
    functional `If` on its device: a healthy replica's counts are zeros (a finite sum of squares
    and loss hold no NaN or Inf)."""
    with tf.device(devices[replica] if replica < len(devices) else None):
        return cond_value(
            tf.logical_not(healthy),
            lambda: nonfinite_counts(values, loss_value, has_loss),
            lambda: tf.zeros([len(NONFINITE_ROWS)], tf.int32),
            as_function=True,
        )


def raw_rows(per_replica_sq, per_replica_loss):
    """float32 `[1 + V, R]`: the loss row, then the sums of squares (cross-replica context).

    What the probe keeps at every step for a host-side write (two ops); `dense_rows` turns it
    into the written rows.
    """
    return tf.concat(
        [tf.expand_dims(tf.stack(per_replica_loss), 0), tf.stack(per_replica_sq, axis=1)], 0
    )


def dense_rows(raw):
    """The dense `[2 + V, R]` tensor of `gradients/norms` from `raw_rows`.

    Args:
      raw: float32 [1 + V, R] from `raw_rows`.

    Returns:
      float32 [2 + V, R]: global norm, loss, then the norm of each variable's gradient.
    """
    sq = raw[1:]  # [V, R]
    global_norm = tf.sqrt(tf.reduce_sum(sq, axis=0, keepdims=True))
    return tf.concat([global_norm, raw[:1], tf.sqrt(sq)], axis=0)


def variables_document(names, shapes, static_fields):
    """The JSON text of a `gradients/variables` event and its int64 fingerprint."""
    document = dict(static_fields, variables=list(names), shapes=[list(s) for s in shapes])
    text = json.dumps(document, sort_keys=True)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=7).digest()
    return text, int.from_bytes(digest, "little")


# Slots of the packed int64 counters (one assign per step): next step, names written, names
# fingerprint, step of `last`, `last` not written yet.
_STEP, _HAS_NAMES, _NAMES_FP, _LAST_STEP, _PENDING = range(5)
# Slots of the int64 fault state, assigned only at steps with a fault (so never on clean steps):
# steps with a fault, first such step, last such step, captured steps, and whether the last
# fault was on a local replica (1) or only on another worker's (0, `sync_faults`).
# The last slot: whether the last fault was a stopping fault of the job (`sync_faults` only).
FAULT_STEPS, FAULT_FIRST, FAULT_LAST, FAULT_CAPTURES, FAULT_LOCAL, FAULT_JOB = range(6)


class Recorder(RecorderBase):
    """State and writes of the gradients family."""

    name = "gradients"

    def create_state(self):
        self.variable("counters", [int(self._start_step), 0, 0, -1, 0], tf.int64)
        # Last raw rows (loss, sums of squares), for host-side writes (update_freq=None).
        self.variable("last", tf.zeros([0, 0]), shape=tf.TensorShape(None))
        self.variable("fault", [0, -1, -2, 0, 0, 0], tf.int64)

    # Culprit capture and the job-wide fault flag (set by the probe's owner before tracing).
    capture_limit = capture.DEFAULT_CAPTURE_LIMIT
    capture_bytes = capture.DEFAULT_CAPTURE_BYTES
    # True: every replica of every worker learns of a fault at the step it happens (one scalar
    # all-reduce per step, in replica context or across replicas), so all workers can stop at
    # the same step.
    sync_faults = False

    def fault_state(self):
        """Host side: its fault slots (`FAULT_*`) as a `core.halt.FaultState`, or None before
        build."""
        fault = self.state.get("fault")
        if fault is None:
            return None
        slots = fault.numpy()
        return FaultState(
            steps=int(slots[FAULT_STEPS]),
            last=int(slots[FAULT_LAST]),
            job=bool(slots[FAULT_JOB]),
            synced=bool(self.sync_faults),
        )

    def fault_slots(self):
        """Host side: the int64 fault slots (`FAULT_*`) as a numpy array, or None before build."""
        fault = self.state.get("fault")
        return None if fault is None else fault.numpy()

    def warn(self, error):
        self.probe.warn_failed("gradients", error)

    def observe(
        self,
        grads,
        variables,
        loss,
        step,
        grad_scale,
        loss_scale,
        scaling,
        loss_scaled=False,
        batch=None,
    ):
        """`observe_gradients` with separate divisors for gradients and loss (used by fit).

        `loss_scaled` tells readers that a loss-scale optimizer is in use (its overflow steps
        are expected and skipped by the rules). `batch` (the replica's input structure, or
        None) is captured at the first step of a fault.
        """
        probe = self.probe
        if not probe.build():
            return
        try:
            grads, variables = pair_gradients(grads, variables)
            if not grads:
                probe.warn_once(
                    "no_gradients", "tb_replica_plugin: observe_gradients got no gradients."
                )
                return
            names = variable_names(variables)
            shapes = [variable_shape(v) for v in variables]
            pairs = [
                (name, leaf)
                for name, leaf in (flatten_with_names(batch) if self.capture_limit > 0 else [])
                if not isinstance(leaf, (tf.SparseTensor, tf.RaggedTensor))
            ]
            batch_names = [name for name, _ in pairs]
            batch_leaves = [leaf for _, leaf in pairs]
            merge = functools.partial(
                self._merge,
                names=names,
                shapes=shapes,
                step=step,
                has_loss=loss is not None,
                scaling=scaling,
                loss_scaled=bool(loss_scaled),
                batch_names=batch_names,
            )
            distributed = isinstance(loss, tf.distribute.DistributedValues) or any(
                isinstance(g, tf.distribute.DistributedValues) for g in grads
            )
            replica_context = distribute.replica_context_of(probe.strategy)
            if replica_context is not None and not distributed:
                # Stats on this replica's device; they (and the gradients, for the exact
                # NaN/Inf counts at a step that has some) go through merge_call, no copy.
                stats = replica_stats(grads, loss, grad_scale, loss_scale)
                bad = None
                if self.sync_faults:
                    flag = stop_flag(stats, loss_scaled and loss is not None)
                    bad = replica_context.all_reduce(tf.distribute.ReduceOp.SUM, flag)
                replica_context.merge_call(
                    merge, args=stats, kwargs={"batch_leaves": batch_leaves, "job_bad": bad}
                )
            else:
                self._observe_across(grads, loss, grad_scale, loss_scale, batch_leaves, merge)
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _observe_across(self, grads, loss, grad_scale, loss_scale, batch_leaves, merge):
        """The cross-replica part of `observe`: each replica's stats on its device, then write.

        Args:
          grads: the gradients (no None) as `strategy.run` returned them: `PerReplica` values,
            or plain tensors on a worker of one replica.
          loss: a `PerReplica` loss, one tensor for every replica (e.g. a loss reduced with
            `strategy.reduce`: recorded as every replica's loss), or None.
          grad_scale, loss_scale: the divisors of `replica_stats`.
          batch_leaves: the `PerReplica` leaves of the batch to capture (or plain tensors:
            warned once and not captured).
          merge: the `functools.partial` of `_merge` (its keywords are `_write`'s).

        Raises:
          ValueError: if the gradients or the loss are not of this probe's replica count.
        """
        probe = self.probe
        strategy = probe.strategy
        per_grad = [strategy.experimental_local_results(g) for g in grads]
        count = len(per_grad[0])
        probe.check_replicas(count, "gradients")
        # A loss that is not per replica (one scalar) is every replica's, as `strategy.run`
        # gives one tensor to every replica.
        losses = [None] * count if loss is None else probe.local_values(strategy, loss)
        devices = probe.static["devices"]
        stats, flags = [], []
        loss_only = merge.keywords["loss_scaled"] and loss is not None
        for replica in range(count):
            with tf.device(devices[replica]):
                stats.append(
                    replica_stats(
                        [g[replica] for g in per_grad], losses[replica], grad_scale, loss_scale
                    )
                )
                flags.append(stop_flag(stats[-1], loss_only) if self.sync_faults else None)
        per_leaf = [strategy.experimental_local_results(leaf) for leaf in batch_leaves]
        if any(len(leaf) != count for leaf in per_leaf):
            probe.warn_once(
                "capture_batch",
                "tb_replica_plugin: observe_gradients got a `batch` that is not "
                "per-replica in cross-replica context; pass the PerReplica batch to "
                "capture it. Gradients are recorded without it.",
            )
            per_leaf = []
        self._write(
            [s[0] for s in stats],
            [s[1] for s in stats],
            [s[2] for s in stats],
            [s[3] for s in stats],
            batch=[list(r) for r in zip(*per_leaf, strict=True)] if per_leaf else None,
            job_bad=self._job_count(strategy, flags) if self.sync_faults else None,
            **merge.keywords,
        )

    def _job_count(self, strategy, flags):
        """Cross-replica context: the job's count of replicas with a stopping fault at this
        step, as replica context's all-reduce gives it (every worker gets the same count).

        Args:
          strategy: the probe's strategy.
          flags: `stop_flag` of each local replica (float32 scalars, on its device).

        Returns:
          A float32 scalar: the sum of every replica's flag over every worker.
        """
        replicas = self.probe.static["replicas"]
        per_replica = strategy.experimental_distribute_values_from_function(
            lambda context: tf.identity(flags[replicas.index(context.replica_id_in_sync_group)])
        )
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _merge(
        self, strategy, sq, loss, healthy, values, batch_leaves=(), job_bad=None, **keywords
    ):
        """Cross-replica part: gather the small stats, write."""
        try:

            def local(value):
                return [tf.convert_to_tensor(t) for t in strategy.experimental_local_results(value)]

            per_variable = [local(v) for v in values]  # [V][R]; V >= 1
            per_replica = [list(v) for v in zip(*per_variable, strict=True)]
            per_leaf = [local(leaf) for leaf in batch_leaves]  # [L][R], no copy
            batch = [list(r) for r in zip(*per_leaf, strict=True)] if per_leaf else None
            self._write(
                local(sq),
                local(loss),
                local(healthy),
                per_replica,
                batch=batch,
                job_bad=None if job_bad is None else local(job_bad)[0],
                **keywords,
            )
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _write(
        self,
        sq,
        loss,
        healthy,
        values,
        *,
        names,
        shapes,
        step,
        has_loss,
        scaling,
        loss_scaled,
        batch_names=(),
        batch=None,
        job_bad=None,
    ):
        probe = self.probe
        static = probe.static
        probe.check_replicas(len(sq), "gradients")
        state = self.state
        counters = tf.unstack(state["counters"].read_value())  # one op, not one slice each
        if step is None:
            step_value = counters[_STEP]
            next_step = step_value + 1
        else:
            step_value = tf.cast(step, tf.int64)
            next_step = counters[_STEP]
        text, fingerprint = variables_document(
            names,
            shapes,
            {
                "loss": bool(has_loss),
                "scaling": scaling,
                "loss_scaled": loss_scaled,
                "replicas": static["replicas"],
                "devices": static["devices"],
                "source": probe.source,
            },
        )
        names_changed = tf.logical_or(
            tf.equal(counters[_HAS_NAMES], 0), tf.not_equal(counters[_NAMES_FP], fingerprint)
        )
        recording = probe.recording()
        probe.write(
            tf.logical_and(names_changed, recording),
            schema.TAG_GRAD_VARIABLES,
            lambda: tf.constant(text),
            step_value,
            schema.KIND_GRAD_VARIABLES,
        )
        devices = static["devices"]

        local_fault = tf.logical_not(tf.reduce_all(tf.stack(healthy)))
        any_fault = local_fault if job_bad is None else tf.logical_or(local_fault, job_bad > 0)
        per_replica_counts = None
        if probe.branches_as_functions:
            # CPU replicas: each replica's counts in an `If` on its own device, so its gradients
            # and loss stay there and one int32 [4] per replica reaches the host at each step
            # (as inputs of the host's `If` they would each be a transfer at every step).
            per_replica_counts = tf.stack(
                [
                    _counts_where_unhealthy(values[r], loss[r], healthy[r], has_loss, devices, r)
                    for r in range(len(values))
                ],
                axis=1,
            )

        def write_nonfinite():
            # Only at a step where some replica's squared norm or loss is not finite (on this
            # worker, or on another one with `sync_faults`). Accelerators: the counts of every
            # replica in this host branch, so the gradients move only at such a step.
            counts = (
                nonfinite_counts_across(values, loss, has_loss, devices)
                if per_replica_counts is None
                else per_replica_counts
            )  # [4, R]
            probe.write(
                tf.logical_and(tf.reduce_any(counts > 0), recording),
                schema.TAG_GRAD_NONFINITE,
                lambda: counts,
                step_value,
                schema.KIND_GRAD_NONFINITE,
            )
            job = tf.constant(False) if job_bad is None else job_bad > 0
            self._update_fault(step_value, local_fault, job, healthy, batch_names, batch, recording)

        run_if(any_fault, write_nonfinite, as_function=probe.branches_as_functions)
        if probe.update_freq is None:
            # Every step keeps its raw stats (2 ops); the norms are taken at the host write.
            state["last"].assign(raw_rows(sq, loss))
            last_step, pending = step_value, tf.constant(1, tf.int64)
        else:
            probe.write(
                tf.logical_and(probe.logged(step_value), recording),
                schema.TAG_GRAD_NORMS,
                lambda: dense_rows(raw_rows(sq, loss)),
                step_value,
                schema.KIND_GRAD_NORMS,
            )
            last_step, pending = counters[_LAST_STEP], counters[_PENDING]
        state["counters"].assign(
            tf.stack([next_step, tf.constant(1, tf.int64), fingerprint, last_step, pending])
        )

    def _update_fault(self, step, local_fault, job, healthy, batch_names, batch, recording):
        """At a step with a fault: capture the culprit batches, then update the fault state.

        A batch is captured at the first step of a run of faulty steps (the step before was
        clean), for every local replica whose gradients or loss are not finite, while fewer than
        `capture_limit` steps were captured.
        """
        fault = self.state["fault"]
        before = tf.unstack(fault.read_value())
        fresh = tf.not_equal(before[FAULT_LAST], step - 1)
        captured = tf.constant(0, tf.int64)
        if batch is not None and self.capture_limit > 0:
            take = tf.logical_and(
                tf.logical_and(fresh, local_fault),
                tf.logical_and(before[FAULT_CAPTURES] < self.capture_limit, recording),
            )
            replicas = self.probe.static["replicas"]
            devices = self.probe.static["devices"]

            def blocks():
                # One block per unhealthy replica. Every block has 1 + 2 * L strings, so the
                # blocks are stacked and the healthy replicas' rows dropped: one mask instead of
                # one `tf.cond` per replica to trace (this runs only at the first faulty step).
                stacked = capture.capture_blocks(
                    replicas, batch_names, batch, self.capture_bytes, devices
                )
                unhealthy = tf.reshape(tf.where(tf.logical_not(tf.stack(healthy))), [-1])
                return tf.reshape(tf.gather(stacked, unhealthy), [-1])

            try:
                self.probe.write(take, schema.TAG_GRAD_BATCH, blocks, step, schema.KIND_GRAD_BATCH)
                captured = tf.cast(take, tf.int64)  # written exactly where `take` holds
            except Exception as error:  # noqa: BLE001 - the NaN/Inf record goes on without it
                self.probe.warn_failed("capture", error, "the culprit batch")
        first = tf.where(before[FAULT_FIRST] < 0, step, before[FAULT_FIRST])
        fault.assign(
            tf.stack(
                [
                    before[FAULT_STEPS] + 1,
                    first,
                    step,
                    before[FAULT_CAPTURES] + captured,
                    tf.cast(local_fault, tf.int64),
                    tf.cast(job, tf.int64),
                ]
            )
        )

    def write_window(self):
        counters = self.state.get("counters")
        if counters is None:
            return
        values = counters.numpy()
        if not values[_PENDING]:
            return
        last = self.state["last"]
        self.probe.write_now(
            schema.TAG_GRAD_NORMS,
            lambda: dense_rows(last.read_value()),
            int(values[_LAST_STEP]),
            schema.KIND_GRAD_NORMS,
        )
        counters.assign(tf.tensor_scatter_nd_update(counters, [[_PENDING]], [0]))


class Recording:
    """`ReplicaProbe` methods of the gradients family."""

    def observe_gradients(self, grads, variables, loss=None, step=None, scale=1.0, batch=None):
        """Records each replica's local gradient norms, loss and NaN/Inf counts, before all-reduce.

        Call it in replica context (inside `strategy.run`) with the gradients this replica
        computed, before `optimizer.apply_gradients` all-reduces them; or in cross-replica context
        (outside `strategy.run`) with what `strategy.run` returned: `PerReplica` gradients (and
        loss), or plain tensors where this worker has one replica. With `halt_on` in a
        multi-worker job it all-reduces one fault flag per replica, so every worker must call it
        at every step (docs/halting.md). Per replica, on its own device, it reduces the
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
          loss: this replica's loss (scalar), or None. In cross-replica context, the
            `PerReplica` losses, or one scalar tensor (e.g. `strategy.reduce("MEAN", loss,
            axis=None)`): as `strategy.run` does with a tensor that is not per replica, that
            value is recorded as every replica's loss (divided by `scale`), and a NaN/Inf in
            it counts on every replica (the reduced value cannot say whose it was).
          step: the step to record at (int or int tensor). When omitted, this family counts its
            own calls from 0 (or from `set_step`), so `observe_inputs` and `observe_gradients`
            called once per step record the same step numbers.
          scale: the recorded gradients and loss are divided by this (float or scalar tensor).
            E.g. with `loss = tf.nn.compute_average_loss(per_example, global_batch_size=B)` over
            R replicas, `scale=1 / R` records the gradient of each replica's own mean loss, which
            is comparable across replicas and runs of any size.
          batch: this replica's input batch (a tensor or nested dict/tuple of tensors), or None.
            At the first step of a fault (a replica's gradients or loss turn non-finite) the
            batch of every faulty replica is written (`gradients/batch`, at most
            `capture_limit` steps, `capture_bytes` per replica): `tb-replica export-batch`
            writes it to a `.npz`. Clean steps pay nothing (it sits under the fault's
            `tf.cond`).

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
        self.recorder("gradients").observe(
            grads, variables, loss, step, scale, scale, SCALING_AS_GIVEN, batch=batch
        )
