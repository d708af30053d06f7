"""Variables family, Keras `fit` side (`Recorder.fit_step`, `fit_begin`, `fit_epoch_end`): which
variables `ReplicaCallback` checks, the check in its steps and the full check at epoch ends. No
TensorFlow import of its own (the probe's methods do the work)."""


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


def observe_at_epoch_end(probe, model, exact, budget=None, spacing=None, last=None, final=False):
    """Host side: the full drift check at the last step of an epoch, if one is due (never raises).

    Args:
      probe: the callback's `ReplicaProbe`.
      model: the Keras model being fitted.
      exact: also run the exact check.
      budget: None (`update_freq="epoch"`: the epoch ends' checks are the only ones), or the
        budget of the rotating checks in the steps: then the full check runs only when they
        rotate, shares their plan (and placement event) and replaces the step's slice when read.
      spacing: the `variables_budget` that spaces the full checks: at least P steps apart, P the
        rotation period it gives (`Recorder.period`; MobileNetV2 and Adam: 321 at the default
        budget, the README's MLP: 8). None: every epoch end checks.
      last: the step of this fit's last full check, or the step before its first step while
        there is none (None: check now, whatever `spacing`).
      final: the end of training: check if any step came after `last`, however few.

    Returns:
      The step of the last full check: this one's, else `last`.
    """
    try:
        step = probe.step_axis.current()
        if step is None or (last is not None and step <= last):
            return last
        variables = fit_variables(model)
        recorder = probe.recorder("variables")
        if budget is not None and not recorder.rotates(variables, exact, budget):
            return last  # every logged step checks every element
        early = not final and last is not None
        if early and step - last < recorder.period(variables, exact, spacing):
            return last  # at least P steps between full checks
        if budget is None:
            probe.observe_variables(variables, step=step, exact=exact)
        else:
            recorder.check_whole(variables, step, budget)
        return step
    except Exception as error:  # noqa: BLE001 - never break the training
        probe.warn_variables_failed(error)
        return last


def step_observer(fit):
    """The `after()` of the train step: the drift check of the logged steps (a merge_call from
    replica context, under a `tf.cond` every N steps), or None with `update_freq="epoch"` or
    `variables=False`.

    Args:
      fit: the callback's `keras.hooks.Fit`.
    """
    options = fit.options
    if not options.variables or options.update_freq == "epoch":
        return None
    probe, model = fit.probe, fit.model
    exact = options.variables_exact
    budget = None if exact else options.variables_budget

    def after():
        try:
            variables = fit_variables(model)
        except Exception as error:  # noqa: BLE001 - never break the training
            probe.warn_variables_failed(error)
        else:
            probe.observe_variables(variables, exact=exact, budget=budget)

    return after


def check_whole(recorder, fit, final=False):
    """The host-side full drift check at an epoch end, at most one per P steps (P: the rotation
    period of `variables_budget`), and at the end of training if steps came after the last one.
    Only with `update_freq="epoch"` or rotating checks in the steps.

    Args:
      recorder: the variables family's `Recorder` (its `whole_checked_at` is updated).
      fit: the callback's `keras.hooks.Fit`.
      final: the end of training.
    """
    options = fit.options
    if not options.variables:
        return
    if options.update_freq == "epoch":
        exact, budget = options.variables_exact, None
    elif options.variables_budget is not None and not options.variables_exact:
        exact, budget = False, options.variables_budget  # and the steps' slices rotate
    else:
        return  # every logged step checks every element
    recorder.whole_checked_at = observe_at_epoch_end(
        fit.probe,
        fit.model,
        exact,
        budget,
        spacing=options.variables_budget,
        last=recorder.whole_checked_at,
        final=final,
    )
