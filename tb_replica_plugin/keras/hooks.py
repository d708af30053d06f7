"""The hooks `ReplicaCallback` installs on a Keras model and its optimizer, and `Fit`, through
which each family's fit-time code (`Recorder.fit_step`, `fit_begin`, `fit_epoch_begin`,
`fit_epoch_end`) installs them: this module names no family.

Each hook is a small function that wraps one method of one *instance* (the model's
`compute_loss`, the optimizer's `apply_gradients` and `apply`) and returns how to undo it, so the
model is put back as it was when training ends or fails. The optimizer all-reduces inside
`apply_gradients`/`apply`, so the gradient hook sees each replica's local gradients, in replica
context, also when a model overrides `train_step` and calls the optimizer itself. Keras 3 and
tf_keras differ only where `compat` says.
"""

import threading

import tensorflow as tf

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


class Fit:
    """One instrumented `fit` as the families' fit-time code sees it (`Recorder.fit_step`, ...).

    Args:
      callback: the `ReplicaCallback` (its probe built).
      model: the Keras model it instruments.
      undo: the list the hooks' undo functions are appended to (the callback undoes them, last
        first, when training ends or fails).

    Attributes:
      model: the model.
      probe: the callback's `ReplicaProbe`.
      options: the callback, whose arguments are the families' options (`gradients`, `rng`,
        `generators`, `examples`, `variables`, `variables_exact`, `variables_budget`,
        `outputs`, `update_freq`: "epoch" or an integer).
      batches: a `LossCapture` holding each replica's named batch of the step being traced (the
        gradients family's culprit capture takes it).
    """

    def __init__(self, callback, model, undo):
        self.model = model
        self.probe = callback.probe
        self.options = callback
        self.batches = callback._batches  # noqa: SLF001 - kept by the callback across its fits
        self._undo = undo

    @property
    def steps_per_epoch(self):
        """Steps of an epoch as Keras's `params` says (None: unknown)."""
        return (self.options.params or {}).get("steps")

    def capture_loss(self):
        """Hooks the model's `compute_loss` to capture each replica's loss: a `LossCapture`."""
        capture = LossCapture()
        self._undo.append(hook_compute_loss(self.model, capture))
        return capture

    def capture_outputs(self):
        """Hooks the model's `compute_loss` to capture each replica's `y_pred`: a `LossCapture`,
        or None when the model has no `compute_loss`."""
        if not callable(getattr(self.model, "compute_loss", None)):
            return None
        capture = LossCapture()
        self._undo.append(hook_model_outputs(self.model, capture))
        return capture

    def optimizer(self):
        """The model's optimizer if gradients can be hooked on it (`apply_gradients`), else None."""
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None or not hasattr(optimizer, "apply_gradients"):
            return None
        return optimizer

    def hook_optimizer(self, observe):
        """`hook_optimizer(self.optimizer(), observe)`, undone when training ends."""
        self._undo.append(hook_optimizer(self.optimizer(), observe))

    def optimizer_info(self):
        """`compat.optimizer_info` of the model's optimizer (its loss scaling)."""
        return compat.optimizer_info(self.optimizer())

    def keras_loss(self):
        """Whether the model's `compute_loss` is its Keras flavour's own
        (`uses_keras_compute_loss`)."""
        return uses_keras_compute_loss(self.model)

    @staticmethod
    def take(capture):
        """What `capture` holds for the step being traced (None: nothing, or another graph's)."""
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        return capture.take(graph)
