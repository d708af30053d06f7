"""The hooks `ReplicaCallback` installs on a Keras model and its optimizer, and the per-family
observers of its train step.

Each hook is a small function that wraps one method of one *instance* (the model's
`compute_loss`, the optimizer's `apply_gradients` and `apply`) and returns how to undo it, so the
model is put back as it was when training ends or fails. The optimizer all-reduces inside
`apply_gradients`/`apply`, so the gradient hook sees each replica's local gradients, in replica
context, also when a model overrides `train_step` and calls the optimizer itself. Keras 3 and
tf_keras differ only where `compat` says.
"""

import threading

import tensorflow as tf

from tb_replica_plugin.families.gradients import replica as gradients_replica
from tb_replica_plugin.families.gradients.record import SCALING_AS_GIVEN, SCALING_REPLICA_LOSS
from tb_replica_plugin.families.rng import record as rng_record
from tb_replica_plugin.keras import compat


def _set_instance_attribute(obj, name, value):
    """Sets `obj.name = value` as an instance attribute; returns how to undo it."""
    had_own = name in obj.__dict__
    previous = obj.__dict__.get(name)
    object.__setattr__(obj, name, value)

    def undo():
        if had_own:
            object.__setattr__(obj, name, previous)
        else:
            obj.__dict__.pop(name, None)

    return undo


class LossCapture:
    """The last loss (or `y_pred`) computed on each replica thread (replica functions run in
    threads)."""

    def __init__(self):
        self._local = threading.local()

    def put(self, loss):
        self._local.loss = loss

    def take(self, graph):
        """The captured loss if it belongs to `graph` (the current step's graph), else None."""
        loss = getattr(self._local, "loss", None)
        self._local.loss = None
        if loss is None:
            return None
        first = (tf.nest.flatten(loss) or [None])[0]  # y_pred may be a dict of outputs
        if getattr(first, "graph", graph) is not graph:
            return None
        return loss


def hook_compute_loss(model, capture):
    """Wraps `model.compute_loss` (instance attribute) to hand each replica's loss to `capture`.

    Args:
      model: the Keras model.
      capture: a `LossCapture`.

    Returns:
      A function that undoes the hook.
    """
    original = model.compute_loss

    def compute_loss(*args, **kwargs):
        loss = original(*args, **kwargs)
        capture.put(loss)
        return loss

    return _set_instance_attribute(model, "compute_loss", compute_loss)


def hook_model_outputs(model, capture):
    """Wraps `model.compute_loss` (instance attribute) to hand each replica's `y_pred` to
    `capture` (Keras 3 and tf_keras pass it as the third argument or `y_pred=`).

    Returns:
      A function that undoes the hook.
    """
    original = model.compute_loss

    def compute_loss(*args, **kwargs):
        y_pred = kwargs["y_pred"] if "y_pred" in kwargs else (args[2] if len(args) > 2 else None)
        if y_pred is not None:
            capture.put(y_pred)
        return original(*args, **kwargs)

    return _set_instance_attribute(model, "compute_loss", compute_loss)


def watch_outputs(probe, capture):
    """Watches the outputs this replica's train step computed (`y_pred`) as `outputs`.

    Called after the original step, in replica context; outputs captured in another graph (a
    validation step of the same fit) are ignored.
    """
    try:
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        y_pred = capture.take(graph)
    except Exception as error:  # noqa: BLE001 - never break training
        probe.warn_failed("watch", error, "model outputs")
        return
    if y_pred is not None:
        probe.watch("outputs", y_pred)


def hook_optimizer(optimizer, observe):
    """Wraps `optimizer.apply_gradients` and `optimizer.apply` (instance attributes).

    `observe(grads, variables)` is called once per call from user code, before the original
    method all-reduces the gradients (a call of `apply` from inside `apply_gradients` is not
    observed twice).

    Args:
      optimizer: the Keras optimizer instance.
      observe: a function of `(grads, variables)`; it must not raise.

    Returns:
      A function that undoes the hooks.
    """
    inside = threading.local()
    original_apply_gradients = optimizer.apply_gradients
    original_apply = getattr(optimizer, "apply", None)  # Keras 3; tf_keras optimizers lack it

    def guarded(call, grads, variables):
        if getattr(inside, "busy", False):
            return call()
        observe(grads, variables)
        inside.busy = True
        try:
            return call()
        finally:
            inside.busy = False

    def apply_gradients(grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        return guarded(
            lambda: original_apply_gradients(pairs, *args, **kwargs),
            [g for g, _ in pairs],
            [v for _, v in pairs],
        )

    def apply(grads, trainable_variables=None, *args, **kwargs):
        grads = list(grads)
        variables = trainable_variables
        if variables is None:
            variables = getattr(optimizer, "_trainable_variables", None) or []
        return guarded(
            lambda: original_apply(grads, trainable_variables, *args, **kwargs),
            grads,
            list(variables),
        )

    undo_apply_gradients = _set_instance_attribute(optimizer, "apply_gradients", apply_gradients)
    undo_apply = (
        _set_instance_attribute(optimizer, "apply", apply)
        if callable(original_apply)
        else (lambda: None)
    )

    def undo():
        undo_apply()
        undo_apply_gradients()

    return undo


def uses_keras_compute_loss(model):
    """Whether `model.compute_loss` is its Keras flavour's own (not overridden).

    Both Keras 3 and tf_keras divide the compiled loss by the number of replicas under
    `tf.distribute` there; an override may not.
    """
    flavour = compat.flavour_of(model)
    if flavour == compat.TF_KERAS:
        import tf_keras as module
    elif flavour == compat.KERAS_3:
        import keras as module
    else:
        return False
    return getattr(type(model), "compute_loss", None) is getattr(module.Model, "compute_loss", 0)


def gradient_observer(probe, model, optimizer, capture, batches=None):
    """The `observe` function of `hook_optimizer` for a Keras 3 or tf_keras model.

    Recorded norms are of the gradient of each replica's own loss when the model uses Keras's
    own `compute_loss` (which divides the loss by the replica count under `tf.distribute`): the
    callback multiplies by the replica count and, where the gradients reaching the optimizer
    still carry a loss scale (Keras 3's `LossScaleOptimizer`), divides by it
    (`compat.optimizer_info`). With an overridden `compute_loss`, or no loss seen,
    gradients are recorded as given (divided by that loss scale). `batches` (a `LossCapture`
    fed the step's named batch) gives the batch captured at a fault.
    """
    recorder = probe.recorder("gradients")
    keras_loss = uses_keras_compute_loss(model)
    replicas = model.distribute_strategy.num_replicas_in_sync
    info = compat.optimizer_info(optimizer)

    def observe(grads, variables):
        import tensorflow as tf

        try:
            graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
            # Keras's `loss * (1 / replicas)`: the replica sends the loss before that product,
            # the host applies it (the step no longer computes it for nothing else).
            loss, loss_factor = gradients_replica.constant_factor(capture.take(graph))
            batch = batches.take(graph) if batches is not None else None
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


# Hooks of the train step, one per family; each takes the batch named by `name_fit_batch`.


def inputs_observer(probe):
    return probe.observe_inputs


def examples_observer(probe):
    return probe.observe_examples


def sample_examples_at_epoch_end(probe, steps):
    """Host side, at an epoch's start: the data family also samples the epoch's last step (the
    step written at the epoch end). Unknown epoch length: the last sampled step is written."""
    try:
        if steps:
            probe.recorder("examples").sample_last_of(steps)
    except Exception as error:  # noqa: BLE001 - never break the training
        probe.warn_failed("data", error)


def rng_observer(probe, model, generators):
    """The rng hook, or none when the model uses no generator we can observe.

    It runs before the model's own step so it sees the state each draw of this step starts from.
    """
    sources = [model] if generators is None else [model, generators]
    if not rng_record.find_generators(sources):
        return []
    return [lambda batch: probe.observe_rng(sources)]
