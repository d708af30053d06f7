"""Findings of the inputs family (kind → severity):

- `first_batch_uneven` (error): the first recorded step splits unevenly; Keras 3 `fit` fails on
  such a first batch before training.
- `uneven_batch` (warning; info when only a last partial batch is uneven): replicas got different
  batch sizes, none empty. Threshold: `Thresholds.max_imbalance_ratio` (max / min batch size).
- `empty_shard` (warning): a replica got 0 examples while another got some.
- `shape_mismatch` (error): an input's rank or a non-leading dimension differs across replicas.
- `dtype_mismatch` (error): an input's dtype differs across replicas.

`annotate` (the family's `Rules.annotate` hook) names, on a multi-worker job, the worker of every
finding's replicas, whichever family raised it. Pure Python and numpy.
"""

import collections

import numpy as np

from tb_replica_plugin.analysis import (
    Finding,
    Thresholds,
    fmt_steps,
    sort_findings,
)

FINDING_KINDS = {
    "first_batch_uneven": {
        "severity": "error",
        "thresholds": (),
        "summary": (
            "The first recorded step splits unevenly; Keras 3 fit fails on such a first batch "
            "before training."
        ),
    },
    "uneven_batch": {
        "severity": "warning",
        "thresholds": ("max_imbalance_ratio",),
        "summary": (
            "Replicas got different batch sizes, none empty (info when only a last partial batch "
            "is uneven)."
        ),
    },
    "empty_shard": {
        "severity": "warning",
        "thresholds": (),
        "summary": ("A replica got 0 examples while another got some."),
    },
    "shape_mismatch": {
        "severity": "error",
        "thresholds": (),
        "summary": ("An input's rank or a non-leading dimension differs across replicas."),
    },
    "dtype_mismatch": {
        "severity": "error",
        "thresholds": (),
        "summary": ("An input's dtype differs across replicas."),
    },
}


# A run of ParameterServerStrategy: replica r is worker r, each fed by its own input pipeline.
PSS = "ParameterServerStrategy"


def _pss_uneven_message(row, steps):
    """The `uneven_batch` message of a ParameterServerStrategy run (replica r: worker r)."""
    small, big = int(np.argmin(row)), int(np.argmax(row))
    return (
        f"Worker {small} got {int(row[small])} examples per step, worker {big} got "
        f"{int(row[big])} at {fmt_steps(steps)}: under ParameterServerStrategy each worker's "
        "input pipeline batches on its own, and a worker's step updates the variables with the "
        "gradients of its own batch; batch every worker's dataset alike in dataset_fn."
    )


def _uneven_message(row, replicas, nominal, steps):
    num = len(row)
    total = int(row.sum())
    small, big = int(np.argmin(row)), int(np.argmax(row))
    head = (
        f"Replica {replicas[small]} got {int(row[small])} examples, replica {replicas[big]} got "
        f"{int(row[big])} at {fmt_steps(steps)}"
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
    """The batch-size findings of a run: an uneven first batch, then one finding per uneven
    split of the batch (empty replicas, or an imbalance over `max_imbalance_ratio`).

    Args:
      series: an `InputsSeries`.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding` (`first_batch_uneven`, `empty_shard`, `uneven_batch`).
    """
    if series.batch_size.size == 0:
        return []
    findings = []
    pss = series.strategy == PSS
    first = None if pss else _first_batch_finding(series)  # no Keras 3 fit under PSS
    if first is not None:
        findings.append(first)
    nominal = _nominal_global_batch(series.batch_size)
    for pattern, steps in _uneven_splits(series).items():
        row = np.array(pattern)
        if row.min() == 0:
            findings.append(_empty_shard_finding(series, row, steps))
            continue
        ratio = int(row.max()) / int(row.min())
        if ratio > thresholds.max_imbalance_ratio:
            findings.append(_uneven_finding(series, row, steps, nominal, ratio, thresholds))
    return findings


def _nominal_global_batch(sizes):
    """The run's full global batch: the largest of its most common total and its largest total.

    Args:
      sizes: `InputsSeries.batch_size`, `[S, R]` (S > 0).

    Returns:
      An int.
    """
    totals = sizes.sum(axis=1)
    values, counts = np.unique(totals, return_counts=True)
    nominal = int(values[np.argmax(counts)]) if values.size else 0
    return max(nominal, int(totals.max()))


def _uneven_splits(series):
    """`{split: its logged steps}` of the steps whose replicas got different batch sizes, a
    split being the tuple of the replicas' sizes, in order of first step."""
    sizes = series.batch_size
    splits = collections.OrderedDict()
    for index in np.flatnonzero(sizes.min(axis=1) != sizes.max(axis=1)):
        splits.setdefault(tuple(int(v) for v in sizes[index]), []).append(int(series.steps[index]))
    return splits


def _first_batch_finding(series):
    """The `first_batch_uneven` finding of a run whose first logged batch splits unevenly,
    else None."""
    first_row = series.batch_size[0]
    if first_row.min() == first_row.max():
        return None
    total = int(first_row.sum())
    return Finding(
        kind="first_batch_uneven",
        severity="error",
        run=series.run,
        first_step=int(series.steps[0]),
        last_step=int(series.steps[0]),
        count=1,
        replicas=[series.replicas[i] for i in np.flatnonzero(first_row != first_row.max())],
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


def _empty_shard_finding(series, row, steps):
    """The `empty_shard` finding of a split `row` (some replica got 0) at logged `steps`."""
    empty = [series.replicas[i] for i in np.flatnonzero(row == 0)]
    names = ", ".join(str(r) for r in empty)
    plural = "s" if len(empty) > 1 else ""
    return Finding(
        kind="empty_shard",
        severity="warning",
        replicas=empty,
        value=0,
        threshold=0,
        message=(
            f"Replica{plural} {names} got 0 examples at {fmt_steps(steps)} (global "
            f"batch {int(row.sum())} over {len(row)} replicas: {row.tolist()}): a "
            "last partial batch smaller than the replica count leaves replicas "
            "empty; batch with drop_remainder=True or make the dataset size a "
            "multiple of the global batch."
        ),
        **_split_fields(series, steps),
    )


def _uneven_finding(series, row, steps, nominal, ratio, thresholds):
    """The `uneven_batch` finding of a split `row` (none empty, max / min = `ratio`) at logged
    `steps`: info when it is a partial batch (total under `nominal`), else a warning."""
    partial = int(row.sum()) < nominal
    return Finding(
        kind="uneven_batch",
        severity="info" if partial else "warning",
        replicas=[series.replicas[i] for i in np.flatnonzero(row != int(row.max()))],
        value=round(ratio, 6),
        threshold=thresholds.max_imbalance_ratio,
        message=(
            _pss_uneven_message(row, steps)
            if series.strategy == PSS
            else _uneven_message(row, series.replicas, nominal, steps)
        ),
        **_split_fields(series, steps),
    )


def _split_fields(series, steps):
    """The `Finding` fields shared by the findings of one split at logged `steps`."""
    return dict(
        run=series.run,
        first_step=steps[0],
        last_step=steps[-1],
        count=len(steps),
        name=None,
        view="batch",
    )


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


def find_inputs(series, thresholds=Thresholds()):
    """Findings of the inputs family for one run.

    Args:
      series: a `read.InputsSeries`.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding`, most severe first.

    Example:
      >>> [f.kind for f in find_inputs(series)]   # 17 examples, batch 8, 2 replicas
      ['empty_shard']
    """
    return sort_findings(_batch_findings(series, thresholds) + _shape_findings(series))


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
        if not names or finding.kind in ("straggler", "slow_replica") or finding.view == "status":
            continue  # these name their workers themselves
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


def find(run_data, thresholds=Thresholds()):
    """Findings of the inputs family of a `reader.RunData` (`find_inputs` of its inputs)."""
    return find_inputs(run_data.inputs, thresholds)


def annotate(findings, run_data):
    """On a multi-worker job, says which worker holds the replicas of each finding (any family).

    Args:
      findings: every family's findings of the run (messages are amended in place).
      run_data: the run's `reader.RunData`.

    Returns:
      `findings`.
    """
    if run_data.workers:
        _name_workers(findings, run_data.inputs, run_data.workers)
    return findings
