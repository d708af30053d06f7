"""Findings of the gradients family:

- `gradient_norm_outlier` (warning): a replica's local gradient global norm is more than
  `Thresholds.max_grad_norm_ratio` times the median of the OTHER replicas' norms at at least
  `Thresholds.min_grad_outlier_fraction` of the logged steps. The
  reference leaves the replica out so that one outlier cannot pull its own reference (with 2
  replicas the median of all would be the mean, and no ratio could exceed 2).
- `nonfinite_gradients` (error; info when a loss-scale optimizer is in use and the loss stayed
  finite: an expected overflow of the scaled gradients): a replica's gradients or loss held NaN
  or Inf at some step
  (logged or not: these come from the sparse every-step events). Replicas whose first NaN/Inf is
  at the same step are one finding; the message says whether it started on one replica (a bad
  shard) or on all (the model diverged), and whether it spread afterwards. A NaN/Inf loss with
  finite gradients on a replica that got 0 examples at that step (the inputs family's batch
  sizes) is no such finding: the inputs family's `empty_shard` is its cause, and `annotate`
  adds the NaN loss to that finding's message.

Pure Python and numpy.
"""

import collections

import numpy as np

from tb_replica_plugin.analysis import (
    Finding,
    Thresholds,
    fmt_steps,
    sort_findings,
)
from tb_replica_plugin.core.medians import median_of_others
from tb_replica_plugin.families.gradients import schema

FINDING_KINDS = {
    "gradient_norm_outlier": {
        "severity": "warning",
        "thresholds": ("max_grad_norm_ratio", "min_grad_outlier_fraction"),
        "summary": (
            "A replica's local gradient norm is many times the median of the other replicas' norms"
            " at many logged steps."
        ),
    },
    "nonfinite_gradients": {
        "severity": "error",
        "thresholds": (),
        "summary": (
            "A replica's gradients or loss held NaN or Inf at some step (info for an expected "
            "loss-scale overflow)."
        ),
    },
}


def ratio_to_median(norms):
    """Each value over the median of the other replicas' values at the same step.

    Args:
      norms: float array [S, R] (e.g. `GradientsSeries.global_norm`); NaN values are ignored in
        the medians.

    Returns:
      float64 [S, R]: `norms[s, r] / median(norms[s, others])`; 1.0 where both are 0, inf where
      only the median is 0, NaN where the value or every other value is NaN; all 1.0 with one
      replica.

    Example:
      >>> ratio_to_median(np.array([[1.0, 1.0, 100.0, 1.0]])).tolist()
      [[1.0, 1.0, 100.0, 1.0]]
    """
    norms = np.asarray(norms, np.float64)
    if norms.ndim != 2 or norms.shape[1] < 2:
        return np.ones_like(norms)
    medians = median_of_others(norms)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = norms / medians
    ratio[(norms == 0) & (medians == 0)] = 1.0
    return ratio


def global_ratio(series):
    """`ratio_to_median(series.global_norm)`, computed once per series (the findings, the route
    and the report ask for it at each data version).

    Args:
      series: a `read.GradientsSeries`.
    """
    cached = series.ratio_cache
    if cached is None or cached[0] is not series.global_norm:
        cached = series.ratio_cache = (series.global_norm, ratio_to_median(series.global_norm))
    return cached[1]


def _json_number(value):
    """A float for JSON: None for NaN or infinite (plain json cannot carry them)."""
    value = float(value)
    return round(value, 6) if np.isfinite(value) else None


def _outlier_findings(series, thresholds):
    findings = []
    if series.steps.size == 0 or series.num_replicas < 2:
        return findings
    ratio = global_ratio(series)
    # An infinite ratio means the others have no gradient at all (e.g. empty shards, their own
    # finding): only finite ratios count.
    over = (ratio > thresholds.max_grad_norm_ratio) & np.isfinite(ratio)
    considered = max(1, int(np.isfinite(ratio).any(axis=1).sum()))
    for index in np.flatnonzero(over.any(axis=0)):
        replica = series.replicas[index]
        rows = np.flatnonzero(over[:, index])
        if rows.size < thresholds.min_grad_outlier_fraction * considered:
            continue
        steps = series.steps[rows]
        peak_row = rows[np.argmax(np.where(np.isfinite(ratio[rows, index]), ratio[rows, index], 0))]
        peak = ratio[peak_row, index]
        name = None
        if series.variables and series.variable_norms.shape[1] == len(series.variables):
            per_var = ratio_to_median(series.variable_norms[peak_row])[:, index]
            per_var = np.where(np.isnan(per_var), -1.0, per_var)
            name = series.variables[int(np.argmax(per_var))]
        shown = "∞" if not np.isfinite(peak) else f"{peak:.3g}"
        layer = f" (largest on '{name}')" if name else ""
        findings.append(
            Finding(
                kind="gradient_norm_outlier",
                severity="warning",
                run=series.run,
                first_step=int(steps[0]),
                last_step=int(steps[-1]),
                count=int(steps.size),
                replicas=[replica],
                name=name,
                value=_json_number(peak),
                threshold=thresholds.max_grad_norm_ratio,
                message=(
                    f"Replica {replica}'s local gradient norm is up to {shown}× the median of "
                    f"the other replicas{layer} at {fmt_steps(steps.tolist())} (logged steps): "
                    "its shard differs from the others — e.g. unnormalised or mis-scaled "
                    "inputs, a corrupt or duplicated shard, or preprocessing that differs on "
                    "that replica; check what that replica's input pipeline produces."
                ),
                view="gradients",
            )
        )
    return findings


def empty_batch_losses(series, inputs):
    """Where a replica's only non-finite value was its loss at a step where it got 0 examples
    (the mean of an empty batch is 0/0): its gradients were finite, the weights unharmed.

    Args:
      series: a `read.GradientsSeries`.
      inputs: the run's `inputs.read.InputsSeries` (batch sizes at every step), or None.

    Returns:
      bool `[E, R]` over `series.nonfinite_steps` and `series.replicas`: True where the replica's
      gradients held no NaN/Inf, its loss did, and the inputs family saw it get 0 examples at
      that step. All False without inputs or where the batch size at that step is unknown.
    """
    counts = series.nonfinite
    shape = (series.nonfinite_steps.size, series.num_replicas)
    if inputs is None or not shape[0] or not inputs.steps.size or not inputs.batch_size.size:
        return np.zeros(shape, bool)
    loss_only = (counts[:, schema.GRAD_NAN] + counts[:, schema.GRAD_INF] == 0) & (
        counts[:, schema.LOSS_NAN] + counts[:, schema.LOSS_INF] > 0
    )
    rows = np.searchsorted(inputs.steps, series.nonfinite_steps)
    known = rows < inputs.steps.size
    known[known] &= inputs.steps[rows[known]] == series.nonfinite_steps[known]
    column = {int(r): c for c, r in enumerate(inputs.replicas)}
    empty = np.zeros(shape, bool)
    for index, replica in enumerate(series.replicas):
        if int(replica) in column:
            sizes = inputs.batch_size[rows[known], column[int(replica)]]
            empty[known, index] = sizes == 0
    return loss_only & empty


def _nonfinite_findings(series, inputs=None):
    """The `nonfinite_gradients` findings of a run: one per set of replicas whose first NaN/Inf
    is at the same step. A replica's NaN/Inf loss at a step where it got 0 examples and its
    gradients stayed finite is left out (`empty_batch_losses`: the inputs family's
    `empty_shard` finding is its cause, and says so).

    Args:
      series: a `read.GradientsSeries`.
      inputs: the run's `InputsSeries` (its batch sizes), or None.

    Returns:
      A list of `Finding`, by first step.
    """
    if series.nonfinite_steps.size == 0:
        return []
    counts = series.nonfinite.copy()
    counts[np.broadcast_to(empty_batch_losses(series, inputs)[:, None, :], counts.shape)] = 0
    bad, first_of = _first_nonfinite_steps(series, counts)
    if not first_of:
        return []
    groups = collections.defaultdict(list)
    for index, first in first_of.items():
        groups[first].append(index)
    all_replicas = len(first_of) == series.num_replicas
    findings = []
    for first, indices in sorted(groups.items()):
        replicas = [series.replicas[i] for i in sorted(indices)]
        rows = np.flatnonzero(bad[:, indices].any(axis=1))
        group_steps = series.nonfinite_steps[rows].tolist()
        grad_nan, grad_inf, loss_nan, loss_inf = _nonfinite_counts(counts, rows, indices)
        head = _nonfinite_head(replicas, group_steps, grad_nan, grad_inf, loss_nan, loss_inf)
        head += _unlisted_steps(series, bad, indices, len(group_steps))
        pss = series.strategy == PSS
        if pss:  # replica r is worker r
            head = "Worker" + head[len("Replica") :]
        if series.loss_scaled and not (loss_nan or loss_inf):
            message = f"{head}{LOSS_SCALE_OVERFLOW}"
            finding = _nonfinite_finding(
                series, "info", first, group_steps, replicas, grad_nan + grad_inf, message
            )
        else:
            if grad_nan or grad_inf:
                explain = _pss_message if pss else _nonfinite_message
                message = explain(series, head, first, indices, groups, all_replicas)
            else:
                message = _loss_only_message(head, first, all_replicas)
            value = grad_nan + grad_inf + loss_nan + loss_inf
            finding = _nonfinite_finding(
                series, "error", first, group_steps, replicas, value, message
            )
        findings.append(finding)
    return findings


def _unlisted_steps(series, bad, indices, listed):
    """What the events do not list: the faulty steps between logged steps that the device
    fault record counted (`GradientsSeries.plain_faults`) but that are not its first or last.

    Args:
      series: the run's `read.GradientsSeries`.
      bad: `[E, R]` where each replica held NaN/Inf at each event step.
      indices: the group's replica positions; listed: the group's event steps.

    Returns:
      "" when every faulty step is listed, else a clause for the message's first sentence.
    """
    record = series.plain_faults
    if record is None:
        return ""
    total = 0
    for index in indices:
        count, first, last = (int(v) for v in record[:, index])
        events = series.nonfinite_steps[bad[:, index]]
        written = {first, last} & set(events.tolist()) if count else set()
        total = max(total, int(bad[:, index].sum()) - len(written) + count)
    if total <= listed:
        return ""
    return (
        f" ({total} steps in all: between logged and sampled steps only the first and the "
        "last are recorded)"
    )


PSS = "ParameterServerStrategy"  # `GradientsSeries.strategy`: replica r is worker r

# The end of an info finding's message: an overflow of the scaled gradients with a finite loss.
LOSS_SCALE_OVERFLOW = (
    " with a finite loss, under a loss-scale optimizer: the scaled "
    "gradients overflowed, which is expected while the dynamic loss scale "
    "adapts (the optimizer skips the step and lowers the scale). Only a "
    "NaN loss, or overflow at most steps, needs a look. Keras 3.15 under "
    "MirroredStrategy checks only replica 0's gradients, so an overflow on "
    "another replica alone is not skipped."
)


def _first_nonfinite_steps(series, counts):
    """Where a run's replicas held NaN or Inf (in gradients or loss), and the first step of each.

    Args:
      series: a `read.GradientsSeries` with event steps (`nonfinite_steps`).
      counts: its NaN/Inf counts `[E, 4, R]` (`series.nonfinite`, less those left out).

    Returns:
      `(bad, first_of)`: `bad[e, r]` is True when replica position r held a non-finite value
      at the e-th event step; `first_of` maps each such replica position to its first such step.
    """
    steps = series.nonfinite_steps
    bad = counts.sum(axis=1) > 0  # [E, R]
    first_of = {}
    for index in np.flatnonzero(bad.any(axis=0)):
        first_of[index] = int(steps[np.argmax(bad[:, index])])
    return bad, first_of


def _nonfinite_counts(counts, rows, indices):
    """The non-finite values of some replicas at some event steps.

    Args:
      counts: `GradientsSeries.nonfinite`, `[E, 4, R]`.
      rows: the event rows; indices: the replica positions.

    Returns:
      `(grad_nan, grad_inf, loss_nan, loss_inf)`, summed over `rows` and `indices`.
    """
    return tuple(int(counts[rows][:, kind][:, indices].sum()) for kind in range(4))


def _nonfinite_head(replicas, group_steps, grad_nan, grad_inf, loss_nan, loss_inf):
    """The first sentence of a `nonfinite_gradients` message: which replicas, what, when.

    Args:
      replicas: the replica ids; group_steps: the event steps at which they held NaN/Inf.
      grad_nan, grad_inf, loss_nan, loss_inf: the counts of `_nonfinite_counts`.

    Returns:
      The sentence, without its end (the caller continues it).
    """
    what = []
    if grad_nan:
        what.append(f"{grad_nan} NaN")
    if grad_inf:
        what.append(f"{grad_inf} Inf")
    detail = " and ".join(what) + " gradient value(s)" if what else "finite gradients"
    if loss_nan or loss_inf:
        detail += f", loss NaN/Inf at {loss_nan + loss_inf} step(s)"
    plural = "s" if len(replicas) > 1 else ""
    names = ", ".join(str(r) for r in replicas)
    return f"Replica{plural} {names} had non-finite values ({detail}) at {fmt_steps(group_steps)}"


def _nonfinite_message(series, head, first, indices, groups, all_replicas):
    """The message of an error `nonfinite_gradients` finding: where the NaN/Inf came from.

    Args:
      series: the run's `read.GradientsSeries`.
      head: `_nonfinite_head`'s sentence; first: the replicas' first non-finite step.
      indices: their replica positions.
      groups: `{first step: replica positions}` of every replica that held NaN/Inf.
      all_replicas: whether every replica of the run did.

    Returns:
      The message: spread from an earlier replica, the model diverged, or one shard's batch.
    """
    origin = min(groups)
    if first > origin:
        origin_replicas = ", ".join(str(series.replicas[i]) for i in groups[origin])
        return (
            f"{head}, after replica(s) {origin_replicas} at step {origin}: the all-reduce "
            "spread the first NaN/Inf into every replica's weights; fix the first one."
        )
    if len(indices) == series.num_replicas and series.num_replicas > 1:
        return (
            f"{head}, on every replica at once from step {first}: the model itself "
            "diverged rather than one shard (learning rate too high, exploding activations, "
            "log/division of 0); lower the learning rate, clip gradients or check the loss."
        )
    others = "" if all_replicas else " while the other replicas stayed finite"
    return (
        f"{head}{others}: look at that replica's batch at step {first} (a NaN/Inf or "
        "extreme example, a division by zero or log(0) in its preprocessing). Unless "
        "the step is skipped, the all-reduce writes the NaN into every replica's "
        "weights (Keras 3.15's LossScaleOptimizer checks only replica 0's gradients)."
    )


def _pss_message(series, head, first, indices, groups, all_workers):
    """`_nonfinite_message` under ParameterServerStrategy: replica r is worker r, and a worker's
    update goes to the variables on the parameter servers, which every worker reads."""
    origin = min(groups)
    if first > origin:
        origin_workers = ", ".join(str(series.replicas[i]) for i in groups[origin])
        return (
            f"{head}, after worker(s) {origin_workers} at step {origin}: its update wrote the "
            "first NaN/Inf into the variables on the parameter servers, which every worker "
            "reads; fix the first one."
        )
    if len(indices) == series.num_replicas and series.num_replicas > 1:
        return (
            f"{head}, on every worker from step {first}: the model itself diverged rather than "
            "one worker's data (learning rate too high, exploding activations, log/division of "
            "0); lower the learning rate, clip gradients or check the loss."
        )
    others = "" if all_workers else " while the other workers stayed finite"
    return (
        f"{head}{others}: look at that worker's batch at its step {first} (step k is each "
        "worker's k-th step; a NaN/Inf or extreme example, a division by zero or log(0) in "
        "its preprocessing). Unless that update is skipped, it writes the NaN into the "
        "variables on the parameter servers, which every worker reads at its next step."
    )


def _loss_only_message(head, first, all_replicas):
    """The message of an error `nonfinite_gradients` finding whose replicas' gradients stayed
    finite: only their loss was NaN/Inf, which no all-reduce carries into the weights.

    Args:
      head: `_nonfinite_head`'s sentence; first: the replicas' first non-finite step.
      all_replicas: whether every replica of the run held NaN/Inf.

    Returns:
      The message.
    """
    others = "" if all_replicas else " while the other replicas stayed finite"
    return (
        f"{head}{others}: the gradients stayed finite, so the weights were not harmed, but the "
        f"reported loss is not a number from step {first}; look at how the loss is computed "
        "on that batch (a mean over 0 examples, log(0) or a division by 0 in a term that "
        "does not reach the weights)."
    )


def _nonfinite_finding(series, severity, first, group_steps, replicas, value, message):
    """A `nonfinite_gradients` `Finding` of `replicas` from step `first` (event steps
    `group_steps`), of `severity` ("error", or "info" for an expected overflow)."""
    return Finding(
        kind="nonfinite_gradients",
        severity=severity,
        run=series.run,
        first_step=first,
        last_step=int(group_steps[-1]),
        count=len(group_steps),
        replicas=replicas,
        name=None,
        value=value,
        threshold=0,
        message=message,
        view="gradients",
    )


def find_gradients(series, thresholds=Thresholds(), inputs=None):
    """Findings of the gradients family for one run.

    Args:
      series: a `read.GradientsSeries`.
      thresholds: the `Thresholds` to apply (`max_grad_norm_ratio`).
      inputs: the run's `inputs.read.InputsSeries` (its batch sizes tell an empty batch's NaN
        loss, left to `empty_shard`), or None.

    Returns:
      A list of `Finding` (`nonfinite_gradients`, `gradient_norm_outlier`), most severe first.

    Example:
      >>> [(f.kind, f.replicas, f.first_step) for f in find_gradients(series)]
      [('nonfinite_gradients', [1], 5)]
    """
    return sort_findings(
        _nonfinite_findings(series, inputs) + _outlier_findings(series, thresholds)
    )


def find(run_data, thresholds=Thresholds()):
    """Findings of the gradients family of a `reader.RunData` (none without gradients)."""
    if run_data.gradients is None:
        return []
    return find_gradients(run_data.gradients, thresholds, run_data.inputs)


def annotate(findings, run_data):
    """Says, in each `empty_shard` finding of the run (inputs family), at which of its steps
    the empty replicas' loss was NaN/Inf while their gradients stayed finite: the mean of an
    empty batch, which `_nonfinite_findings` leaves to that finding.

    Args:
      findings: every family's findings of the run (messages are amended in place).
      run_data: the run's `reader.RunData`.

    Returns:
      `findings`.
    """
    series, inputs = run_data.gradients, run_data.inputs
    if series is None or series.nonfinite_steps.size == 0:
        return findings
    mask = empty_batch_losses(series, inputs)
    if not mask.any():
        return findings
    position = {int(r): i for i, r in enumerate(series.replicas)}
    steps = series.nonfinite_steps
    for finding in findings:
        if finding.kind != "empty_shard" or finding.run != series.run:
            continue
        indices = [position[int(r)] for r in finding.replicas if int(r) in position]
        within = (steps >= finding.first_step) & (steps <= finding.last_step)
        hit = within & mask[:, indices].any(axis=1)
        if not hit.any():
            continue
        bad = sorted({series.replicas[i] for i in indices if mask[hit, i].any()})
        plural = "s" if len(bad) > 1 else ""
        finding.message += (
            f" The loss of replica{plural} {', '.join(str(r) for r in bad)} is NaN/Inf at "
            f"{fmt_steps(steps[hit].tolist())}: a mean over 0 examples is 0/0. The gradients "
            "there stayed finite, so the weights are unharmed (no nonfinite_gradients finding), "
            "but a loss logged or averaged over replicas shows NaN; divide by max(count, 1) "
            "or skip empty batches."
        )
    return findings
