"""Variables family, Keras `fit` side: which variables `ReplicaCallback` checks, and its epoch-end
check. No TensorFlow import of its own (the probe's methods do the work)."""


def fit_variables(model):
    """Every variable of a Keras model and of its optimizer, once each, in a stable order.

    Args:
      model: a Keras 3 or tf_keras model (built).

    Returns:
      A list: `model.variables` (trainable and non-trainable, e.g. BatchNorm moving statistics)
      then the optimizer's variables (iterations, slots).
    """
    seen = set()
    result = []
    optimizer = getattr(model, "optimizer", None)
    optimizer_variables = getattr(optimizer, "variables", None)
    if callable(optimizer_variables):  # tf_keras legacy optimizers: a method
        optimizer_variables = optimizer_variables()
    for variable in list(model.variables) + list(optimizer_variables or []):
        if id(variable) not in seen:
            seen.add(id(variable))
            result.append(variable)
    return result


def observe_at_epoch_end(probe, model, exact, budget=None):
    """Host side: the full drift check once, at the last step of the epoch (never raises).

    Args:
      probe: the callback's `ReplicaProbe`.
      model: the Keras model being fitted.
      exact: also run the exact check.
      budget: None (`update_freq="epoch"`: the epoch's only check), or the budget of the
        rotating checks in the steps: then the full check runs only when they rotate, shares
        their plan (and placement event) and replaces the step's slice when read.
    """
    try:
        step = probe.last_step()
        if step is None:
            return
        variables = fit_variables(model)
        if budget is None:
            probe.observe_variables(variables, step=step, exact=exact)
            return
        recorder = probe.recorder("variables")
        if recorder.rotates(variables, exact, budget):
            recorder.check_whole(variables, step, budget)
    except Exception as error:  # noqa: BLE001 - never break the training
        probe.warn_variables_failed(error)
