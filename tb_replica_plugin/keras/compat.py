"""Keras 3 / tf_keras (Keras 2) adapters: the few places where the two differ for this plugin.

The callback and the collectors are written once; this module answers the questions whose answer
depends on the Keras flavour or on the strategy:

- which `Callback` base class `ReplicaCallback` derives from (`callback_bases`), and what it needs
  so that the *other* flavour's `fit` accepts it too (`TfKerasCallbackHooks`);
- reading a Keras or TensorFlow variable as a Python int (`read_int`);
- which optimizer entry point runs in replica context with the *local* gradients, whether those
  gradients are still loss-scaled there, and how `optimizer.iterations` moves on a skipped
  overflow step (`optimizer_info`, `wrap_apply_gradients`), for gradient collectors;
- which strategies `fit` can be instrumented under (`strategy_refusal`).

Which Keras `tf.keras` means is decided by TensorFlow from `TF_USE_LEGACY_KERAS` ("1", "true" or
"True": `tf_keras`; anything else: Keras 3). This module follows the same rule and never imports
`tf_keras` unless that variable selects it, so Keras 3 users do not need it installed.
"""

import os

import tensorflow as tf

KERAS_3 = "keras3"
TF_KERAS = "tf_keras"
LEGACY_ENV = "TF_USE_LEGACY_KERAS"


def legacy_keras_selected():
    """Whether `tf.keras` is `tf_keras` in this process (TensorFlow's own rule).

    Returns:
      True when the environment variable `TF_USE_LEGACY_KERAS` is "1", "true" or "True".
    """
    return os.environ.get(LEGACY_ENV) in ("1", "true", "True")


def keras_module():
    """The Keras package `tf.keras` resolves to: `tf_keras` or Keras 3 (`keras`).

    Unlike `tf.keras`, falls back to Keras 3 when `TF_USE_LEGACY_KERAS` asks for `tf_keras` but
    it is not installed (a user training with `import keras` then still gets a callback).

    Returns:
      The imported module.
    """
    if legacy_keras_selected():
        try:
            import tf_keras

            return tf_keras
        except ImportError:
            pass
    import keras

    return keras


def callback_bases():
    """The base classes of `ReplicaCallback`: the selected flavour's `Callback`, and, on Keras 3,
    `TfKerasCallbackHooks` so that tf_keras's `fit` accepts it too.

    Returns:
      A tuple of classes.
    """
    module = keras_module()
    if module.__name__ == "tf_keras":
        return (module.callbacks.Callback,)
    return (TfKerasCallbackHooks, module.callbacks.Callback)


class TfKerasCallbackHooks:
    """What tf_keras's `CallbackList` asks of every callback that a Keras 3 `Callback` lacks.

    Mixed into `ReplicaCallback` so that a callback built on Keras 3's base (no
    `TF_USE_LEGACY_KERAS`) still works in `tf_keras` `fit` when the user imports `tf_keras`
    directly. The callback has no batch hooks, so tf_keras skips calling them. Keras 3's
    `CallbackList` duck-types its callbacks, so a tf_keras-based callback needs nothing extra.
    """

    _supports_tf_logs = False
    _chief_worker_only = None

    def _implements_train_batch_hooks(self):
        return False

    def _implements_test_batch_hooks(self):
        return False

    def _implements_predict_batch_hooks(self):
        return False


def flavour_of(obj):
    """Which Keras an object (model, optimizer, layer) belongs to, from its class hierarchy.

    Args:
      obj: a Keras object.

    Returns:
      `TF_KERAS`, `KERAS_3`, or None when no class in its hierarchy comes from either package.
    """
    for cls in type(obj).__mro__:
        module = cls.__module__ or ""
        if module == "tf_keras" or module.startswith("tf_keras."):
            return TF_KERAS
        if module == "keras" or module.startswith("keras."):
            return KERAS_3
    return None


def build_optimizer_before_trace(model):
    """tf_keras: creates the optimizer's slot variables before `fit` traces the train step.

    tf_keras creates them inside the first trace of the step (its optimizer's `apply_gradients`
    builds itself from the variables it is given), and `tf.function` traces a function that
    created variables a second time, so the first `fit` of a tf_keras model traces its step
    twice (Keras 3 builds the optimizer before tracing). The optimizer's own `build` with
    `model.trainable_variables` creates exactly what that first step would, so the instrumented
    step is traced once. Done only where `fit` itself would pass that list: the model's own
    `train_step` (not overridden), a built model and a tf_keras optimizer not built yet.

    Args:
      model: the model `fit` is about to train.

    Returns:
      True when the optimizer was built here.
    """
    if flavour_of(model) != TF_KERAS:
        return False
    import tf_keras

    optimizer = getattr(model, "optimizer", None)
    if (
        getattr(type(model), "train_step", None) is not tf_keras.Model.train_step
        or not getattr(model, "built", False)
        or not isinstance(optimizer, tf_keras.optimizers.Optimizer)
        or getattr(optimizer, "_built", False)
    ):
        return False
    variables = model.trainable_variables
    if not variables:
        return False
    with model.distribute_strategy.scope():
        optimizer.build(variables)
    return True


def read_int(variable):
    """Reads a scalar Keras 3 variable, `tf.Variable` or tensor as a Python int (host side).

    Args:
      variable: e.g. `optimizer.iterations` (a Keras 3 `Variable` wrapping a `tf.Variable`, or
        in tf_keras a `tf.Variable`, possibly mirrored).

    Returns:
      The int value.
    """
    return int(tf.convert_to_tensor(variable).numpy())


def optimizer_iterations(model):
    """The model optimizer's step counter as an int, or None without an optimizer.

    Args:
      model: a compiled Keras 3 or tf_keras model.

    Returns:
      `model.optimizer.iterations` read on the host, or None.
    """
    iterations = getattr(getattr(model, "optimizer", None), "iterations", None)
    return None if iterations is None else read_int(iterations)


def steps_per_execution(model):
    """How many steps one call of the model's train function runs (host side; 1 if unknown).

    Keras 3 keeps it as the int `model.steps_per_execution`; tf_keras as the variable
    `model._steps_per_execution`.
    """
    value = getattr(model, "steps_per_execution", None)
    if value is None:
        value = getattr(model, "_steps_per_execution", None)
    try:
        return max(1, read_int(value)) if value is not None else 1
    except (TypeError, ValueError):
        return 1


# ----------------------------------------------------------------------------- optimizers


class OptimizerInfo:
    """How one optimizer sees the local gradients of a step, for gradient collectors.

    Both flavours' `train_step` call `optimizer.apply_gradients(grads_and_vars, ...)` in replica
    context with the replica's *local* gradients; the all-reduce (SUM over replicas) happens
    inside it. What differs:

    - Keras 3 (`keras.optimizers.LossScaleOptimizer`): `train_step` scales the loss with
      `optimizer.scale_loss`, so the gradients reaching `apply_gradients` are still scaled; the
      optimizer divides them by `dynamic_scale` inside `apply`. On an overflow step it skips the
      inner optimizer, and `iterations` (the inner optimizer's) does not move.
    - tf_keras (`LossScaleOptimizerV3`): `train_step` calls `minimize`, whose
      `compute_gradients` scales the loss and already unscales the gradients, so those reaching
      `apply_gradients` are unscaled; `iterations` moves on overflow steps too.

    Attributes:
      flavour: `KERAS_3` or `TF_KERAS` (None if unknown).
      loss_scaled: whether this is a loss-scale optimizer.
      grads_scaled_at_apply: whether gradients given to `apply_gradients` still carry the loss
        scale (divide them by `loss_scale()` to compare with a float32 model).
      iterations_count_skipped_steps: whether `iterations` moves on an overflow step that the
        loss-scale optimizer skips.
    """

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.flavour = flavour_of(optimizer)
        if self.flavour == KERAS_3:
            self.loss_scaled = hasattr(optimizer, "inner_optimizer") and hasattr(
                optimizer, "initial_scale"
            )
        else:
            self.loss_scaled = hasattr(optimizer, "get_unscaled_gradients")
        self.grads_scaled_at_apply = self.loss_scaled and self.flavour == KERAS_3
        self.iterations_count_skipped_steps = self.flavour != KERAS_3 or not self.loss_scaled

    def loss_scale(self):
        """The current loss scale as a float32 tensor (1.0 without loss scaling).

        Read when called (in-graph in a step): Keras 3 creates `dynamic_scale` only when the
        optimizer is built and, like its own `scale_loss`, uses `initial_scale` until then.

        Returns:
          A scalar float32 tensor.
        """
        if not self.loss_scaled:
            return tf.constant(1.0, tf.float32)
        optimizer = self.optimizer
        if self.flavour == KERAS_3:
            scale = optimizer.dynamic_scale if optimizer.built else optimizer.initial_scale
        else:
            scale = optimizer.loss_scale
        return tf.cast(tf.convert_to_tensor(scale), tf.float32)

    def unscale(self, grads):
        """The local gradients given to `apply_gradients`, without the loss scale.

        Args:
          grads: list of gradient tensors (None allowed), as received by `apply_gradients`.

        Returns:
          The list, divided by the loss scale when they still carry it, else unchanged.
        """
        if not self.grads_scaled_at_apply:
            return list(grads)
        scale = self.loss_scale()
        return [None if g is None else g / tf.cast(scale, g.dtype) for g in grads]


def optimizer_info(optimizer):
    """Describes how `optimizer` handles local gradients (see `OptimizerInfo`).

    Args:
      optimizer: a Keras 3 or tf_keras optimizer, possibly a loss-scale optimizer.

    Returns:
      An `OptimizerInfo`.
    """
    return OptimizerInfo(optimizer)


def wrap_apply_gradients(optimizer, hook):
    """Calls `hook` with the local, unscaled gradients before every `apply_gradients`.

    The wrapper is an instance attribute on `optimizer` (so `Model.train_step` of either flavour
    picks it up when the train function is traced); `restore` removes it. `hook(grads, variables,
    info)` runs in replica context, before the all-reduce, and must not raise (wrap it in its own
    try/except): it gets the gradients divided by the loss scale where they still carry it.

    Args:
      optimizer: the model's optimizer (the outer loss-scale optimizer under mixed precision).
      hook: a callable `(grads, variables, info)`; `info` is this optimizer's `OptimizerInfo`.

    Returns:
      A zero-argument `restore` callable.
    """
    info = optimizer_info(optimizer)
    had_own = "apply_gradients" in optimizer.__dict__
    own = optimizer.__dict__.get("apply_gradients")
    original = optimizer.apply_gradients

    def apply_gradients(grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        hook(info.unscale(grads), variables, info)
        return original(grads_and_vars, *args, **kwargs)

    optimizer.apply_gradients = apply_gradients

    def restore():
        if had_own:
            optimizer.apply_gradients = own
        else:
            optimizer.__dict__.pop("apply_gradients", None)

    return restore


# ----------------------------------------------------------------------------- strategies


def strategy_refusal(strategy, model=None):
    """Why `fit` under `strategy` cannot be instrumented, or None when it can.

    Args:
      strategy: the model's `tf.distribute.Strategy`.
      model: the model (under `ParameterServerStrategy`, a tf_keras model is instrumented:
        `keras.pss_fit`).

    Returns:
      A one-sentence reason for the user, or None.
    """
    name = type(strategy).__name__
    if name.startswith("ParameterServerStrategy") and flavour_of(model) != TF_KERAS:
        return (
            f"{name} is not supported in Keras 3's fit (Keras 3 has no fit under this "
            "strategy): use tf_keras (pip install tf-keras, TF_USE_LEGACY_KERAS=1) with a "
            "DatasetCreator, or a custom loop with probe.schedule (docs/parameter-server.md)"
        )
    if name.startswith("TPUStrategy"):
        return (
            f"{name} is not supported: the step runs XLA-compiled on the TPU, where the "
            "probe's string formatting and summary writes cannot run"
        )
    return None
