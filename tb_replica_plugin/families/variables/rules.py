"""Findings of the variables family (weight drift and placement):

- `variable_drift` (error for a trainable variable, warning for a non-trainable one): a copy's
  relative L2 distance from replica 0's copy exceeds `Thresholds.variable_drift_rel_l2`.
- `variable_bits_differ` (info): copies are not bit-identical but stay within that tolerance.
- `variable_not_mirrored` (warning): a variable has no copy on some replica device (not raised
  under CentralStorageStrategy, which keeps one copy on purpose).

Pure Python and numpy.
"""

import numpy as np

from tb_replica_plugin.analysis import (
    Finding,
    Thresholds,
    sort_findings,
)

FINDING_KINDS = {
    "variable_drift": {
        "severity": "error",
        "thresholds": ("variable_drift_rel_l2",),
        "summary": (
            "A copy of a variable drifted from replica 0's copy (warning for a non-trainable "
            "variable)."
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
}


def _replica_list(replicas, columns):
    names = ", ".join(str(replicas[c]) for c in columns)
    return f"replica{'s' if len(columns) > 1 else ''} {names}"


def _drift_finding(series, index, variable, thresholds):
    """`variable_drift` or `variable_bits_differ` of one variable, or None."""
    rel = series.rel_l2[:, index, :]
    with np.errstate(invalid="ignore"):
        above = rel > thresholds.variable_drift_rel_l2
    # Bit identity is known only between copies hashed by the same algorithm.
    differ = ~series.identical[:, index, :] & series.hash_comparable[index]
    name = variable["name"]
    base = dict(run=series.run, name=name, view="drift")
    if above.any():
        rows = np.flatnonzero(above.any(axis=1))
        columns = [int(c) for c in np.flatnonzero(above.any(axis=0))]
        first, last = int(series.steps[rows[0]]), int(series.steps[rows[-1]])
        worst = float(np.nanmax(np.where(above, rel, np.nan)))
        max_abs = float(np.nanmax(np.where(above, series.max_abs[:, index, :], np.nan)))
        exact = bool(series.exact[rows].all())
        abs_text = (
            f"max |difference| {max_abs:.3g}"
            if exact
            else f"max |difference| at least {max_abs:.3g} (bound from the fingerprints; "
            "run the exact check for the true value)"
        )
        head = (
            f"Variable '{name}' on {_replica_list(series.replicas, columns)} differs from "
            f"replica 0 from step {first} (relative L2 up to {worst:.3g}, {abs_text}); "
        )
        if variable.get("trainable", True):
            cause = (
                "the replicas applied different updates: gradients not all-reduced (updates "
                "applied per replica or on `.values`) or an update in replica context without "
                "aggregation. Apply gradients with optimizer.apply_gradients inside "
                "strategy.run (or strategy.reduce them first); a saved model keeps replica 0's "
                "copy only."
            )
        else:
            cause = (
                "a non-trainable variable was updated from each replica's local values without "
                "cross-replica aggregation (e.g. Keras 3 BatchNormalization moving statistics "
                "under MirroredStrategy); use BatchNormalization(synchronized=True) or "
                "aggregate the update, since a saved model keeps replica 0's copy only."
            )
        return Finding(
            kind="variable_drift",
            severity="error" if variable.get("trainable", True) else "warning",
            first_step=first,
            last_step=last,
            count=int(rows.size),
            replicas=[series.replicas[c] for c in columns],
            value=round(worst, 9),
            threshold=thresholds.variable_drift_rel_l2,
            message=head + cause,
            **base,
        )
    if differ.any():
        rows = np.flatnonzero(differ.any(axis=1))
        columns = [int(c) for c in np.flatnonzero(differ.any(axis=0))]
        first = int(series.steps[rows[0]])
        worst = float(np.nanmax(np.where(differ, rel, np.nan)))
        return Finding(
            kind="variable_bits_differ",
            severity="info",
            first_step=first,
            last_step=int(series.steps[rows[-1]]),
            count=int(rows.size),
            replicas=[series.replicas[c] for c in columns],
            value=round(worst, 12),
            threshold=thresholds.variable_drift_rel_l2,
            message=(
                f"Variable '{name}' on {_replica_list(series.replicas, columns)} is not "
                f"bit-identical to replica 0 from step {first}, within tolerance (relative L2 "
                f"up to {worst:.3g}): typical of non-deterministic kernels or devices of "
                "different types; enable tf.config.experimental.enable_op_determinism() if "
                "replicas must match exactly."
            ),
            **base,
        )
    return None


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
                )
            )
        if variable.get("sync") == "on_read":
            continue  # each replica keeps its own value on purpose (e.g. metric accumulators)
        finding = _drift_finding(series, index, variable, thresholds)
        if finding is not None:
            findings.append(finding)
    return sort_findings(findings)


def find(run_data, thresholds=Thresholds()):
    """Findings of the variables family of a `reader.RunData` (none without variables)."""
    return find_variables(getattr(run_data, "variables", None), thresholds)
