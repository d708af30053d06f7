"""The probe's transfers: step scopes, one transfer per replica and step, and the step of each
record.

`Shipping` is the part of `ProbeCore` that families reach from their cross-replica code: they put
their per-replica values in `transfer()` (the open step scope's `core.transfer.Transfer`, or a new
one for this call alone) and `ship` it; the core delivers it (`core.transfer`) and calls each
family's host handler with the step it records at (`step_of`, from the one step axis of
`write.steps`) and the step decisions of that step (`logged`, `sampled`, `recording`, computed
once per step).
"""

import contextlib
import threading

import tensorflow as tf

from tb_replica_plugin.core import transfer as transfer_lib
from tb_replica_plugin.core.recorder import run_if


class _Scope:
    """An open step scope of one graph: its transfer and how deep each thread is in it."""

    def __init__(self, transfer):
        self.transfer = transfer
        self.depth = {}  # thread ident -> nesting depth


def _graph_key():
    return None if tf.executing_eagerly() else id(tf.compat.v1.get_default_graph())


class Shipping:
    """`ProbeCore`'s transfers (a mixin: it uses the probe's `build`, `_static`, `_axis`,
    `_recorders`, `warn_failed` and `warn_once`)."""

    def _init_shipping(self):
        self._scopes = {}  # graph key -> _Scope
        self._scope_lock = threading.Lock()
        self._decisions = None
        self._groups = None  # (graph key, {id: (condition, [bodies])}) while delivering

    @contextlib.contextmanager
    def step(self):
        """Groups one training step's records into one transfer per replica, and times it.

        Inside it, every `observe_*` call (and `watch`) of this step records at one step (the
        next of the step axis; `step=` still overrides it), and what they send from each
        replica's device travels to the host as one vector per replica, at the end of the
        block. The host also times the step: each replica's *ready time*, from the step's start
        to the arrival of its vector (`step_time/replicas`). Enter it in replica context, inside
        the function given to `strategy.run` (every replica enters it), or in cross-replica
        context around `strategy.run`. `ReplicaCallback` puts Keras's train step in one.

        Example:
          ```python
          def step_fn(x, y):
              with probe.step():
                  probe.observe_inputs({"x": x, "y": y})
                  ...  # forward, backward
                  probe.observe_gradients(grads, model.trainable_variables, loss=loss)
                  optimizer.apply_gradients(zip(grads, model.trainable_variables))
          ```
        """
        if not self.build():
            yield
            return
        if self.plain_step:  # `write.variants`: no transfer, only the step axis moves on
            yield
            self._advance_axis()
            return
        key, thread = _graph_key(), threading.get_ident()
        with self._scope_lock:
            scope = self._scopes.get(key)
            if scope is None:
                transfer = transfer_lib.Transfer(self._static["devices"], scope=True)
                scope = self._scopes[key] = _Scope(transfer)
            depth = scope.depth.get(thread, 0)
            scope.depth[thread] = depth + 1
        try:
            yield
        except BaseException:
            with self._scope_lock:
                self._scopes.pop(key, None)
            raise
        with self._scope_lock:
            scope.depth[thread] = depth
        if depth == 0:
            self._close_scope(key, scope)

    def _close_scope(self, key, scope):
        """Delivers the scope's transfer once every replica has left it (a `merge_call` in
        replica context)."""

        def close(strategy=None):
            del strategy
            with self._scope_lock:
                if self._scopes.get(key) is not scope:
                    return  # abandoned (an exception in another replica's step)
                del self._scopes[key]
            self._deliver(scope.transfer)

        self._once_per_step(close)

    def _advance_axis(self):
        """The plain step's one op on the host: the step axis's `assign_add`, once per step."""

        def advance(strategy=None):
            del strategy
            self._axis.variable.assign_add(1, read_value=False)

        self._once_per_step(advance)

    def _once_per_step(self, fn):
        """Runs `fn(strategy=None)` once for the step: through a `merge_call` in replica context
        (after every replica reached it), directly across replicas; a failure warns once."""
        context = tf.distribute.get_replica_context()
        try:
            if context is not None:
                context.merge_call(fn)
            else:
                fn()
        except Exception as error:  # noqa: BLE001 - never break the training it watches
            self.warn_failed("step", error, "the step")

    def transfer(self):
        """Cross-replica context: the open step scope's transfer, or a new one for this call.

        A family puts its per-replica values in it and registers its host handler
        (`Transfer.on_host`), then calls `ship`.
        """
        scope = self._scopes.get(_graph_key())
        if scope is not None:
            return scope.transfer
        return transfer_lib.Transfer(self._static["devices"])

    def ship(self, transfer):
        """Delivers `transfer` now, unless it is a step scope's (delivered at its end)."""
        if not transfer.scope:
            self._deliver(transfer)

    def _deliver(self, transfer):
        """Packs, receives and unpacks `transfer`; calls the families' handlers, then every
        recorder's `delivered` hook (the step time). Its ops are named `tb_replica/...`."""
        with tf.name_scope("tb_replica"):
            delivery = self._receive(transfer)
            if delivery is None:
                return
            self._decisions = {}  # the step decisions, shared by the families while delivering
            self._groups = (_graph_key(), {})
            try:
                for family, handler in transfer.handlers():
                    with tf.name_scope(family.replace("/", "_")):
                        try:
                            handler(delivery)
                        except Exception as error:  # noqa: BLE001 - the other families go on
                            self.warn_failed(family, error)
                self._tell_recorders("delivered", delivery)
                self._run_groups()
            finally:
                self._decisions = None
                self._groups = None

    def when(self, condition, body):
        """Runs `body()` (for its writes and assigns) where the bool tensor `condition` holds.

        While a transfer is delivered, the bodies given in the step's own graph wait for the end
        of the delivery, where those of one condition (the same tensor: a shared decision such
        as `gated(logged(step))`) share one `tf.cond`, in the order they came: one branch to
        trace for every family's writes at a logged step. Elsewhere (inside a branch, eagerly,
        outside a delivery) it is `run_if`. A body must not read state that the delivery
        changes after it was given (the families' bodies read tensors computed before, or their
        own state).

        Args:
          condition: a bool scalar tensor, or a Python bool.
          body: a function of no arguments; its return value is ignored.
        """
        groups = self._groups
        if (
            groups is None
            or isinstance(condition, bool)
            or tf.executing_eagerly()
            or groups[0] != _graph_key()
        ):
            run_if(condition, body)
            return
        groups[1].setdefault(id(condition), (condition, []))[1].append(body)

    def _run_groups(self):
        """One `tf.cond` per condition given to `when` during this delivery."""
        _, groups = self._groups
        self._groups = None  # the bodies' own `when` calls run in their branch, at once
        for condition, bodies in groups.values():

            def run(bodies=bodies):
                for body in bodies:
                    body()

            try:
                run_if(condition, run)
            except Exception as error:  # noqa: BLE001 - never break the training
                self.warn_failed("step", error, "the step's writes")

    def _receive(self, transfer):
        """The `Delivery` of `transfer`: its vectors built, received, stacked and, for a step
        scope, timed; the scope's step taken from the axis. None when the replicas' layouts
        differ (warned once)."""
        layout = transfer_lib.common_layout(transfer)
        if layout is None:
            self.warn_once(
                "layout",
                "tb_replica_plugin: the replicas' values differ in layout at this step; it is "
                "not recorded",
            )
            return None
        slots, words = layout
        timed = transfer.scope and words > 0
        start = transfer_lib.step_start() if timed else None
        matrix = stamps = None
        if words:
            vectors = []
            for index, packet in enumerate(transfer.packets):
                with tf.name_scope(f"pack_{index}"):
                    vectors.append(packet.vector(slots))
            matrix, stamps = transfer_lib.receive(vectors, timed)
        step = None
        if transfer.scope:
            # After the vectors arrived: a call that fails before its step ran (the end of a
            # dataset of unknown length) leaves the axis as it was.
            with tf.control_dependencies([] if matrix is None else [matrix]):
                step = self._axis.scope_step()
        slots = {slot.key: slot for slot in slots}
        return transfer_lib.Delivery(transfer, slots, matrix, step, start, stamps)

    def step_of(self, delivery, caller, step=None):
        """The step a record of `caller` in `delivery` is at (int64 scalar tensor): `step` when
        given, else the scope's step, else the axis's rule for a call outside a scope
        (`write.steps`). Remembered in `delivery.cache["steps"]` per caller."""
        if step is not None:
            value = tf.cast(step, tf.int64)
        elif delivery.step is not None:
            value = delivery.step
        else:
            matrix = delivery.matrix  # as the scope's step: after the values arrived
            with tf.control_dependencies([] if matrix is None else [matrix]):
                value = self._axis.caller_step(caller)
        delivery.cache.setdefault("steps", {})[caller] = value
        return value

    def _decision(self, name, step, compute):
        """`compute()` once per step tensor while a transfer is delivered (the families share
        it); afresh elsewhere."""
        decisions = self._decisions
        if decisions is None or tf.executing_eagerly():
            return compute()
        key = (name, id(step), _graph_key())  # a value made in a branch stays in it
        if key not in decisions or decisions[key][0] is not step:
            decisions[key] = (step, compute())
        return decisions[key][1]
