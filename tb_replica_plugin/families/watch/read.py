"""The watch family read side: `WatchSeries` (one `WatchedValue` per name) from the samples.

Imports no TensorFlow.
"""

import dataclasses
import json

import numpy as np

from tb_replica_plugin.core import columns, jobs
from tb_replica_plugin.core.leaf_entries import parse_leaf_entries
from tb_replica_plugin.families.watch import schema


@dataclasses.dataclass
class WatchedValue:
    """One watched name of a run.

    Attributes:
      name: the watched name (e.g. "logits"; "outputs" for model outputs in `fit`).
      shape_events: one dict per step where kinds, dtypes or shapes changed, in step order:
        `{"step", "explain", "leaves": [{"name", "dtypes", "shapes", "mismatch",
        "mismatch_dims"}, and for a ragged or sparse leaf "kinds", "structure"]}`.
      stats: `[(step, float64 array [L, len(STAT_ROWS), R])]` at sampled steps, step order.
      nonfinite: the same layout at every step where some replica held a NaN or Inf.
    """

    name: str
    shape_events: list
    stats: list
    nonfinite: list

    @property
    def leaves(self):
        """Leaf names of the latest shape event (the order of the stats' leaf axis)."""
        if not self.shape_events:
            return []
        return [entry["name"] for entry in self.shape_events[-1]["leaves"]]

    def leaves_at(self, step):
        """Leaf names in force at `step` (the last shape event at or before it)."""
        names = []
        for event in self.shape_events:
            if event["step"] > step:
                break
            names = [entry["name"] for entry in event["leaves"]]
        return names or self.leaves

    def __reduce__(self):
        """Pickles each of `stats` and `nonfinite` as one array when its arrays are alike (a
        worker read in another process: `shared_read`, the report's pool), not one per step."""
        return _unpacked_value, (
            self.name,
            self.shape_events,
            _packed_points(self.stats),
            _packed_points(self.nonfinite),
        )


def _packed_points(points):
    """`(steps, stacked arrays)` of `[(step, array)]` whose arrays have one shape and dtype,
    else the list itself."""
    if len(points) < 2 or not isinstance(points[0][1], np.ndarray):
        return points
    first = points[0][1]
    alike = (isinstance(a, np.ndarray) and a.shape == first.shape for _, a in points)
    if not all(alike) or any(a.dtype != first.dtype for _, a in points):
        return points
    return np.array([s for s, _ in points], np.int64), np.stack([a for _, a in points])


def _unpacked_value(name, shape_events, stats, nonfinite):
    """The `WatchedValue` that `WatchedValue.__reduce__` packed."""
    return WatchedValue(name, shape_events, _unpacked_points(stats), _unpacked_points(nonfinite))


def _unpacked_points(points):
    """The `[(step, array)]` of `_packed_points` (each array a view of the stacked one)."""
    if isinstance(points, tuple):
        steps, stacked = points
        return list(zip(steps.tolist(), stacked, strict=True))
    return points


@dataclasses.dataclass
class WatchSeries:
    """The watch family of one run.

    Attributes:
      run: the run name.
      replicas: global replica ids (the per-replica axis of every array and list).
      devices: device of each replica.
      values: `{name: WatchedValue}`, sorted by name.
      source: "fit", "custom_loop" or "inspect_dataset" ("" when unknown).
    """

    run: str
    replicas: list
    devices: list
    values: dict
    source: str = ""

    def steps(self):
        """Every step any watched value recorded (events, stats, NaN/Inf), sorted."""
        steps = set()
        for value in self.values.values():
            steps.update(e["step"] for e in value.shape_events)
            steps.update(s for s, _ in value.stats + value.nonfinite)
        return sorted(steps)


def parse_watch_event(step, document):
    """Parses one `watch/<name>/shapes` document.

    Returns:
      `{"step", "name", "explain", "leaves", "replicas", "devices", "source"}`.

    Raises:
      ValueError, KeyError, TypeError: if the document is not a watch shapes event.
    """
    if isinstance(document, bytes):
        document = document.decode("utf-8")
    parsed = json.loads(document)
    if not isinstance(parsed, dict) or not isinstance(parsed.get("leaves"), list):
        raise ValueError("not a watch shapes event")
    return {
        "step": int(step),
        "name": str(parsed.get("name", "")),
        "explain": bool(parsed.get("explain", False)),
        "leaves": parse_leaf_entries(parsed["leaves"]),
        "replicas": [int(r) for r in parsed.get("replicas", [])],
        "devices": [str(d) for d in parsed.get("devices", [])],
        "source": str(parsed.get("source", "")),
    }


def _points(samples, tag, rows, notes):
    """`[(step, float64 [R, rows, ...])]` of a stats or nonfinite tag's samples of that layout
    (a note counts the others)."""
    if isinstance(samples, columns.Column):
        values = samples.values
        if values.ndim == 4 and values.shape[2] == rows:  # every sample of that layout
            stacked = values.astype(np.float64, copy=False)
            return list(zip(samples.steps.tolist(), stacked, strict=True))
    points = []
    bad = 0
    for step, value in samples:
        array = np.asarray(value, dtype=np.float64)
        if array.ndim == 3 and array.shape[1] == rows:
            points.append((int(step), array))
        else:
            bad += 1
    if bad:
        notes.append(f"{bad} sample(s) of {tag!r} of an unexpected layout skipped.")
    return points


def from_samples(run, samples, notes, needed=None):
    """Builds the `WatchSeries` of a run from its raw samples (see `RunData.samples`).

    Args:
      run: the run name.
      samples: `{tag: [(step, numpy value)]}` sorted by step.
      notes: the run's notes list (problems are appended).
      needed: unused (watch needs no other family).

    Returns:
      A `WatchSeries`, or None when the run watched nothing.
    """
    by_name, last_event = _parts_by_name(samples, notes)
    if not by_name:
        return None
    values = {name: _watched_value(name, by_name[name]) for name in sorted(by_name)}
    count = _replica_count(values)
    replicas = (last_event or {}).get("replicas") or list(range(count))
    devices = (last_event or {}).get("devices") or [""] * len(replicas)
    source = (last_event or {}).get("source", "")
    return WatchSeries(run=run, replicas=replicas, devices=devices, values=values, source=source)


# Each watch tag pattern and the part of a watched value its samples are.
_PARTS = (
    (schema.TAG_SHAPES, "events"),
    (schema.TAG_STATS, "stats"),
    (schema.TAG_NONFINITE, "nonfinite"),
)


def _parts_by_name(samples, notes):
    """`({name: {"events": {step: event}, "stats": points, "nonfinite": points}}, last shapes
    event)` of a run's watch samples; unreadable shapes events are counted in `notes`."""
    by_name, last_event, bad = {}, None, 0
    rows = len(schema.STAT_ROWS)
    for tag, tag_samples in samples.items():
        for pattern, part in _PARTS:
            name = schema.name_of(pattern, tag)
            if name is None:
                continue
            entry = by_name.setdefault(name, {"events": {}, "stats": [], "nonfinite": []})
            if part != "events":
                entry[part] = _points(tag_samples, tag, rows, notes)
                break
            for step, value in tag_samples:
                try:
                    event = parse_watch_event(step, value.item())
                except (ValueError, KeyError, TypeError, AttributeError):
                    bad += 1
                    continue
                entry["events"][event["step"]] = event  # a later write at a step wins
                if last_event is None or event["step"] >= last_event["step"]:
                    last_event = event
            break
    if bad:
        notes.append(f"{bad} unreadable watch shapes event(s) skipped.")
    return by_name, last_event


def _watched_value(name, entry):
    """The `WatchedValue` of one name's parts (`_parts_by_name`), its shapes events by step."""
    events = [entry["events"][step] for step in sorted(entry["events"])]
    return WatchedValue(
        name=name,
        shape_events=[
            {"step": e["step"], "explain": e["explain"], "leaves": e["leaves"]} for e in events
        ],
        stats=entry["stats"],
        nonfinite=entry["nonfinite"],
    )


def _replica_count(values):
    """The most replicas any stats, NaN/Inf counts or shapes event of `values` has."""
    count = 0
    for value in values.values():
        for _, array in value.stats + value.nonfinite:
            count = max(count, array.shape[2])
        for event in value.shape_events:
            for leaf in event["leaves"]:
                count = max(count, len(leaf["shapes"]))
    return count


class WatchMerger(jobs.Merger):
    """Multi-worker jobs: watched values are not merged across workers (read each worker's
    run); the job's notes say so when any worker watched some (`jobs.Merger`)."""

    attribute = "watch"

    def add(self, slot, member, since):
        self.series_of(slot, member)

    def result(self, job, order, workers, notes):
        if any(self.seen.get(slot, False) for slot in order):
            notes.append(
                "Watched values of a multi-worker job are shown per worker run, not merged: open "
                "a worker's run (<job>/worker_<i>) to see them."
            )
        return None
