"""Findings of the watch family (kind → severity):

- `gather_would_fail` (warning): the local values replicas hold for a watched value differ beyond
  the leading axis (a dimension, the rank, the dtype, dense vs ragged vs sparse, or a ragged
  structure): `strategy.gather(value, axis=0)` fails on them.
- `nonfinite_values` (error): a watched value holds NaN or Inf on some replica.
- `per_replica_result` (info): asked for with `watch(..., explain=True)`: what `strategy.run`
  returned for the value, the local shape on every replica and the shape `gather(axis=0)` gives.

Pure Python and numpy.
"""

import collections

from tb_replica_plugin.analysis import Finding, Thresholds, fmt_steps, sort_findings
from tb_replica_plugin.families.watch import schema

FINDING_KINDS = {
    "gather_would_fail": {
        "severity": "warning",
        "thresholds": (),
        "summary": (
            "A watched value differs across replicas beyond the leading axis (dimension, rank, "
            "dtype, kind or ragged structure): strategy.gather(value, axis=0) fails on it."
        ),
    },
    "nonfinite_values": {
        "severity": "error",
        "thresholds": (),
        "summary": "A watched value (or a model output in fit) holds NaN or Inf on a replica.",
    },
    "per_replica_result": {
        "severity": "info",
        "thresholds": (),
        "summary": (
            "Asked for with watch(..., explain=True): the local shape of the value on every "
            "replica and the shape strategy.gather(axis=0) gives."
        ),
    },
}


def fmt_shape(shape):
    """A recorded shape as text: a ragged dimension (-1) is shown as None."""
    return "[" + ", ".join("None" if d == -1 else str(d) for d in shape) + "]"


def _fix(leaf, dims):
    kinds = set(leaf.get("kinds") or ["dense"])
    if "kind" in dims:
        return (
            "make every replica return the same kind (convert with .to_tensor() or "
            "tf.sparse.to_dense before returning it from strategy.run)"
        )
    if "dtype" in dims:
        return "cast to one dtype on every replica before returning it"
    if "ragged" in kinds:
        return (
            "give every replica the same ragged structure, or convert with "
            ".to_tensor(shape=[None, fixed length]) before returning it"
        )
    if "sparse" in kinds:
        return (
            "give every replica's SparseTensor the same dense_shape beyond the leading axis "
            "(tf.sparse.reset_shape to a fixed shape)"
        )
    return (
        "pad or resize to one shape on every replica (e.g. tf.image.resize, tf.pad or "
        ".to_tensor(shape=...)), or gather a fixed-shape summary instead (e.g. "
        "tf.reduce_mean over the differing axis)"
    )


def _differing(leaf):
    """The replica indices whose shape/dtype/kind is not the majority's (all on a tie)."""
    kinds = leaf.get("kinds") or ["dense"] * len(leaf["shapes"])
    keys = [
        (kind, dtype, tuple(shape))
        for kind, dtype, shape in zip(kinds, leaf["dtypes"], leaf["shapes"], strict=False)
    ]
    counts = collections.Counter(keys).most_common()
    if len(counts) > 1 and counts[0][1] > counts[1][1]:
        majority = counts[0][0]
        return [index for index, key in enumerate(keys) if key != majority]
    return list(range(len(keys)))


def _gather_findings(series, value):
    findings = {}
    events = value.shape_events
    last_step = None
    steps = [s for s, _ in value.stats + value.nonfinite] + [e["step"] for e in events]
    if steps:
        last_step = max(steps)
    for index, event in enumerate(events):
        end = events[index + 1]["step"] - 1 if index + 1 < len(events) else last_step
        end = max(end, event["step"])
        for leaf in event["leaves"]:
            if not leaf["mismatch"]:
                continue
            key = leaf["name"]
            found = findings.get(key)
            if found is not None:
                found.last_step = end
                found.count += end - event["step"] + 1
                continue
            dims = leaf["mismatch_dims"]
            kinds = leaf.get("kinds") or ["dense"] * len(leaf["shapes"])
            detail = "; ".join(
                f"replica {series.replicas[r]}: {fmt_shape(shape)} {dtype}"
                + ("" if kind == "dense" else f" {kind}")
                for r, (shape, dtype, kind) in enumerate(
                    zip(leaf["shapes"], leaf["dtypes"], kinds, strict=False)
                )
            )
            words = ", ".join(f"dim {d}" if isinstance(d, int) else str(d) for d in dims)
            leaf_words = "" if leaf["name"] == value.name else f" (leaf '{leaf['name']}')"
            findings[key] = Finding(
                kind="gather_would_fail",
                severity="warning",
                run=series.run,
                first_step=event["step"],
                last_step=end,
                count=end - event["step"] + 1,
                replicas=[series.replicas[r] for r in _differing(leaf)],
                name=leaf["name"],
                value=[d if isinstance(d, int) else str(d) for d in dims],
                threshold=None,
                message=(
                    f"Watched value '{value.name}'{leaf_words} differs across replicas in "
                    f"{words} at step {event['step']} ({detail}): strategy.gather(value, axis=0) "
                    "fails on these local values (it concatenates them along axis 0, so every "
                    f"other axis must match), and so does strategy.reduce; {_fix(leaf, dims)}."
                ),
                view="watch",
            )
    return list(findings.values())


def _nonfinite_findings(series, value):
    rows = schema.STAT_ROWS
    nan_row, inf_row = rows.index("nan"), rows.index("inf")
    per_replica = collections.defaultdict(lambda: {"steps": [], "nan": 0, "inf": 0, "leaves": []})
    for step, array in value.nonfinite:
        names = value.leaves_at(step)
        for replica in range(array.shape[2]):
            nans = int(array[:, nan_row, replica].sum())
            infs = int(array[:, inf_row, replica].sum())
            if nans + infs == 0:
                continue
            entry = per_replica[replica]
            entry["steps"].append(step)
            entry["nan"] += nans
            entry["inf"] += infs
            for leaf in range(array.shape[0]):
                if array[leaf, nan_row, replica] + array[leaf, inf_row, replica] > 0:
                    name = names[leaf] if leaf < len(names) else f"leaf {leaf}"
                    if name not in entry["leaves"]:
                        entry["leaves"].append(name)
    if not per_replica:
        return []
    replicas = sorted(per_replica)
    steps = sorted({s for r in replicas for s in per_replica[r]["steps"]})
    detail = "; ".join(
        f"replica {series.replicas[r]} at {fmt_steps(per_replica[r]['steps'])} "
        f"({per_replica[r]['nan']} NaN, {per_replica[r]['inf']} Inf in "
        f"{', '.join(per_replica[r]['leaves'])})"
        for r in replicas
    )
    first = min(per_replica[r]["steps"][0] for r in replicas)
    return [
        Finding(
            kind="nonfinite_values",
            severity="error",
            run=series.run,
            first_step=steps[0],
            last_step=steps[-1],
            count=len(steps),
            replicas=[series.replicas[r] for r in replicas],
            name=value.name,
            value=first,
            threshold=None,
            message=(
                f"Watched value '{value.name}' holds NaN or Inf: {detail}. The first is at step "
                f"{first}; look at what that replica was fed and computed at that step (its "
                "inputs, the loss, the learning rate); a NaN in a model output poisons the loss "
                "and, after the all-reduce, every replica's weights."
            ),
            view="watch",
        )
    ]


def gather_shape(leaf):
    """The shape `strategy.gather(value, axis=0)` gives for one leaf's local shapes, or None
    when it fails (the local values differ beyond axis 0, or have rank 0)."""
    shapes = leaf["shapes"]
    if leaf["mismatch"] or not shapes or not shapes[0]:
        return None
    leading = [shape[0] for shape in shapes]
    if any(d < 0 for d in leading):
        return None
    return [sum(leading), *shapes[0][1:]]


def _explain_findings(series, value):
    explained = [e for e in value.shape_events if e["explain"]]
    if not explained:
        return []
    event = explained[-1]
    count = len(series.replicas)
    parts = []
    for leaf in event["leaves"]:
        local = ", ".join(
            f"replica {series.replicas[r]}: {fmt_shape(shape)}"
            for r, shape in enumerate(leaf["shapes"])
        )
        gathered = gather_shape(leaf)
        result = (
            f"strategy.gather(value, axis=0) gives {fmt_shape(gathered)}"
            if gathered is not None
            else "strategy.gather(value, axis=0) fails (see gather_would_fail)"
            if leaf["mismatch"]
            else "strategy.gather(value, axis=0) needs rank >= 1"
        )
        if not leaf["mismatch"] and leaf["shapes"]:
            result += (
                f"; strategy.reduce('SUM' or 'MEAN', value, axis=None) gives "
                f"{fmt_shape(leaf['shapes'][0])} (element-wise over the replicas)"
            )
        parts.append(f"'{leaf['name']}': local values {local}; {result}")
    return [
        Finding(
            kind="per_replica_result",
            severity="info",
            run=series.run,
            first_step=event["step"],
            last_step=event["step"],
            count=1,
            replicas=list(series.replicas),
            name=value.name,
            value=None,
            threshold=None,
            message=(
                f"strategy.run returned a PerReplica for '{value.name}' at step {event['step']}, "
                f"one local value per replica ({count} replicas), each computed on that "
                f"replica's share of the global batch: {'; '.join(parts)}. A leading dimension "
                "smaller than the global batch is expected (global batch / replicas), not a "
                "shape bug; strategy.experimental_local_results(value) gives the local values."
            ),
            view="watch",
        )
    ]


def find(run_data, thresholds=Thresholds()):
    """Findings of the watch family of a `reader.RunData`, most severe first.

    Args:
      run_data: a `reader.RunData`.
      thresholds: unused (the watch findings have no threshold).

    Returns:
      A list of `Finding`.

    Example:
      >>> [f.kind for f in find(run_data)]   # replicas returned [4, 10] and [4, 12]
      ['gather_would_fail']
    """
    series = run_data.watch
    if series is None:
        return []
    findings = []
    for value in series.values.values():
        findings += _nonfinite_findings(series, value)
        findings += _gather_findings(series, value)
        findings += _explain_findings(series, value)
    return sort_findings(findings)
