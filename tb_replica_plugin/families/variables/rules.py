"""Findings of the variables family (weight drift and placement):

- `variable_drift` (error for a trainable variable, warning for a non-trainable one): a copy's
  relative L2 distance from replica 0's copy exceeds `Thresholds.variable_drift_rel_l2`.
- `per_replica_statistics` (info): BatchNormalization moving statistics (non-trainable
  `moving_mean` / `moving_variance`) differ across replicas: Keras 3 updates them per replica by
  the layer's design. Recognised by name, whatever the size of the difference.
- `variable_bits_differ` (info): copies are not bit-identical but stay within that tolerance.

Findings of one kind and cause (e.g. every BatchNormalization layer, every trainable variable of a
skipped all-reduce) are grouped into one by `analysis.group_findings` with `group_message`.
- `variable_not_mirrored` (warning): a variable has no copy on some replica device (not raised
  under CentralStorageStrategy or ParameterServerStrategy, which keep one copy on purpose).
- `ps_imbalance` (warning): under ParameterServerStrategy one parameter server holds far more than
  its share of the variable bytes (`ps_balance.py`).

Pure Python and numpy.
"""

import numpy as np

from tb_replica_plugin.analysis import (
    Finding,
    Thresholds,
    names_text,
    sort_findings,
)
from tb_replica_plugin.core.downsample import nanmax
from tb_replica_plugin.families.variables import ps_balance

FINDING_KINDS = {
    "variable_drift": {
        "severity": "error",
        "thresholds": ("variable_drift_rel_l2",),
        "summary": (
            "A copy of a variable drifted from replica 0's copy (warning for a non-trainable "
            "variable)."
        ),
    },
    "per_replica_statistics": {
        "severity": "info",
        "thresholds": (),
        "summary": (
            "BatchNormalization moving statistics differ across replicas: Keras 3 updates them "
            "from each replica's own shard."
        ),
    },
    "variable_bits_differ": {
        "severity": "info",
        "thresholds": ("variable_drift_rel_l2",),
        "summary": (
            "Copies of a variable are not bit-identical but stay within the drift tolerance."
        ),
    },
    "variable_not_mirrored": {
        "severity": "warning",
        "thresholds": (),
        "summary": ("A variable has no copy on some replica device."),
    },
    **ps_balance.FINDING_KINDS,
}


def _replica_list(replicas, columns):
    names = ", ".join(str(replicas[c]) for c in columns)
    return f"replica{'s' if len(columns) > 1 else ''} {names}"


MOVING_STATISTICS = ("moving_mean", "moving_variance")

_CAUSE_TEXT = {
    ("variable_drift", "not_all_reduced"): (
        "the replicas applied different updates: gradients not all-reduced (updates applied "
        "per replica or on `.values`) or an update in replica context without aggregation. "
        "Apply gradients with optimizer.apply_gradients inside strategy.run (or strategy.reduce "
        "them first); a saved model keeps replica 0's copy only."
    ),
    ("variable_drift", "non_trainable_per_replica"): (
        "a non-trainable variable was updated from each replica's local values without "
        "cross-replica aggregation; aggregate the update (e.g. strategy.extended.update, or "
        "create it with synchronization=ON_READ if each replica should keep its own value), "
        "since a saved model keeps replica 0's copy only."
    ),
    ("per_replica_statistics", "bn_moving_statistics"): (
        "Keras 3 BatchNormalization updates its moving mean and variance in each replica from "
        "that replica's own shard (no cross-replica aggregation), so the copies differ and a "
        "saved model keeps replica 0's: inference uses statistics from 1/N of the data. That "
        "is usually harmless with large per-replica batches of i.i.d. data; to aggregate them, "
        "use BatchNormalization(synchronized=True), or accept it."
    ),
    ("variable_bits_differ", "within_tolerance"): (
        "typical of non-deterministic kernels or devices of different types; enable "
        "tf.config.experimental.enable_op_determinism() if replicas must match exactly."
    ),
}


def _layer(name):
    return name.rsplit("/", 1)[0] if "/" in name else name


def _is_moving_statistic(variable):
    return not variable.get("trainable", True) and variable["name"].rsplit("/", 1)[-1] in (
        MOVING_STATISTICS
    )


def group_message(kind, cause, items):
    """The message of a group of findings of one kind and cause (see `analysis.group_findings`).

    Args:
      kind: the findings' kind.
      cause: their `cause`.
      items: the findings (at least 2).

    Returns:
      One message naming how many and which, with the cause and the fix.
    """
    first = min(f.first_step for f in items)
    replicas = _replica_text(sorted({r for f in items for r in f.replicas}))
    worst = max(f.value for f in items if f.value is not None)
    names = [f.name for f in items]
    if kind == "per_replica_statistics":
        layers = list(dict.fromkeys(_layer(n) for n in names))
        head = (
            f"{len(layers)} BatchNormalization layer{'s' if len(layers) > 1 else ''} "
            f"({names_text(layers)}) keep per-replica moving statistics ({len(items)} "
            f"variables differ on {replicas} from step {first}, relative L2 up to {worst:.3g}): "
        )
    elif kind == "variable_not_mirrored":
        return (
            f"{len(items)} variables ({names_text(names)}) are not mirrored: {replicas} read "
            "them across devices and their updates are not synchronised; create them inside "
            "strategy.scope()."
        )
    else:
        what = {
            "not_all_reduced": "trainable variables",
            "non_trainable_per_replica": "non-trainable variables",
        }.get(cause, "variables")
        verb = "differ from" if kind == "variable_drift" else "are not bit-identical to"
        head = (
            f"{len(items)} {what} ({names_text(names)}) on {replicas} {verb} replica 0 from "
            f"step {first} (relative L2 up to {worst:.3g}): "
        )
    return head + _CAUSE_TEXT.get((kind, cause), items[0].message)


def _replica_text(replicas):
    return f"replica{'s' if len(replicas) > 1 else ''} {', '.join(str(r) for r in replicas)}"


def _span(series, mask, rel, base):
    """Finding fields of the steps and replicas where `mask` [steps, replicas] holds, plus
    `where` (the replicas as text, for the message)."""
    rows = np.flatnonzero(mask.any(axis=1))
    columns = [int(c) for c in np.flatnonzero(mask.any(axis=0))]
    return dict(
        base,
        first_step=int(series.steps[rows[0]]),
        last_step=int(series.steps[rows[-1]]),
        count=int(rows.size),
        replicas=[series.replicas[c] for c in columns],
        value=round(float(nanmax(np.where(mask, rel, np.nan))), 12),
        where=_replica_list(series.replicas, columns),
    )


def _seen_late(series, index, row):
    """`" (first seen at a rotating check: ...)"` when the check at `row` read part of
    variable `index` (`VariablesSeries.coverage`), else ""."""
    coverage = series.coverage[row, index]
    if coverage >= 1.0:
        return ""
    period = (series.rotation or {}).get("period")
    within = f"up to {period} logged steps" if period else "some logged steps"
    return (
        f" (first seen at a rotating check that read {coverage:.0%} of it: the copies "
        f"may have diverged {within} earlier)"
    )


def _drift_finding(series, index, variable, thresholds):
    """`variable_drift` or `variable_bits_differ` of one variable, or None."""
    rel = series.rel_l2[:, index, :]
    with np.errstate(invalid="ignore"):
        above = rel > thresholds.variable_drift_rel_l2
    # Bit identity is known only between copies hashed by the same algorithm.
    differ = ~series.identical[:, index, :] & series.hash_comparable[index]
    name = variable["name"]
    base = dict(run=series.run, name=name, view="drift")
    if _is_moving_statistic(variable) and (above.any() or differ.any()):
        span = _span(series, above | differ, rel, base)
        return Finding(
            kind="per_replica_statistics",
            severity="info",
            threshold=None,
            message=(
                f"BatchNormalization statistic '{name}' on {span.pop('where')} differs from "
                f"replica 0 from step {span['first_step']} (relative L2 up to "
                f"{span['value']:.3g}): "
                + _CAUSE_TEXT[("per_replica_statistics", "bn_moving_statistics")]
            ),
            cause="bn_moving_statistics",
            **span,
        )
    if above.any():
        return _above_tolerance(series, index, variable, above, thresholds, base)
    if differ.any():
        span = _span(series, differ, rel, base)
        return Finding(
            kind="variable_bits_differ",
            severity="info",
            threshold=thresholds.variable_drift_rel_l2,
            message=(
                f"Variable '{name}' on {span.pop('where')} is not bit-identical to replica 0 "
                f"from step {span['first_step']}, within tolerance (relative L2 up to "
                f"{span['value']:.3g}): "
                + _CAUSE_TEXT[("variable_bits_differ", "within_tolerance")]
            ),
            cause="within_tolerance",
            **span,
        )
    return None


def _above_tolerance(series, index, variable, above, thresholds, base):
    """The `variable_drift` finding of a variable whose copies differ beyond the tolerance at
    the `above` [steps, replicas] cells: an error for a trainable variable, else a warning."""
    rel = series.rel_l2[:, index, :]
    rows = np.flatnonzero(above.any(axis=1))
    columns = [int(c) for c in np.flatnonzero(above.any(axis=0))]
    first, last = int(series.steps[rows[0]]), int(series.steps[rows[-1]])
    worst = float(nanmax(np.where(above, rel, np.nan)))
    max_abs = float(nanmax(np.where(above, series.max_abs[:, index, :], np.nan)))
    exact = bool(series.exact[rows].all())
    abs_text = (
        f"max |difference| {max_abs:.3g}"
        if exact
        else f"max |difference| at least {max_abs:.3g} (bound from the fingerprints; "
        "run the exact check for the true value)"
    )
    head = (
        f"Variable '{variable['name']}' on {_replica_list(series.replicas, columns)} differs "
        f"from replica 0 from step {first}{_seen_late(series, index, rows[0])} (relative L2 up "
        f"to {worst:.3g}, {abs_text}); "
    )
    trainable = variable.get("trainable", True)
    cause = "not_all_reduced" if trainable else "non_trainable_per_replica"
    return Finding(
        kind="variable_drift",
        severity="error" if trainable else "warning",
        first_step=first,
        last_step=last,
        count=int(rows.size),
        replicas=[series.replicas[c] for c in columns],
        value=round(worst, 9),
        threshold=thresholds.variable_drift_rel_l2,
        message=head + _CAUSE_TEXT[("variable_drift", cause)],
        cause=cause,
        **base,
    )


def find_variables(series, thresholds=Thresholds()):
    """Findings of the variables family (weight drift and placement) for one run.

    Args:
      series: a `read.VariablesSeries` (or None: no findings).
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding`, most severe first.

    Example:
      >>> [(f.kind, f.name) for f in find_variables(series)]   # gradients not all-reduced
      [('variable_drift', 'dense/kernel'), ('variable_drift', 'dense/bias')]
    """
    if series is None:
        return []
    findings = []
    placement_step = int(series.placement_events[-1][0]) if series.placement_events else 0
    last_step = int(series.steps[-1]) if series.steps.size else placement_step
    for index, variable in enumerate(series.variables):
        if not variable.get("mirrored", True) and not series.central_storage:
            missing = [c for c in range(series.num_replicas) if not series.present[index, c]]
            devices = ", ".join(variable.get("devices", [])) or "no device"
            findings.append(
                Finding(
                    kind="variable_not_mirrored",
                    severity="warning",
                    run=series.run,
                    first_step=placement_step,
                    last_step=last_step,
                    count=1,
                    replicas=[series.replicas[c] for c in missing],
                    name=variable["name"],
                    value=len(variable.get("devices", [])),
                    threshold=series.num_replicas,
                    message=(
                        f"Variable '{variable['name']}' is not mirrored: its only cop"
                        f"{'ies are' if len(variable.get('devices', [])) > 1 else 'y is'} on "
                        f"{devices}, so {_replica_list(series.replicas, missing)} read it across "
                        "devices and their updates are not synchronised; create it inside "
                        "strategy.scope()."
                    ),
                    view="placement",
                    cause="not_mirrored",
                )
            )
        if variable.get("sync") == "on_read":
            continue  # each replica keeps its own value on purpose (e.g. metric accumulators)
        finding = _drift_finding(series, index, variable, thresholds)
        if finding is not None:
            findings.append(finding)
    findings.extend(ps_balance.find(series))
    return sort_findings(findings)


def find(run_data, thresholds=Thresholds()):
    """Findings of the variables family of a `reader.RunData` (none without variables)."""
    return find_variables(run_data.variables, thresholds)
