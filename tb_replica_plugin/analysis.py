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
"""

import collections
import dataclasses

import numpy as np

SEVERITIES = ("error", "warning", "info")
SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Configurable thresholds of the rules.

    Attributes:
      max_imbalance_ratio: an `uneven_batch` finding is raised when max / min batch size over
        replicas exceeds this (1.0: any difference).
    """

    max_imbalance_ratio: float = 1.0

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
      view: the part of the tab that shows it ("batch" or "shapes").
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
    return sort_findings(findings)


def severity_counts(findings):
    """`{"error": n, "warning": n, "info": n}` for a list of findings."""
    counts = dict.fromkeys(SEVERITIES, 0)
    for finding in findings:
        counts[finding.severity] += 1
    return counts
