"""Gradients family, write side: local (pre all-reduce) gradient norms, loss, NaN/Inf per replica.

Each replica reduces its own gradients on its device (`replica.replica_values`: one sum of squares
per variable, and its loss), and those `V + 1` floats go into the step's one transfer
(`core.transfer`); the exact NaN/Inf counts are taken in the replica's fault branch, on its
device, only where they are not finite (`replica.nonfinite_counts`). On the host the recorder
(`Recorder._deliver`, in named steps):

1. writes the variables' names and shapes when they change (`gradients/variables`);
2. at a step where some replica's values are not finite, writes that replica's counts
   (`gradients/nonfinite`), captures the culprit batches and updates the fault state `halt_on`
   reads (`_check_faults`, under a `tf.cond`: a clean step pays its predicate);
3. writes the norms and loss at logged steps (`gradients/norms`), or keeps the last step's values
   for the host's window write (`_keep_or_write_norms`).
"""

import functools
import hashlib
import json

import tensorflow as tf

from tb_replica_plugin.core import distribute
from tb_replica_plugin.core import transfer as transfer_lib
from tb_replica_plugin.core.nest import flatten_with_names
from tb_replica_plugin.core.recorder import FaultState, cond_value, run_if
from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from tb_replica_plugin.families.gradients import capture, pss, replica, schema
from tb_replica_plugin.families.gradients.device_faults import DeviceFaults
from tb_replica_plugin.families.gradients.replica import (  # noqa: F401 - the family's helpers
    nonfinite_counts,
    replica_values,
)

# What the recorded gradient norms are the norms of (stored in the `gradients/variables` event).
SCALING_REPLICA_LOSS = "replica_loss"  # the gradient of the replica's own loss (fit, Keras losses)
SCALING_AS_GIVEN = "as_given"  # the gradients as given, divided by `scale`

# Keys of the family's values in a step's transfer.
_FLOATS = ("gradients", "sq_loss")
_COUNTS = ("gradients", "counts")
_BATCH = ("gradients", "batch")


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


def dense_rows(floats, count, has_loss, scaling):
    """The dense `[2 + V, R]` float32 tensor of `gradients/norms` from the packed values.

    Args:
      floats: float64 [R, ...], every replica's packed values (`replica.packed_floats`).
      count: V.
      has_loss: whether the loss follows the sums of squares.
      scaling: the `replica.HostScaling`.

    Returns:
      float32 [2 + V, R]: global norm, loss (NaN without one), then the norm of each variable's
      gradient: as float32 ops on the scaled float32 values give them.
    """
    sq, loss = replica.scaled_rows(floats, count, has_loss, scaling)
    sq = tf.transpose(sq)  # [V, R]
    global_norm = tf.sqrt(tf.reduce_sum(sq, axis=0, keepdims=True))
    return tf.concat([global_norm, loss[None, :], tf.sqrt(sq)], axis=0)


def variables_document(names, shapes, static_fields):
    """The JSON text of a `gradients/variables` event and its int64 fingerprint."""
    document = dict(static_fields, variables=list(names), shapes=[list(s) for s in shapes])
    text = json.dumps(document, sort_keys=True)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=7).digest()
    return text, int.from_bytes(digest, "little")


class _Call:
    """One call of `observe`: its tensors and what is known of it when tracing."""

    def __init__(self, grads, variables, loss, batch_pairs, **static):
        self.grads = grads
        self.loss = loss
        self.names = variable_names(variables)
        self.shapes = [variable_shape(v) for v in variables]
        self.batch_names = [name for name, _ in batch_pairs]
        self.batch_leaves = [leaf for _, leaf in batch_pairs]
        self.step = static["step"]
        self.grad_scale = static["grad_scale"]
        self.loss_scale = static["loss_scale"]
        self.scaling_word = static["scaling"]
        self.loss_scaled = bool(static["loss_scaled"])
        self.has_loss = loss is not None
        self.scaling = replica.host_scaling(
            self.grad_scale, self.loss_scale, static.get("loss_factor")
        )
        self.distributed = isinstance(loss, tf.distribute.DistributedValues) or any(
            isinstance(g, tf.distribute.DistributedValues) for g in grads
        )

    @property
    def loss_only(self):
        """Only a NaN/Inf loss stops a job: a loss-scale optimizer's overflows are expected."""
        return self.loss_scaled and self.has_loss

    def document(self, probe):
        """`(text, fingerprint)` of this call's `gradients/variables` event."""
        static = probe.static
        return variables_document(
            self.names,
            self.shapes,
            {
                "loss": self.has_loss,
                "scaling": self.scaling_word,
                "loss_scaled": self.loss_scaled,
                "replicas": static["replicas"],
                "devices": static["devices"],
                "source": probe.source,
            },
        )


# Slots of the int64 fault state, assigned only at steps with a fault (so never on clean steps):
# steps with a fault, first such step, last such step, captured steps, and whether the last
# fault was on a local replica (1) or only on another worker's (0, `sync_faults`).
# The last slot: whether the last fault was a stopping fault of the job (`sync_faults` only).
FAULT_STEPS, FAULT_FIRST, FAULT_LAST, FAULT_CAPTURES, FAULT_LOCAL, FAULT_JOB = range(6)


class Recorder(RecorderBase):
    """State and writes of the gradients family."""

    name = "gradients"

    def create_state(self):
        # The last step's packed values (float64 [R, ...]) and its step (-1: written), for the
        # host's window write (`update_freq=None`).
        self.variable("last", tf.zeros([0, 0], tf.float64), shape=tf.TensorShape(None))
        self.variable("pending", -1, tf.int64)
        self.variable("fault", [0, -1, -2, 0, 0, 0], tf.int64)
        self._last_layout = None  # (V, has_loss, scaling) of `last`
        self._document = None  # the fingerprint of the last `gradients/variables` written
        # The plain steps' fault record on each replica's device (`write.variants`). None under
        # ParameterServerStrategy: a step's faults travel in its record (`pss.py`), and a
        # variable on a worker, read at each flush, fails once that worker is lost or restarted.
        self.device_faults = DeviceFaults(self)
        pss = self.probe.static.get("strategy") == "ParameterServerStrategy"
        devices = [] if pss else self.probe.static["devices"]
        self.device_faults.create(devices, self.probe.step_axis.start)

    def step_set(self, step):
        if self.state:
            self.device_faults.set_step(step)

    def before_flush(self, now):
        if self.state:
            self.device_faults.write_new(self.probe)

    def ended(self, ending):
        if self.state:
            self.device_faults.write_new(self.probe)

    # Culprit capture and the job-wide fault flag (set by the probe's owner before tracing).
    capture_limit = capture.DEFAULT_CAPTURE_LIMIT
    capture_bytes = capture.DEFAULT_CAPTURE_BYTES
    # True: every replica of every worker learns of a fault at the step it happens (one scalar
    # all-reduce per step, in replica context or across replicas), so all workers can stop at
    # the same step.
    sync_faults = False

    def fault_state(self):
        """Host side: its fault slots (`FAULT_*`) as a `core.recorder.FaultState`, or None before
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

    def fit_step(self, fit):
        """Keras `fit`: the optimizer hook that sees each replica's local gradients
        (`fit_install`); nothing in the step itself."""
        fit_install(self, fit)
        return None, None

    def pss_fit_step(self, fit):
        """tf_keras `fit` under `ParameterServerStrategy`: the same optimizer hook; in a step
        run on a worker it puts the worker's gradients in the step's record (`pss.observe`)."""
        fit_install(self, fit)
        return None, None

    # ------------------------------------------------------------ replica side

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
        loss_factor=None,
    ):
        """`observe_gradients` with separate divisors for gradients and loss (used by fit).

        `loss_scaled` tells readers that a loss-scale optimizer is in use (its overflow steps
        are expected and skipped by the rules). `batch` (the replica's input structure, or
        None) is captured at the first step of a fault. `loss_factor`: a float32 constant the
        loss was multiplied by in the step, the host's to apply (`replica.constant_factor`).
        """
        probe = self.probe
        if probe.pss_capturing():  # tf_keras fit under ParameterServerStrategy (`pss_fit_step`)
            if loss is not None and loss_factor is not None:
                loss = loss * loss_factor
            pss.observe(
                probe,
                grads,
                variables,
                loss,
                grad_scale,
                variable_names,
                variable_shape,
                loss_scale=loss_scale,
            )
            return
        if not probe.build():
            return
        try:
            grads, variables = pair_gradients(grads, variables)
            if not grads:
                probe.warn_once(
                    "no_gradients", "tb_replica_plugin: observe_gradients got no gradients."
                )
                return
            call = _Call(
                grads,
                variables,
                loss,
                self._batch_pairs(batch),
                step=step,
                grad_scale=grad_scale,
                loss_scale=loss_scale,
                scaling=scaling,
                loss_scaled=loss_scaled,
                loss_factor=loss_factor,
            )
            context = distribute.replica_context_of(probe.strategy)
            if probe.plain_step:
                self._observe_plain(context, call, batch)
            elif context is not None and not call.distributed:
                self._observe_in_replica(context, call)
            else:
                self._observe_across(call)
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _observe_plain(self, context, call, batch):
        """The plain step (`write.variants`): each replica's device fault record only
        (`device_faults`), in replica context or across."""
        capture = None
        leaves = call.batch_leaves
        if leaves:
            probe = self.probe
            replicas = probe.static["replicas"]
            capture = (replicas, call.batch_names, self.capture_limit, self.capture_bytes)
        elif batch is not None:  # no capture: the first leaf tells an empty batch
            first = [t for _, t in flatten_with_names(batch) if isinstance(t, tf.Tensor)][:1]
            leaves = first
        if context is not None and not call.distributed:
            values = replica_values(call.grads, call.loss, combine=False)
            merge = functools.partial(self._merge_plain, has_loss=call.has_loss, capture=capture)
            context.merge_call(merge, args=(values, leaves))
            return
        strategy = self.probe.strategy
        per_grad = [strategy.experimental_local_results(g) for g in call.grads]
        count = len(per_grad[0])
        losses = (
            [None] * count if call.loss is None else self.probe.local_values(strategy, call.loss)
        )
        devices = self.probe.static["devices"]
        per_replica = []
        for index in range(count):
            with tf.device(devices[index]):
                grads = [g[index] for g in per_grad]
                per_replica.append(replica_values(grads, losses[index], combine=False))
        per_leaf = [strategy.experimental_local_results(leaf) for leaf in leaves]
        batches = [list(r) for r in zip(*per_leaf, strict=True)] if per_leaf else None
        if batches is not None and len(batches) != count:
            batches, capture = None, None
        with tf.name_scope("tb_replica"):
            self.device_faults.record(devices, per_replica, call.has_loss, batches, capture)

    def _merge_plain(self, strategy, values, leaves, *, has_loss, capture):
        """Cross-replica part of `_observe_plain` in replica context."""
        try:

            def local(value):
                return [tf.convert_to_tensor(t) for t in strategy.experimental_local_results(value)]

            losses = local(values.loss)
            sq = [list(r) for r in zip(*[local(v) for v in values.sq], strict=True)]
            grads = [list(r) for r in zip(*[local(v) for v in values.values], strict=True)]
            per_replica = [
                replica.ReplicaGradients(sq[r], losses[r], [], grads[r]) for r in range(len(losses))
            ]
            per_leaf = [local(leaf) for leaf in leaves]
            batches = [list(r) for r in zip(*per_leaf, strict=True)] if per_leaf else None
            with tf.name_scope("tb_replica"):
                self.device_faults.record(
                    self.probe.static["devices"], per_replica, has_loss, batches, capture
                )
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _batch_pairs(self, batch):
        """The dense leaves of `batch` to capture at a fault (none without a capture)."""
        if batch is None or self.capture_limit <= 0:
            return []
        return [
            (name, leaf)
            for name, leaf in flatten_with_names(batch)
            if not isinstance(leaf, (tf.SparseTensor, tf.RaggedTensor))
        ]

    def _observe_in_replica(self, context, call):
        """Replica context: this replica's values on its device, then one `merge_call` (no
        computation: the tensors are only regrouped)."""
        values = replica_values(call.grads, call.loss, call.grad_scale, call.loss_scale)
        bad = None
        if self.sync_faults:
            flag = replica.stop_flag(values, call.has_loss, call.loss_only, call.batch_leaves)
            bad = context.all_reduce(tf.distribute.ReduceOp.SUM, flag)
        # The first replica's `call` (the same on every replica) rides with the function.
        merge = functools.partial(self._merge, call=call)
        context.merge_call(merge, args=(values, call.batch_leaves, bad))

    def _merge(self, strategy, values, batch_leaves, bad, *, call):
        """Cross-replica part of `_observe_in_replica`: every replica's values into the step's
        transfer."""
        try:

            def local(value):
                return [tf.convert_to_tensor(t) for t in strategy.experimental_local_results(value)]

            def columns(items):  # [R][n] of a list of per-replica values
                return [list(r) for r in zip(*[local(v) for v in items], strict=True)]

            loss = local(values.loss)
            sq, grads = columns(values.sq), columns(values.values)
            scales = columns(values.scales) if values.scales else [[] for _ in loss]
            per_replica = [
                replica.ReplicaGradients(sq[r], loss[r], scales[r], grads[r])
                for r in range(len(loss))
            ]
            per_leaf = [local(leaf) for leaf in batch_leaves]  # [L][R], no copy
            batch = [list(r) for r in zip(*per_leaf, strict=True)] if per_leaf else None
            self._send(call, per_replica, batch, None if bad is None else local(bad)[0])
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _observe_across(self, call):
        """Cross-replica context: each replica's values on its device, then the transfer.

        Raises:
          ValueError: if the gradients or the loss are not of this probe's replica count.
        """
        probe = self.probe
        strategy = probe.strategy
        per_grad = [strategy.experimental_local_results(g) for g in call.grads]
        count = len(per_grad[0])
        probe.check_replicas(count, "gradients")
        # A loss that is not per replica (one scalar) is every replica's, as `strategy.run`
        # gives one tensor to every replica.
        losses = [None] * count if call.loss is None else probe.local_values(strategy, call.loss)
        devices = probe.static["devices"]
        per_leaf = [strategy.experimental_local_results(leaf) for leaf in call.batch_leaves]
        if any(len(leaf) != count for leaf in per_leaf):
            probe.warn_once(
                "capture_batch",
                "tb_replica_plugin: observe_gradients got a `batch` that is not "
                "per-replica in cross-replica context; pass the PerReplica batch to "
                "capture it. Gradients are recorded without it.",
            )
            per_leaf = []
        batch = [list(r) for r in zip(*per_leaf, strict=True)] if per_leaf else None
        per_replica, flags = [], []
        for index in range(count):
            with tf.device(devices[index]):
                grads = [g[index] for g in per_grad]
                values = replica_values(grads, losses[index], call.grad_scale, call.loss_scale)
                per_replica.append(values)
                if self.sync_faults:
                    leaves = batch[index] if batch else ()
                    flags.append(replica.stop_flag(values, call.has_loss, call.loss_only, leaves))
        bad = self._job_count(strategy, flags) if self.sync_faults else None
        self._send(call, per_replica, batch, bad)

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

    def _send(self, call, per_replica, batch, job_bad):
        """Puts every replica's values in the step's transfer: its floats, its fault branch's
        counts, its batch (read by the host only at a faulty step); then ships it."""
        probe = self.probe
        probe.check_replicas(len(per_replica), "gradients")
        transfer = probe.transfer()
        if transfer.scope:  # the device fault record's step counters keep up
            self.device_faults.advance(probe.static["devices"])
        try:
            for index, packet in enumerate(transfer.packets):
                values = per_replica[index]
                with tf.device(packet.device):
                    packet.floats(_FLOATS, replica.packed_floats(values, call.has_loss))

                def counts(values=values):
                    return nonfinite_counts(values.values, values.loss, call.has_loss)

                size = len(schema.NONFINITE_ROWS)
                packet.on_fault(_COUNTS, counts, size, tf.int64, guard=[_FLOATS])
                if batch is not None:
                    packet.keep(_BATCH, batch[index])
            deliver = functools.partial(self._deliver, call=call, job_bad=job_bad)
            transfer.on_host(self.name, deliver)
        except Exception:
            transfer.drop(self.name)
            raise
        probe.ship(transfer)

    # ---------------------------------------------------------------- host side

    def _deliver(self, delivery, *, call, job_bad):
        """The host's part, in named steps (the module docstring)."""
        try:
            probe = self.probe
            step = probe.step_of(delivery, self.name, call.step)
            self._write_document(call, delivery)
            with tf.device("/cpu:0"):
                floats = delivery.value(_FLOATS)  # float64 [R, V (+ 1) (+ scales)]
            self._check_faults(delivery, call, floats, job_bad, step)
            self._keep_or_write_norms(call, floats, step)
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn(error)

    def _write_document(self, call, delivery):
        """Step 1: the `gradients/variables` event, written by the host when a step observing
        other variables (names, shapes, scaling) is traced, at the step it records at as the
        host knows it (the next step of the axis; `step=` when a number): no op in the step."""
        probe = self.probe
        text, fingerprint = call.document(probe)
        if fingerprint == self._document or probe.disabled_reason:
            return
        if isinstance(call.step, int):
            step = call.step
        elif delivery.step is not None:
            step = probe.next_step()
        else:
            step = probe.step_axis.next_for(self.name)
        with probe.host_lock:
            probe.write_now(
                schema.TAG_GRAD_VARIABLES,
                lambda: tf.constant(text),
                step,
                schema.KIND_GRAD_VARIABLES,
            )
        self._document = fingerprint

    def _check_faults(self, delivery, call, floats, job_bad, step):
        """Step 2: at a step where some replica's values are not finite (on this worker, or on
        another one with `sync_faults`), its NaN/Inf counts from its fault branch, the culprit
        batches and the fault state.

        The predicate is one sum of every replica's packed values (float32 values summed in
        float64 cannot overflow: the sum is finite exactly when each value is); which replicas
        are not healthy is read inside the branch."""
        probe = self.probe
        with tf.device("/cpu:0"):
            finite = tf.math.is_finite(tf.reduce_sum(floats))
        # For the step-time family, which leaves a faulty step out of the ready times.
        delivery.cache[transfer_lib.GRADIENTS_FINITE] = finite
        batch = delivery.kept(_BATCH)  # None when not captured

        def write_nonfinite():
            with tf.device("/cpu:0"):
                local_fault = tf.logical_not(finite)
                healthy = tf.math.is_finite(tf.reduce_sum(floats, axis=1))  # [R]
            counts = tf.cast(tf.transpose(delivery.value(_COUNTS)), tf.int32)  # [4, R]
            probe.write(
                tf.reduce_any(counts > 0),
                schema.TAG_GRAD_NONFINITE,
                lambda: counts,
                step,
                schema.KIND_GRAD_NONFINITE,
            )
            job = tf.constant(False) if job_bad is None else job_bad > 0
            self._update_fault(step, local_fault, job, healthy, call.batch_names, batch)

        as_function = probe.branches_as_functions
        if job_bad is None:
            # The branch where the sum is not finite: no negation to run at clean steps.
            cond_value(finite, lambda: None, write_nonfinite, as_function=as_function)
        else:
            fault = tf.logical_or(tf.logical_not(finite), job_bad > 0)
            run_if(fault, write_nonfinite, as_function=as_function)

    def _keep_or_write_norms(self, call, floats, step):
        """Step 3: the norms at logged steps, or the step's values kept for the host's write."""
        probe = self.probe
        layout = (len(call.names), call.has_loss, call.scaling)
        if probe.update_freq is None:
            # Every step keeps its packed values; the norms at the host's write.
            self._last_layout = layout
            self.state["last"].assign(floats)
            self.state["pending"].assign(step)
            return
        probe.write(
            probe.logged(step),
            schema.TAG_GRAD_NORMS,
            lambda: dense_rows(floats, *layout),
            step,
            schema.KIND_GRAD_NORMS,
        )

    def _update_fault(self, step, local_fault, job, healthy, batch_names, batch):
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
            take = self.probe.gated(
                tf.logical_and(
                    tf.logical_and(fresh, local_fault), before[FAULT_CAPTURES] < self.capture_limit
                )
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
                unhealthy = tf.reshape(tf.where(tf.logical_not(healthy)), [-1])
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

    def pss_deliver(self, per_worker, step):
        """`ParameterServerStrategy`: every worker's `step`-th step (see `pss.deliver`)."""
        pss.deliver(self, per_worker, step)

    def write_window(self):
        pss.write_last(self)  # ParameterServerStrategy: the last step's norms, if not written
        if self.state:
            self.device_faults.write_new(self.probe)
        pending = self.state.get("pending")
        if pending is None or self._last_layout is None:
            return
        step = int(pending.numpy())
        if step < 0:
            return
        last, layout = self.state["last"], self._last_layout
        self.probe.write_now(
            schema.TAG_GRAD_NORMS,
            lambda: dense_rows(last.read_value(), *layout),
            step,
            schema.KIND_GRAD_NORMS,
        )
        pending.assign(-1)


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
        gradients to one sum of squares per variable; only those scalars and the loss travel,
        in the replica's one vector of the step. Written: the norms and loss every
        `update_freq` steps (`gradients/norms`), and
        at EVERY step where a replica's gradients or loss hold a NaN or an Inf, an event naming
        the replica (`gradients/nonfinite`). The exact NaN/Inf counts are computed only at such
        steps (the replica's fault branch, on its device, where its squared norms or loss are not
        finite). A failure warns once and never stops training.

        Args:
          grads: this replica's gradients, one per variable (tensors, `tf.IndexedSlices` or
            None; None gradients are skipped).
          variables: the variables, in the same order (their names label the per-variable norms).
          loss: this replica's loss (scalar), or None. In cross-replica context, the
            `PerReplica` losses, or one scalar tensor (e.g. `strategy.reduce("MEAN", loss,
            axis=None)`): as `strategy.run` does with a tensor that is not per replica, that
            value is recorded as every replica's loss (divided by `scale`), and a NaN/Inf in
            it counts on every replica (the reduced value cannot say whose it was).
          step: the step to record at (int or int tensor). When omitted, the step of the step
            axis (see `observe_inputs`), so `observe_inputs` and `observe_gradients` called once
            per step record the same step numbers.
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

        Under `ParameterServerStrategy`, call it in a step given to `probe.schedule`: each
        worker's norms, loss and NaN/Inf counts (`batch` is not captured there;
        docs/parameter-server.md).

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
        if self.pss_capturing():  # a step given to `schedule` (ParameterServerStrategy)
            pss.observe(self, grads, variables, loss, scale, variable_names, variable_shape)
            return
        self.recorder("gradients").observe(
            grads, variables, loss, step, scale, scale, SCALING_AS_GIVEN, batch=batch
        )


# Keras `fit` (`Recorder.fit_step`): the hooks `ReplicaCallback` installs for this family.


def fit_install(recorder, fit):
    """Hooks the model's `compute_loss` and its optimizer (through `fit`) when gradients are
    recorded and the optimizer can be hooked; else nothing.

    Args:
      recorder: the gradients family's `Recorder`.
      fit: the callback's `keras.hooks.Fit`.
    """
    if not fit.options.gradients or fit.optimizer() is None:
        return
    capture = fit.capture_loss()
    fit.hook_optimizer(fit_observer(recorder, fit, capture))


def fit_observer(recorder, fit, capture):
    """The `observe(grads, variables)` function of the optimizer hook.

    Recorded norms are of the gradient of each replica's own loss when the model uses Keras's
    own `compute_loss` (which divides the loss by the replica count under `tf.distribute`): the
    callback multiplies by the replica count and, where the gradients reaching the optimizer
    still carry a loss scale (Keras 3's `LossScaleOptimizer`), divides by it
    (`compat.optimizer_info`). With an overridden `compute_loss`, or no loss seen, gradients are
    recorded as given (divided by that loss scale). `fit.batches` (fed the step's named batch)
    gives the batch captured at a fault.
    """
    keras_loss = fit.keras_loss()
    replicas = fit.model.distribute_strategy.num_replicas_in_sync
    info = fit.optimizer_info()

    def observe(grads, variables):
        try:
            # Keras's `loss * (1 / replicas)`: the replica sends the loss before that product,
            # the host applies it (the step no longer computes it for nothing else).
            loss, loss_factor = replica.constant_factor(fit.take(capture))
            batch = fit.take(fit.batches)
            replica_loss = loss is not None and keras_loss
            divide = 1.0 / replicas if replica_loss else 1.0
            # A Python number where no loss scale is in the gradients: no op per step for it.
            grad_scale = info.loss_scale() * divide if info.grads_scaled_at_apply else divide
            recorder.observe(
                grads,
                variables,
                loss,
                step=None,
                grad_scale=grad_scale,
                loss_scale=divide,
                scaling=SCALING_REPLICA_LOSS if replica_loss else SCALING_AS_GIVEN,
                loss_scaled=info.loss_scaled,
                batch=batch,
                loss_factor=loss_factor,
            )
        except Exception as error:  # noqa: BLE001 - never break training
            recorder.warn(error)

    return observe
