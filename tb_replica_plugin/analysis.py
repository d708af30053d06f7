"""Findings: the recorded series turned into plain-language problems, with cause and fix.

Pure Python and numpy (no TensorFlow): the same findings feed the tab, `tb-replica report` and
`tb_replica_plugin.inspect_dataset`.

Rules of the inputs family (kind → severity):

- `first_batch_uneven` (error): the first recorded step splits unevenly; Keras 3 `fit` fails on
  such a first batch before training.
- `uneven_batch` (warning; info when only a last partial batch is uneven): replicas got different
  batch sizes, none empty. Threshold: `Thresholds.max_imbalance_ratio` (max / min batch size).
- `empty_shard` (warning): a replica got 0 examples while another got some.
- `shape_mismatch` (error): an input's rank or a non-leading dimension differs across replicas.
- `dtype_mismatch` (error): an input's dtype differs across replicas.

Rules of the rng family:

- `identical_rng_streams` (warning): two or more replicas draw the same random numbers from one
  generator with a mirrored state (equal stream fingerprints) at
  `Thresholds.min_identical_rng_steps` logged steps or more, e.g. Keras 3 Dropout under
  MirroredStrategy. Generators with one unmirrored state are skipped: replicas share it and their
  draws are serialised.
- `rng_desync` (warning): a generator whose state is one mirrored variable holds a different state
  on some replicas (the replicas advanced it differently).

Rules of the data family:

- `duplicate_examples` (warning): replicas were fed the same examples at the same step, for more
  than `Thresholds.max_duplicate_share` of their examples (an input pipeline that is not sharded).

Rules of multi-worker jobs:

- `straggler` (warning): a worker's median busy time per step (its step period minus the time
  it waited for the last worker) exceeds the median over workers by `Thresholds.straggler_factor`
  and by at least `Thresholds.straggler_min_seconds` (the first timed step, a warm-up, is left
  out).
Rules of the variables family (weight drift and placement):

- `variable_drift` (error for a trainable variable, warning for a non-trainable one): a copy's
  relative L2 distance from replica 0's copy exceeds `Thresholds.variable_drift_rel_l2`.
- `variable_bits_differ` (info): copies are not bit-identical but stay within that tolerance.
- `variable_not_mirrored` (warning): a variable has no copy on some replica device (not raised
  under CentralStorageStrategy, which keeps one copy on purpose).

Rules of the gradients family:

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
  shard) or on all (the model diverged), and whether it spread afterwards.
"""

import collections
import dataclasses
import warnings

import numpy as np

SEVERITIES = ("error", "warning", "info")
SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Configurable thresholds of the rules.

    Attributes:
      max_imbalance_ratio: an `uneven_batch` finding is raised when max / min batch size over
        replicas exceeds this (1.0: any difference).
      min_identical_rng_steps: an `identical_rng_streams` finding is raised when replicas draw
        the same numbers from a generator at this many logged steps or more (1: any).
      max_duplicate_share: a `duplicate_examples` finding is raised when, over the run, the
        share of a replica's examples that another replica got at the same step exceeds this
        (0.01: more than 1 %, so a dataset with a few repeated records is not flagged).
      straggler_factor: a worker of a multi-worker job is a `straggler` when its median busy
        seconds per step exceed the median over workers times this...
      straggler_min_seconds: ...and exceed it by at least this many seconds (timer noise on
        millisecond steps is not a straggler).
      variable_drift_rel_l2: a `variable_drift` finding is raised when ||copy_r - copy_0|| /
        ||copy_0|| exceeds this for any replica r at any logged step (exact where the exact
        check ran, else the sketch estimate). Smaller non-zero differences (copies that are not
        bit-identical) give `variable_bits_differ` (info). 1e-6 is about 8 float32 ulps of
        relative error: far above rounding noise of identical updates, far below real drift.
      max_grad_norm_ratio: a `gradient_norm_outlier` finding is raised when a replica's local
        gradient norm exceeds this many times the median of the other replicas' norms at a
        logged step (10.0: replicas of a healthy run fed i.i.d. shards stay within a few times
        each other even at small per-replica batches).
      min_grad_outlier_fraction: ... and only when that replica is over the ratio at at least
        this fraction of the logged steps (0.5: a shard that is consistently off; with tiny
        per-replica batches, e.g. 2 examples, two replicas' norms differ 10× at single steps by
        chance). Every step's ratio is shown in the tab whatever this is.
    """

    max_imbalance_ratio: float = 1.0
    min_identical_rng_steps: int = 1
    max_duplicate_share: float = 0.01
    straggler_factor: float = 1.25
    straggler_min_seconds: float = 0.01
    variable_drift_rel_l2: float = 1e-6

    max_grad_norm_ratio: float = 10.0
    min_grad_outlier_fraction: float = 0.5

    @classmethod
    def from_overrides(cls, overrides):
        """Thresholds with some fields set from `NAME=VALUE` strings (as `--threshold` gives).

        Args:
          overrides: iterable of strings such as `"max_imbalance_ratio=1.5"`.

        Returns:
          A `Thresholds`; fields not named keep their defaults.

        Raises:
          ValueError: on a malformed pair, an unknown name or a value that is not a number.

        Example:
          >>> Thresholds.from_overrides(["max_imbalance_ratio=1.5"]).max_imbalance_ratio
          1.5
        """
        fields = {field.name: field for field in dataclasses.fields(cls)}
        values = {}
        for override in overrides:
            name, sep, raw = str(override).partition("=")
            name = name.strip()
            if not sep:
                raise ValueError(f"threshold {override!r} is not NAME=VALUE")
            if name not in fields:
                raise ValueError(
                    f"unknown threshold {name!r}; known thresholds: {', '.join(sorted(fields))}"
                )
            kind = float if fields[name].type in (float, "float") else int
            try:
                values[name] = kind(raw)
            except ValueError:
                raise ValueError(f"threshold {name} needs a number, got {raw!r}") from None
        return cls(**values)


@dataclasses.dataclass
class Finding:
    """One problem found in one run.

    Attributes:
      kind: the rule, e.g. "empty_shard".
      severity: "error", "warning" or "info".
      run: the run name.
      first_step, last_step, count: the steps where it holds (first, last, how many).
      replicas: replica ids involved.
      name: what it is about: the input name (shape and dtype rules), the variable or layer
        name (gradient and drift rules), None when it concerns the whole batch.
      value: the measured value (e.g. imbalance ratio), threshold: what it was compared with.
      message: one or two sentences with the likely cause and the fix.
      view: the part of the tab that shows it ("batch", "shapes", "gradients", "rng", "data",
        "step_time", "drift" or "placement").
    """

    kind: str
    severity: str
    run: str
    first_step: int
    last_step: int
    count: int
    replicas: list
    name: str | None
    value: float | int | None
    threshold: float | int | None
    message: str
    view: str

    def to_json(self):
        return dataclasses.asdict(self)


def _fmt_steps(steps):
    steps = list(steps)
    if len(steps) == 1:
        return f"step {steps[0]}"
    shown = ", ".join(str(s) for s in steps[:5])
    more = f" and {len(steps) - 5} more" if len(steps) > 5 else ""
    return f"{len(steps)} steps ({shown}{more})"


def _uneven_message(row, replicas, nominal, steps):
    num = len(row)
    total = int(row.sum())
    small, big = int(np.argmin(row)), int(np.argmax(row))
    head = (
        f"Replica {replicas[small]} got {int(row[small])} examples, replica {replicas[big]} got "
        f"{int(row[big])} at {_fmt_steps(steps)}"
    )
    if total < nominal:
        return (
            f"{head}: the last partial batch of the dataset (global batch {total} instead of "
            f"{nominal}) is not divisible by {num} replicas; batch with drop_remainder=True or "
            f"use a dataset size that is a multiple of {nominal}."
        )
    return (
        f"{head}: global batch {total} is not divisible by {num} replicas; use a global batch "
        f"that is a multiple of {num} or batch(..., drop_remainder=True)."
    )


def _batch_findings(series, thresholds):
    findings = []
    sizes = series.batch_size
    if sizes.size == 0:
        return findings
    replicas = series.replicas
    totals = sizes.sum(axis=1)
    values, counts = np.unique(totals, return_counts=True)
    nominal = int(values[np.argmax(counts)]) if values.size else 0
    nominal = max(nominal, int(totals.max()))
    mins, maxs = sizes.min(axis=1), sizes.max(axis=1)
    uneven = mins != maxs
    patterns = collections.OrderedDict()
    for index in np.flatnonzero(uneven):
        patterns.setdefault(tuple(int(v) for v in sizes[index]), []).append(
            int(series.steps[index])
        )

    first_row = sizes[0]
    if first_row.min() != first_row.max():
        total = int(first_row.sum())
        findings.append(
            Finding(
                kind="first_batch_uneven",
                severity="error",
                run=series.run,
                first_step=int(series.steps[0]),
                last_step=int(series.steps[0]),
                count=1,
                replicas=[replicas[i] for i in np.flatnonzero(first_row != first_row.max())],
                name=None,
                value=[int(v) for v in first_row],
                threshold=None,
                message=(
                    f"The first batch splits unevenly: global batch {total} over "
                    f"{len(first_row)} replicas gives {[int(v) for v in first_row]}. Keras 3 "
                    "model.fit fails on such a first batch before training ('Inputs to operation "
                    "AddN ... must have the same size and shape'); use a global batch that is a "
                    f"multiple of {len(first_row)} or batch(..., drop_remainder=True)."
                ),
                view="batch",
            )
        )

    for pattern, steps in patterns.items():
        row = np.array(pattern)
        low, high = int(row.min()), int(row.max())
        base = dict(
            run=series.run,
            first_step=steps[0],
            last_step=steps[-1],
            count=len(steps),
            name=None,
            view="batch",
        )
        if low == 0:
            empty = [replicas[i] for i in np.flatnonzero(row == 0)]
            names = ", ".join(str(r) for r in empty)
            plural = "s" if len(empty) > 1 else ""
            findings.append(
                Finding(
                    kind="empty_shard",
                    severity="warning",
                    replicas=empty,
                    value=0,
                    threshold=0,
                    message=(
                        f"Replica{plural} {names} got 0 examples at {_fmt_steps(steps)} (global "
                        f"batch {int(row.sum())} over {len(row)} replicas: {list(pattern)}): a "
                        "last partial batch smaller than the replica count leaves replicas "
                        "empty; batch with drop_remainder=True or make the dataset size a "
                        "multiple of the global batch."
                    ),
                    **base,
                )
            )
            continue
        ratio = high / low
        if ratio <= thresholds.max_imbalance_ratio:
            continue
        partial = int(row.sum()) < nominal
        findings.append(
            Finding(
                kind="uneven_batch",
                severity="info" if partial else "warning",
                replicas=[replicas[i] for i in np.flatnonzero(row != high)],
                value=round(ratio, 6),
                threshold=thresholds.max_imbalance_ratio,
                message=_uneven_message(row, replicas, nominal, steps),
                **base,
            )
        )
    return findings


def _shape_findings(series):
    """Shape/dtype disagreements, each holding from its event to the next event."""
    findings = {}
    events = series.shape_events
    last_step = int(series.steps[-1]) if series.steps.size else None
    for index, event in enumerate(events):
        end = events[index + 1]["step"] - 1 if index + 1 < len(events) else last_step
        end = event["step"] if end is None else max(end, event["step"])
        for entry in event["inputs"]:
            if not entry["mismatch"]:
                continue
            dtype_problem = "dtype" in entry["mismatch_dims"]
            kind = "dtype_mismatch" if dtype_problem else "shape_mismatch"
            key = (kind, entry["name"])
            found = findings.get(key)
            if found is None:
                if dtype_problem:
                    majority = collections.Counter(entry["dtypes"]).most_common(1)[0][0]
                    odd = [
                        series.replicas[r] for r, d in enumerate(entry["dtypes"]) if d != majority
                    ]
                    detail = ", ".join(
                        f"replica {series.replicas[r]}: {d}" for r, d in enumerate(entry["dtypes"])
                    )
                    message = (
                        f"Input '{entry['name']}' has different dtypes across replicas at step "
                        f"{event['step']} ({detail}): strategy.gather and any cross-replica "
                        "concat would fail here; cast to one dtype in the input pipeline."
                    )
                else:
                    shapes = [tuple(s) for s in entry["shapes"]]
                    majority = collections.Counter(shapes).most_common(1)[0][0]
                    odd = [series.replicas[r] for r, s in enumerate(shapes) if s != majority]
                    detail = ", ".join(
                        f"replica {series.replicas[r]}: {list(s)}" for r, s in enumerate(shapes)
                    )
                    dims = ", ".join(str(d) for d in entry["mismatch_dims"])
                    message = (
                        f"Input '{entry['name']}' has different shapes across replicas at step "
                        f"{event['step']} ({detail}; differing: {dims}): strategy.gather would "
                        "fail here; make preprocessing produce one shape on every replica (e.g. "
                        "resize or pad to a fixed size)."
                    )
                findings[key] = Finding(
                    kind=kind,
                    severity="error",
                    run=series.run,
                    first_step=event["step"],
                    last_step=end,
                    count=end - event["step"] + 1,
                    replicas=odd,
                    name=entry["name"],
                    value=None,
                    threshold=None,
                    message=message,
                    view="shapes",
                )
            else:
                found.last_step = end
                found.count += end - event["step"] + 1
    return list(findings.values())


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
      series: a `reader.VariablesSeries` (or None: no findings).
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


def sort_findings(findings):
    """Most severe first, then by run and first step."""
    return sorted(findings, key=lambda f: (SEVERITY_RANK[f.severity], f.run, f.first_step, f.kind))


def find_inputs(series, thresholds=Thresholds()):
    """Findings of the inputs family for one run.

    Args:
      series: a `reader.InputsSeries`.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding`, most severe first.

    Example:
      >>> [f.kind for f in find_inputs(series)]   # 17 examples, batch 8, 2 replicas
      ['empty_shard']
    """
    return sort_findings(_batch_findings(series, thresholds) + _shape_findings(series))


def _worker_text(worker):
    replicas = worker["replicas"]
    ids = ", ".join(str(r) for r in replicas)
    return f"{worker['name']} (replica{'s' if len(replicas) > 1 else ''} {ids})"


def timed_steps(step_time):
    """Which steps of a `reader.StepTimeSeries` the straggler rule uses (bool [S]).

    Steps where every worker has a busy time, except the first one when later ones exist: a
    warm-up (workers finish tracing and their first step at different times).
    """
    valid = np.all(np.isfinite(step_time.busy), axis=1)
    first = np.flatnonzero(valid)
    if first.size > 1:
        valid[first[0]] = False
    return valid


def step_time_medians(step_time):
    """Per-worker medians of busy seconds and lateness over `timed_steps` (None if no step).

    Returns:
      `(median_busy, median_lateness)`, two lists with one float (or None) per worker.
    """
    valid = timed_steps(step_time)
    if not np.any(valid):
        return [None] * len(step_time.workers), [None] * len(step_time.workers)
    return (
        [float(v) for v in np.median(step_time.busy[valid], axis=0)],
        [float(v) for v in np.median(step_time.lateness[valid], axis=0)],
    )


def find_stragglers(step_time, workers, thresholds=Thresholds()):
    """Stragglers of a multi-worker job.

    Args:
      step_time: a `reader.StepTimeSeries` (or None).
      workers: the job's per-worker grouping (`RunData.workers`), in the same worker order.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding` of kind "straggler", one per slow worker.

    Example:
      >>> [f.name for f in find_stragglers(run_data.step_time, run_data.workers)]
      ['worker_1']
    """
    if step_time is None or len(workers) < 2 or step_time.steps.size == 0:
        return []
    busy = step_time.busy
    valid = timed_steps(step_time)
    if not np.any(valid):
        return []
    busy, steps = busy[valid], step_time.steps[valid]
    lateness = step_time.lateness[valid]
    per_worker = np.median(busy, axis=0)
    middle = float(np.median(per_worker))
    findings = []
    for w, worker in enumerate(workers):
        own = float(per_worker[w])
        if own <= thresholds.straggler_factor * middle:
            continue
        if own - middle < thresholds.straggler_min_seconds:
            continue
        at_step = np.median(busy, axis=1)
        slow = steps[busy[:, w] > thresholds.straggler_factor * at_step]
        slow = slow if slow.size else steps
        ratio = own / middle if middle > 0 else float("inf")
        others = [float(per_worker[v]) for v in range(len(workers)) if v != w]
        findings.append(
            Finding(
                kind="straggler",
                severity="warning",
                run=step_time.run,
                first_step=int(slow[0]),
                last_step=int(slow[-1]),
                count=int(slow.size),
                replicas=list(worker["replicas"]),
                name=worker["name"],
                value=round(ratio, 3),
                threshold=thresholds.straggler_factor,
                message=(
                    f"Worker {_worker_text(worker)} is a straggler: it needs {own:.3f} s per "
                    f"step against a median of {middle:.3f} s over workers (the others "
                    f"{', '.join(f'{o:.3f}' for o in others)} s), and arrives "
                    f"{float(np.median(lateness[:, w])):.3f} s after the first worker, so every "
                    "worker waits for it at each all-reduce. Look at its input pipeline (tf.data "
                    "prefetch/parallel map, data on a slow disk), its host load and its "
                    "hardware; this measures the time until its step inputs are ready."
                ),
                view="step_time",
            )
        )
    return findings


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
    medians = np.empty_like(norms)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, as wanted
        for replica in range(norms.shape[1]):
            medians[:, replica] = np.nanmedian(np.delete(norms, replica, axis=1), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = norms / medians
    ratio[(norms == 0) & (medians == 0)] = 1.0
    return ratio


def _json_number(value):
    """A float for JSON: None for NaN or infinite (plain json cannot carry them)."""
    value = float(value)
    return round(value, 6) if np.isfinite(value) else None


def _outlier_findings(series, thresholds):
    findings = []
    if series.steps.size == 0 or series.num_replicas < 2:
        return findings
    ratio = ratio_to_median(series.global_norm)
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
                    f"the other replicas{layer} at {_fmt_steps(steps.tolist())} (logged steps): "
                    "its shard differs from the others — e.g. unnormalised or mis-scaled "
                    "inputs, a corrupt or duplicated shard, or preprocessing that differs on "
                    "that replica; check what that replica's input pipeline produces."
                ),
                view="gradients",
            )
        )
    return findings


def _per_worker_sizes(series, workers, step):
    """`{worker name: batch size}` at `step` if every worker's replicas agree, else None."""
    at = np.flatnonzero(series.steps == step)
    if not at.size:
        return None
    row = series.batch_size[at[0]]
    column = {r: c for c, r in enumerate(series.replicas)}
    sizes = {}
    for worker in workers:
        values = {int(row[column[r]]) for r in worker["replicas"] if r in column}
        if len(values) != 1:
            return None
        sizes[worker["name"]] = values.pop()
    return sizes


def _name_workers(findings, series, workers):
    """Says which worker holds the replicas of each finding of a job, and when the sizes differ
    by worker (one input pipeline per worker), that the per-worker pipelines disagree."""
    where = {r: worker["name"] for worker in workers for r in worker["replicas"]}
    for finding in findings:
        names = sorted({where[r] for r in finding.replicas if r in where})
        if not names or finding.kind == "straggler":
            continue
        finding.message += f" On {', '.join(names)}."
        if finding.kind == "duplicate_examples" and len(names) > 1:
            finding.message += (
                " Replicas of different workers got the same examples: each worker's input "
                "pipeline must read its own shard (input_context.input_pipeline_id)."
            )
        if finding.view != "batch":
            continue
        sizes = _per_worker_sizes(series, workers, finding.first_step)
        if sizes and len(set(sizes.values())) > 1:
            listed = ", ".join(f"{name}: {size}" for name, size in sizes.items())
            finding.message += (
                f" The batch size differs by worker ({listed} per replica): with one input "
                "pipeline per worker (distribute_datasets_from_function), batch each with "
                "input_context.get_per_replica_batch_size(global_batch) and shard it with "
                "input_context.num_input_pipelines / input_pipeline_id."
            )
    return findings


def _nonfinite_findings(series):
    findings = []
    counts = series.nonfinite  # [E, 4, R]
    if series.nonfinite_steps.size == 0:
        return findings
    steps = series.nonfinite_steps
    bad = counts.sum(axis=1) > 0  # [E, R]
    first_of = {}
    for index in np.flatnonzero(bad.any(axis=0)):
        first_of[index] = int(steps[np.argmax(bad[:, index])])
    if not first_of:
        return findings
    origin = min(first_of.values())
    groups = collections.defaultdict(list)
    for index, first in first_of.items():
        groups[first].append(index)
    all_replicas = len(first_of) == series.num_replicas
    for first, indices in sorted(groups.items()):
        replicas = [series.replicas[i] for i in sorted(indices)]
        rows = np.flatnonzero(bad[:, indices].any(axis=1))
        group_steps = steps[rows].tolist()
        grad_nan = int(counts[rows][:, 0][:, indices].sum())
        grad_inf = int(counts[rows][:, 1][:, indices].sum())
        loss_nan = int(counts[rows][:, 2][:, indices].sum())
        loss_inf = int(counts[rows][:, 3][:, indices].sum())
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
        head = (
            f"Replica{plural} {names} had non-finite values ({detail}) at {_fmt_steps(group_steps)}"
        )
        if series.loss_scaled and not (loss_nan or loss_inf):
            findings.append(
                Finding(
                    kind="nonfinite_gradients",
                    severity="info",
                    run=series.run,
                    first_step=first,
                    last_step=int(group_steps[-1]),
                    count=len(group_steps),
                    replicas=replicas,
                    name=None,
                    value=grad_nan + grad_inf,
                    threshold=0,
                    message=(
                        f"{head} with a finite loss, under a loss-scale optimizer: the scaled "
                        "gradients overflowed, which is expected while the dynamic loss scale "
                        "adapts (the optimizer skips the step and lowers the scale). Only a "
                        "NaN loss, or overflow at most steps, needs a look. Keras 3.15 under "
                        "MirroredStrategy checks only replica 0's gradients, so an overflow on "
                        "another replica alone is not skipped."
                    ),
                    view="gradients",
                )
            )
            continue
        if first > origin:
            origin_replicas = ", ".join(str(series.replicas[i]) for i in groups[origin])
            message = (
                f"{head}, after replica(s) {origin_replicas} at step {origin}: the all-reduce "
                "spread the first NaN/Inf into every replica's weights; fix the first one."
            )
        elif len(indices) == series.num_replicas and series.num_replicas > 1:
            message = (
                f"{head}, on every replica at once from step {first}: the model itself "
                "diverged rather than one shard (learning rate too high, exploding activations, "
                "log/division of 0); lower the learning rate, clip gradients or check the loss."
            )
        else:
            others = "" if all_replicas else " while the other replicas stayed finite"
            message = (
                f"{head}{others}: look at that replica's batch at step {first} (a NaN/Inf or "
                "extreme example, a division by zero or log(0) in its preprocessing). Unless "
                "the step is skipped, the all-reduce writes the NaN into every replica's "
                "weights (Keras 3.15's LossScaleOptimizer checks only replica 0's gradients)."
            )
        findings.append(
            Finding(
                kind="nonfinite_gradients",
                severity="error",
                run=series.run,
                first_step=first,
                last_step=int(group_steps[-1]),
                count=len(group_steps),
                replicas=replicas,
                name=None,
                value=grad_nan + grad_inf + loss_nan + loss_inf,
                threshold=0,
                message=message,
                view="gradients",
            )
        )
    return findings


def find_gradients(series, thresholds=Thresholds()):
    """Findings of the gradients family for one run.

    Args:
      series: a `reader.GradientsSeries`.
      thresholds: the `Thresholds` to apply (`max_grad_norm_ratio`).

    Returns:
      A list of `Finding` (`nonfinite_gradients`, `gradient_norm_outlier`), most severe first.

    Example:
      >>> [(f.kind, f.replicas, f.first_step) for f in find_gradients(series)]
      [('nonfinite_gradients', [1], 5)]
    """
    return sort_findings(_nonfinite_findings(series) + _outlier_findings(series, thresholds))


def find_run(run_data, thresholds=Thresholds()):
    """Findings of every family of one run.

    Args:
      run_data: a `reader.RunData`.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding`, most severe first.

    Example:
      >>> [f.kind for f in find_run(run_data)]   # 17 examples, batch 8, 2 replicas
      ['empty_shard']
    """
    findings = list(find_inputs(run_data.inputs, thresholds))
    if getattr(run_data, "rng", None) is not None:
        findings.extend(find_rng(run_data.rng, thresholds))
    if getattr(run_data, "data", None) is not None:
        findings.extend(find_data(run_data.data, thresholds))
    findings.extend(find_variables(getattr(run_data, "variables", None), thresholds))
    if getattr(run_data, "gradients", None) is not None:
        findings.extend(find_gradients(run_data.gradients, thresholds))
    workers = getattr(run_data, "workers", None) or []
    if workers:
        findings += find_stragglers(getattr(run_data, "step_time", None), workers, thresholds)
        _name_workers(findings, run_data.inputs, workers)
    return sort_findings(findings)


def replica_list_text(replicas):
    """ "0–3" for a run of consecutive ids, "0, 2" otherwise."""
    replicas = sorted(int(r) for r in replicas)
    if len(replicas) > 2 and replicas == list(range(replicas[0], replicas[-1] + 1)):
        return f"{replicas[0]}–{replicas[-1]}"
    if len(replicas) == 2:
        return f"{replicas[0]} and {replicas[1]}"
    return ", ".join(str(r) for r in replicas)


def stream_groups(values):
    """Group id per replica: the index of the first replica holding an equal value.

    Args:
      values: array [R] (or [R, W]: rows are compared).

    Returns:
      A list of R ints; replicas with equal values share the id. E.g. `[0, 0, 2, 0]`.
    """
    values = np.asarray(values)
    groups = []
    for r in range(values.shape[0]):
        for q in range(r + 1):
            if np.array_equal(values[q], values[r]):
                groups.append(q)
                break
    return groups


def _rng_identical(series, index, generator, thresholds):
    if not generator.get("mirrored"):
        # One unmirrored state shared by every replica (a generator created outside
        # strategy.scope()): TensorFlow serialises the replicas' draws, which take successive
        # parts of one stream, so equal fingerprints of the state before the step mean nothing.
        return None
    steps, replicas = [], set()
    for s in range(series.steps.size):
        groups = stream_groups(series.fingerprint[s, index])
        counts = collections.Counter(groups)
        same = [series.replicas[r] for r, g in enumerate(groups) if counts[g] > 1]
        if same:
            steps.append(int(series.steps[s]))
            replicas.update(same)
    if not steps or len(steps) < thresholds.min_identical_rng_steps:
        return None
    who = replica_list_text(replicas)
    total = int(series.steps.size)
    when = f"at all {total} logged steps" if len(steps) == total else f"at {_fmt_steps(steps)}"
    name = generator["name"]
    layer_class = generator.get("layer_class") or ""
    if generator["kind"] == "keras.SeedGenerator" and "Dropout" in layer_class:
        head = f"Replicas {who} draw identical dropout masks in layer `{generator['layer']}`"
        cause = (
            "Keras 3 Dropout draws its mask statelessly from a SeedGenerator whose state is one "
            "mirrored variable, so every replica applies the same mask to its examples. If the "
            "noise should be independent per replica, draw the mask from a tf.random.Generator "
            "created under strategy.scope() (one stream per replica) or fold the replica id "
            "into the seed (tf.random.experimental.stateless_fold_in)."
        )
    elif generator["kind"] == "keras.SeedGenerator":
        owner = f"layer `{generator['layer']}`" if generator.get("layer") else f"`{name}`"
        head = f"Replicas {who} draw identical random numbers from the SeedGenerator of {owner}"
        cause = (
            "a Keras SeedGenerator draws statelessly from its (mirrored) state, so every "
            "replica gets the same numbers; fold the replica id into the seed "
            "(tf.random.experimental.stateless_fold_in) if they should differ."
        )
    else:
        head = f"Replicas {who} draw identical random numbers from generator `{name}`"
        cause = (
            "create the tf.random.Generator under strategy.scope() (TensorFlow then folds the "
            "replica id into its key) instead of giving each replica an identically seeded copy."
        )
    return Finding(
        kind="identical_rng_streams",
        severity="warning",
        run=series.run,
        first_step=steps[0],
        last_step=steps[-1],
        count=len(steps),
        replicas=sorted(replicas),
        name=name,
        value=round(len(steps) / total, 6),
        threshold=thresholds.min_identical_rng_steps,
        message=f"{head} ({when}): {cause}",
        view="rng",
    )


def _rng_desync(series, index, generator):
    if not generator.get("mirrored"):
        return None
    steps, odd = [], set()
    for s in range(series.steps.size):
        states = series.state[s, index]
        groups = stream_groups(states)
        majority = collections.Counter(groups).most_common(1)[0][0]
        differ = [series.replicas[r] for r, g in enumerate(groups) if g != majority]
        if differ:
            steps.append(int(series.steps[s]))
            odd.update(differ)
    if not steps:
        return None
    plural = "s" if len(odd) > 1 else ""
    return Finding(
        kind="rng_desync",
        severity="warning",
        run=series.run,
        first_step=steps[0],
        last_step=steps[-1],
        count=len(steps),
        replicas=sorted(odd),
        name=generator["name"],
        value=len(steps),
        threshold=None,
        message=(
            f"Generator `{generator['name']}` desynchronised on replica{plural} "
            f"{replica_list_text(odd)} from {_fmt_steps(steps[:1])} ({len(steps)} logged "
            "step(s)): its state is one mirrored variable, yet it differs from the other "
            "replicas', so some replicas drew more numbers (a draw inside a replica-dependent "
            "tf.cond or a data-dependent loop). Checkpoints save one replica's state, so the "
            "run cannot be resumed exactly; draw the same amount on every replica."
        ),
        view="rng",
    )


def find_rng(series, thresholds=Thresholds()):
    """Findings of the rng family for one run.

    Args:
      series: a `reader.RngSeries`.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding`, most severe first.

    Example:
      >>> [f.message[:44] for f in find_rng(series)]   # Keras Dropout, 4 replicas
      ['Replicas 0–3 draw identical dropout masks i']
    """
    findings = []
    for index, generator in enumerate(series.generators):
        for finding in (
            _rng_identical(series, index, generator, thresholds),
            _rng_desync(series, index, generator),
        ):
            if finding is not None:
                findings.append(finding)
    return sort_findings(findings)


def data_pair_shares(series):
    """Per pair of replicas, over the whole run: shared examples / the smaller replica's count.

    Returns:
      `(share [R, R] float, steps_shared [R, R] int)`: the share of examples fed to both
      replicas at the same step (relative to the replica with fewer distinct examples), and the
      number of steps where they shared any. Diagonals: 1.0 and the number of steps.
    """
    shared = series.window_shared.sum(axis=0).astype(np.float64)
    distinct = np.diagonal(shared).copy()
    smaller = np.minimum(distinct[:, None], distinct[None, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(smaller > 0, shared / np.where(smaller > 0, smaller, 1), 0.0)
    return share, series.steps_shared.sum(axis=0)


def find_data(series, thresholds=Thresholds()):
    """Findings of the data family for one run.

    Replica pairs whose shared share exceeds `thresholds.max_duplicate_share` are grouped into
    connected sets; one `duplicate_examples` finding per set.

    Args:
      series: a `reader.DataSeries`.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding`.

    Example:
      >>> [f.replicas for f in find_data(series)]   # unsharded pipeline, 4 replicas
      [[0, 1, 2, 3]]
    """
    num = series.num_replicas
    if series.steps.size == 0 or num < 2:
        return []
    share, steps_shared = data_pair_shares(series)
    parent = list(range(num))

    def root(r):
        while parent[r] != r:
            r = parent[r]
        return r

    flagged = []
    for r in range(num):
        for q in range(r + 1, num):
            if share[r, q] > thresholds.max_duplicate_share:
                flagged.append((r, q))
                parent[root(q)] = root(r)
    findings = []
    for group_root in sorted({root(r) for pair in flagged for r in pair}):
        pairs = [(r, q) for r, q in flagged if root(r) == group_root]
        members = sorted({r for pair in pairs for r in pair})
        ids = [series.replicas[r] for r in members]
        with_shared = np.zeros(series.steps.size, bool)
        for r, q in pairs:
            with_shared |= series.steps_shared[:, r, q] > 0
        logged = np.flatnonzero(with_shared)
        starts = series.window_starts()
        count = int(max(steps_shared[r, q] for r, q in pairs))
        total_steps = int(series.window_steps.sum())
        # With examples_every > 1 only sampled steps were compared: say so.
        kind = "sampled steps" if series.sampled else "steps"
        distinct = series.window_shared.sum(axis=0).diagonal()[members].sum()
        duplicated = series.window_duplicated.sum(axis=0)[members].sum()
        value = float(duplicated / distinct) if distinct else 0.0
        complete = len(pairs) == len(members) * (len(members) - 1) // 2 and all(
            share[r, q] >= 0.999 for r, q in pairs
        )
        when = (
            f"at {count} of {total_steps} {kind}"
            if count < total_steps
            else f"at every {kind[:-1]}"
        )
        if complete:
            head = (
                f"Replicas {replica_list_text(ids)} were fed the same examples at the same step "
                f"({when}; {value:.0%} of their examples are also on another replica)"
            )
        else:
            detail = ", ".join(
                f"{series.replicas[r]}–{series.replicas[q]}: {share[r, q]:.0%}" for r, q in pairs
            )
            head = (
                f"Replicas {replica_list_text(ids)} shared examples at the same step ({when}; "
                f"shared share per pair {detail})"
            )
        findings.append(
            Finding(
                kind="duplicate_examples",
                severity="warning",
                run=series.run,
                first_step=int(starts[logged[0]]),
                last_step=int(series.steps[logged[-1]]),
                count=count,
                replicas=ids,
                name=None,
                value=round(value, 6),
                threshold=thresholds.max_duplicate_share,
                message=(
                    f"{head}: the input pipeline is not sharded, so the effective batch is "
                    "smaller than it looks. In distribute_datasets_from_function, use the "
                    "input_context: dataset.shard(input_context.num_input_pipelines, "
                    "input_context.input_pipeline_id) and "
                    "input_context.get_per_replica_batch_size(global_batch)."
                ),
                view="data",
            )
        )
    return findings


def severity_counts(findings):
    """`{"error": n, "warning": n, "info": n}` for a list of findings."""
    counts = dict.fromkeys(SEVERITIES, 0)
    for finding in findings:
        counts[finding.severity] += 1
    return counts


def finding_kinds():
    """Every finding kind the rules emit: `{kind: {"severity", "thresholds", "summary"}}`.

    `severity` is the usual severity (the rule may lower or raise it, as its summary says),
    `thresholds` the names of the `Thresholds` fields the rule reads, `summary` one sentence.
    A hand list for now; the family rules will declare their own kinds.
    """
    return {
        "first_batch_uneven": {
            "severity": "error",
            "thresholds": (),
            "summary": "The first recorded batch splits unevenly over the replicas "
            "(Keras 3 fit fails on it before training).",
        },
        "uneven_batch": {
            "severity": "warning",
            "thresholds": ("max_imbalance_ratio",),
            "summary": "Replicas got different batch sizes, none empty "
            "(info when only a last partial batch is uneven).",
        },
        "empty_shard": {
            "severity": "warning",
            "thresholds": (),
            "summary": "A replica got 0 examples while another got some.",
        },
        "shape_mismatch": {
            "severity": "error",
            "thresholds": (),
            "summary": "An input's rank or a non-leading dimension differs across replicas.",
        },
        "dtype_mismatch": {
            "severity": "error",
            "thresholds": (),
            "summary": "An input's dtype differs across replicas.",
        },
        "identical_rng_streams": {
            "severity": "warning",
            "thresholds": ("min_identical_rng_steps",),
            "summary": "Replicas draw identical numbers from one generator with a mirrored state.",
        },
        "rng_desync": {
            "severity": "warning",
            "thresholds": (),
            "summary": "A generator with one mirrored state holds a different state on some "
            "replicas.",
        },
        "duplicate_examples": {
            "severity": "warning",
            "thresholds": ("max_duplicate_share",),
            "summary": "Replicas were fed the same examples at the same step.",
        },
        "straggler": {
            "severity": "warning",
            "thresholds": ("straggler_factor", "straggler_min_seconds"),
            "summary": "A worker of a multi-worker job is slower than the others.",
        },
        "variable_drift": {
            "severity": "error",
            "thresholds": ("variable_drift_rel_l2",),
            "summary": "A variable's copy differs from replica 0's copy beyond the tolerance "
            "(warning for a non-trainable variable).",
        },
        "variable_bits_differ": {
            "severity": "info",
            "thresholds": ("variable_drift_rel_l2",),
            "summary": "Copies are not bit-identical but stay within the drift tolerance.",
        },
        "variable_not_mirrored": {
            "severity": "warning",
            "thresholds": (),
            "summary": "A variable has no copy on some replica device.",
        },
        "gradient_norm_outlier": {
            "severity": "warning",
            "thresholds": ("max_grad_norm_ratio", "min_grad_outlier_fraction"),
            "summary": "A replica's local gradient norm is far above the other replicas'.",
        },
        "nonfinite_gradients": {
            "severity": "error",
            "thresholds": (),
            "summary": "A replica's gradients or loss held NaN or Inf "
            "(info under a loss-scale optimizer while the loss stays finite).",
        },
    }
