"""The inputs family read side: `InputsSeries` from the samples, and its multi-worker merge.

Imports no TensorFlow.
"""

import dataclasses
import json

import numpy as np

from tb_replica_plugin.core import columns, jobs, plugin_data
from tb_replica_plugin.core.leaf_entries import mismatch_dims, parse_leaf_entries
from tb_replica_plugin.families.inputs import schema

# Largest step range reconstructed step by step; beyond it only recorded steps are kept.
MAX_DENSE_STEPS = 5_000_000


@dataclasses.dataclass
class InputsSeries:
    """The inputs family of one run.

    Attributes:
      run: the run name.
      replicas: global replica ids, the order of every per-replica axis.
      devices: device of each replica.
      source: "fit", "custom_loop" or "inspect_dataset".
      steps: int64 array [S]: every observed step from the first to the last recorded one
        (not the plain steps of `write.variants`, between logged and sampled steps).
      batch_size: int64 array [S, R]: batch size per step and replica, exact at every observed
        step (rebuilt from the shape-change events, each holding until the next one).
      shape_events: list of dicts `{"step", "inputs": [{"name", "dtypes", "shapes", "mismatch",
        "mismatch_dims"}]}`, one per step where shapes or dtypes changed.
      dense_steps: int64 array [D]: steps of the dense batch-size series.
      dense: int64 array [D, 3, R]: (value, window min, window max) at those steps.
      notes: plain-language problems met while reading.
      worker: for one worker's run of a multi-worker job, its place in the job (`task_type`,
        `task_index`, `worker`, `num_workers`, `job`); None otherwise.
      workers: for a multi-worker job, the per-worker grouping of the replica axis: one dict per
        worker, in replica order, `{"run", "name", "task_type", "task_index", "worker",
        "replicas", "devices"}`; empty for a single-worker run.
      strategy: "ParameterServerStrategy" for a run of that strategy (replica r is worker r,
        written by the coordinator), else "".
    """

    run: str
    replicas: list
    devices: list
    source: str
    steps: np.ndarray
    batch_size: np.ndarray
    shape_events: list
    dense_steps: np.ndarray
    dense: np.ndarray
    notes: list
    worker: dict | None = None
    workers: list = dataclasses.field(default_factory=list)
    strategy: str = ""

    @property
    def num_replicas(self):
        return len(self.replicas)


def parse_shape_event(step, document):
    """Parses one shapes event (the JSON string written by the probe).

    Args:
      step: the event's step.
      document: the JSON text (str or bytes).

    Returns:
      A dict with `step`, `inputs` (each with `mismatch` and `mismatch_dims` added), `devices`,
      `replicas` and `source`.

    Raises:
      ValueError: if the document is not a shapes event.
    """
    if isinstance(document, bytes):
        document = document.decode("utf-8")
    parsed = json.loads(document)
    if not isinstance(parsed, dict) or not isinstance(parsed.get("inputs"), list):
        raise ValueError("not a shapes event")
    inputs = parse_leaf_entries(parsed["inputs"])
    worker = parsed.get("worker")
    return {
        "step": int(step),
        "inputs": inputs,
        "devices": [str(d) for d in parsed.get("devices", [])],
        "replicas": [int(r) for r in parsed.get("replicas", [])],
        "source": str(parsed.get("source", "")),
        "strategy": str(parsed.get("strategy", "")),
        "worker": _parse_worker(worker) if isinstance(worker, dict) else None,
        # The last step observed before this one (the steps between were not: plain steps).
        "previous": int(parsed["previous"]) if "previous" in parsed else None,
    }


def _parse_worker(worker):
    return {
        "task_type": str(worker.get("task_type", "worker")),
        "task_index": int(worker.get("task_index", 0)),
        "worker": int(worker.get("worker", worker.get("task_index", 0))),
        "num_workers": int(worker.get("num_workers", 0)),
        "job": str(worker.get("job", "")),
    }


def event_batch_sizes(event):
    """Per-replica batch size of a shapes event: leading dim of the first input of rank >= 1."""
    for entry in event["inputs"]:
        if entry["shapes"] and all(len(shape) >= 1 for shape in entry["shapes"]):
            return [shape[0] for shape in entry["shapes"]]
    return [1] * (len(event["inputs"][0]["shapes"]) if event["inputs"] else 0)


def build_inputs_series(run, shape_events, dense_points, notes=()):
    """Builds an `InputsSeries` from decoded samples (pure; no data provider needed).

    Args:
      run: the run name.
      shape_events: parsed shapes events (`parse_shape_event`), any order.
      dense_points: list of `(step, array [3, R])` of the dense batch-size series.
      notes: notes collected so far.

    Returns:
      An `InputsSeries`.
    """
    notes = list(notes)
    by_step = {}
    for event in shape_events:
        by_step[event["step"]] = event  # a later write at the same step wins
    events = [by_step[s] for s in sorted(by_step)]
    sizes_of = [event_batch_sizes(e) for e in events]
    dense_groups = columns.by_shape(dense_points, np.int64)
    num_replicas = _replica_count(dense_groups, sizes_of, notes)
    kept = [i for i, sizes in enumerate(sizes_of) if len(sizes) == num_replicas]
    events = [events[i] for i in kept]
    sizes_of = [sizes_of[i] for i in kept]
    dense_steps, dense = np.zeros(0, np.int64), np.zeros((0, 3, num_replicas), np.int64)
    for group in dense_groups:
        if group.shape == (3, num_replicas):
            order = np.argsort(group.steps, kind="stable")
            dense_steps, dense = group.steps[order], group.values[order]
    if events:
        steps, batch_size = _every_step_sizes(events, sizes_of, dense_steps, dense, notes)
    else:
        steps = dense_steps
        batch_size = dense[:, 0, :] if dense.size else np.zeros((0, num_replicas), np.int64)
        if dense_steps.size:
            notes.append("No shape events were found; batch sizes are shown at logged steps only.")
    last_event = (events[-1] if events else None) or {}
    return InputsSeries(
        run=run,
        replicas=[int(r) for r in last_event.get("replicas") or range(num_replicas)],
        devices=[str(d) for d in last_event.get("devices") or [""] * num_replicas],
        source=last_event.get("source", ""),
        steps=steps,
        batch_size=batch_size,
        shape_events=events,
        dense_steps=dense_steps,
        dense=dense,
        notes=notes,
        worker=last_event.get("worker"),
        strategy=last_event.get("strategy", ""),
    )


def _replica_count(dense_groups, sizes_of, notes):
    """The run's replica count: the largest of its samples' (a note when they differ).

    Args:
      dense_groups: the run's batch-size samples by shape (`columns.Shaped`).
      sizes_of: the batch sizes of each shapes event.
      notes: the run's notes (appended to: samples of another layout, counts that differ).

    Returns:
      The number of replicas (0 without samples).
    """
    layout = [len(group.shape) == 2 and group.shape[0] == 3 for group in dense_groups]
    malformed = sum(len(group) for group, ok in zip(dense_groups, layout, strict=True) if not ok)
    if malformed:
        notes.append(f"{malformed} batch-size sample(s) of an unexpected layout skipped.")
    counts = {group.shape[-1] for group, ok in zip(dense_groups, layout, strict=True) if ok}
    counts |= {len(sizes) for sizes in sizes_of}
    if len(counts) > 1:
        notes.append(
            f"The replica count changes within this run ({sorted(counts)}); only data with "
            f"{max(counts)} replicas is shown."
        )
    return max(counts) if counts else 0


def _observed(steps, events):
    """`steps` without those no step observed: the steps between an event and the last step
    observed before it (its `"previous"`), where the probe ran plain steps (`write.variants`)."""
    keep = np.ones(steps.shape, bool)
    for event in events:
        previous = event.get("previous")
        if previous is not None and 0 <= previous < event["step"] - 1:
            keep &= (steps <= previous) | (steps >= event["step"])
    return steps[keep]


def _every_step_sizes(events, sizes_of, dense_steps, dense, notes):
    """Each replica's batch size at every step, rebuilt from the shapes events (each holds
    until the next) and corrected by the dense series where events are missing.

    Args:
      events: the shapes events (by step, at least one); sizes_of: their batch sizes.
      dense_steps, dense: the dense series' steps and `[S, 3, R]` values.
      notes: the run's notes (appended to: steps too wide to rebuild, missing events).

    Returns:
      `(steps, batch_size)`: int64 `[T]` (every step observed from the first event's to the
      last recorded, or only the recorded steps when that range is too wide) and `[T, R]`.
    """
    event_steps = np.array([e["step"] for e in events], dtype=np.int64)
    event_sizes = np.array(sizes_of, dtype=np.int64)
    first = int(event_steps[0])
    last = int(max(event_steps[-1], dense_steps[-1] if dense_steps.size else first))
    if last - first + 1 <= MAX_DENSE_STEPS:
        steps = np.arange(first, last + 1, dtype=np.int64)
    else:
        steps = np.union1d(event_steps, dense_steps[dense_steps >= first])
        notes.append("Steps span too wide a range to rebuild every step; recorded steps only.")
    steps = _observed(steps, events)
    index = np.searchsorted(event_steps, steps, side="right") - 1
    batch_size = event_sizes[index]
    if not dense_steps.size:
        return steps, batch_size
    at = np.searchsorted(steps, dense_steps)
    ok = (at < steps.size) & (steps[np.minimum(at, steps.size - 1)] == dense_steps)
    disagree = ok.copy()
    disagree[ok] = np.any(batch_size[at[ok]] != dense[ok, 0], axis=1)
    if np.any(disagree):
        notes.append(
            "Some shape-change events are missing (TensorBoard keeps a sample of each "
            "series by default): start TensorBoard with --samples_per_plugin "
            f"{plugin_data.PLUGIN_NAME}=0 to see every step exactly."
        )
        batch_size = batch_size.copy()
        batch_size[at[disagree]] = dense[disagree, 0]
    return steps, batch_size


def from_samples(run, samples, notes, needed=None):
    """Builds the `InputsSeries` of a run from its raw samples (see `RunData.samples`).

    Args:
      run: the run name.
      samples: `{tag: [(step, numpy value)]}` sorted by step.
      notes: the run's notes list: the series shares it, problems are appended to it.
      needed: unused (inputs needs no other family).

    Returns:
      An `InputsSeries` (empty arrays when the run has no inputs tags): never None.
    """
    shape_events = []
    bad = 0
    for step, value in samples.get(schema.TAG_SHAPES, []):
        try:
            shape_events.append(parse_shape_event(step, value.item()))
        except (ValueError, KeyError, TypeError, AttributeError):
            bad += 1
    if bad:
        notes.append(f"{bad} unreadable shapes event(s) skipped.")
    dense_points = samples.get(schema.TAG_BATCH_SIZE, [])
    # The series shares the run's notes list: a note added by any family shows once.
    series = build_inputs_series(run, shape_events, dense_points)
    notes.extend(series.notes)
    series.notes = notes
    return series


@dataclasses.dataclass
class _Part:
    """What the job keeps of one worker's inputs: its identity, the steps it covers, its batch
    sizes as the steps where they change (each holding until the next) and its shape events."""

    replicas: list
    devices: list
    source: str
    first: int | None = None  # its steps: first..last, or `steps` when they have gaps
    last: int | None = None
    steps: np.ndarray | None = None
    changes: list = dataclasses.field(default_factory=list)  # [(step, int64 [R])]
    events: list = dataclasses.field(default_factory=list)

    def step_axis(self):
        """int64: every step it covers."""
        if self.steps is not None:
            return self.steps
        if self.first is None:
            return np.zeros(0, np.int64)
        return np.arange(self.first, self.last + 1, dtype=np.int64)


class InputsMerger(jobs.Merger):
    """The inputs family of a job: every worker's series on one global replica axis.

    Per step, each worker's batch sizes and shapes at that step (held from its last change):
    the steps are those any worker covers, a worker's batch sizes are kept as the steps where
    they change, and its shape events as they are (both small), so the job's `[steps, replicas]`
    array is built from them (`result`). The dense series is kept at the steps every worker
    logged.

    Example:
      >>> merger = InputsMerger(expected_workers=2)
      >>> for slot, member in enumerate(members):
      ...     merger.add(slot, member, None)
      >>> merger.result("job", [0, 1], workers, []).batch_size.tolist()
      [[4, 4, 3, 3], [4, 4, 3, 3]]
    """

    attribute = "inputs"

    def __init__(self, expected_workers=1):
        super().__init__(expected_workers)
        self.axis = jobs.ReplicaAxis()
        self.parts = {}
        self.dense = jobs.StepArrays(expected_workers)
        self._events_of, self._events = None, []  # `_shape_events`' last merge and its parts

    def add(self, slot, member, since):
        """Takes worker `slot`'s batch sizes, shape events and dense series from `since` on.

        Raises:
          jobs.Irregular: if the worker's replicas or devices changed.
        """
        series = self.series_of(slot, member)
        part = self.parts.setdefault(slot, _Part(series.replicas, series.devices, series.source))
        if (part.replicas, part.devices) != (series.replicas, series.devices):
            raise jobs.Irregular(f"worker slot {slot}: other replicas")
        part.source = series.source or part.source
        columns = self.axis.add(slot, series.num_replicas)
        keep = series.steps >= since if since is not None else np.ones(series.steps.size, bool)
        self._take_steps(part, series.steps[keep])
        self._take_changes(part, series.steps[keep], series.batch_size[keep], since)
        part.events = [e for e in part.events if since is None or e["step"] < since] + [
            e for e in series.shape_events if since is None or e["step"] >= since
        ]
        self._take_dense(slot, series, columns, since)

    @staticmethod
    def _take_steps(part, steps):
        """Extends the steps `part` covers by `steps` (from its last one on)."""
        if not steps.size:
            return
        if part.first is None:
            part.first = int(steps[0])
        elif part.steps is None and steps[0] > part.last + 1:
            part.steps = part.step_axis()  # a gap: every step kept from now on
        contiguous = steps[-1] - steps[0] + 1 == steps.size
        if part.steps is not None or not contiguous:
            previous = part.step_axis()
            part.steps = np.union1d(previous[previous < steps[0]], steps)
        part.last = int(steps[-1])

    @staticmethod
    def _take_changes(part, steps, sizes, since):
        """Keeps the steps from which `part`'s batch sizes change (from `since` on)."""
        if since is not None:
            part.changes = [c for c in part.changes if c[0] < since]
        previous = part.changes[-1][1] if part.changes else None
        if not steps.size:
            return
        differs = np.ones(steps.size, bool)
        differs[1:] = np.any(sizes[1:] != sizes[:-1], axis=1)
        if previous is not None and np.array_equal(previous, sizes[0]):
            differs[0] = False
        part.changes.extend((int(steps[i]), sizes[i].copy()) for i in np.flatnonzero(differs))

    def _take_dense(self, slot, series, columns, since):
        if not self.dense.arrays:
            width = self.expected_workers * series.num_replicas
            self.dense.declare("dense", (3, width), np.int64, 0, (1,))
        self.dense.widen(self.axis.total)
        keep = series.dense_steps >= since if since is not None else slice(None)
        rows = self.dense.place(slot, series.dense_steps[keep])
        self.dense.write(slot, "dense", rows, columns, series.dense[keep])

    def _shape_events(self, parts):
        """`merge_shape_events(parts)`, merged again only when some part's events changed
        (`add` replaces a part's events from its new steps on; a look that finds new steps
        usually finds no new shape event)."""
        held = [(p, list(p.events)) for p in parts]  # held: the same objects, compared by id
        last = self._events_of
        if (
            last is None
            or len(last) != len(held)
            or not all(
                p is q and len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
                for (p, a), (q, b) in zip(held, last, strict=True)
            )
        ):
            self._events_of, self._events = held, merge_shape_events(parts)
        return self._events

    def result(self, job, order, workers, notes):
        """The job's `InputsSeries`: replicas of every worker in worker order; per step, each
        worker's batch sizes (held from its nearest step where it has none)."""
        parts = [self.parts.get(slot) or _Part([], [], "") for slot in order]
        with_steps = [p for p in parts if p.first is not None]
        ranges = {(p.first, p.last) for p in with_steps}
        if len(ranges) > 1 or len(with_steps) < len(parts):
            notes.append(
                "The workers recorded different step ranges; a worker's batch sizes are held from "
                "its nearest recorded step where it has none."
            )
        steps = _union_steps(with_steps)
        self.dense.drop_dead()
        rows, total = self.dense.complete_rows(), self.axis.total
        dense_steps = np.asarray(self.dense.steps[rows], np.int64)
        dense = (
            self.dense.view("dense", rows, total, self.axis.order(order))
            if self.dense.arrays
            else np.zeros((0, 3, total), np.int64)
        )
        sources = {p.source for p in parts if p.source}
        return InputsSeries(
            run=job,
            replicas=[r for p in parts for r in p.replicas],
            devices=[d for p in parts for d in p.devices],
            source=sources.pop() if len(sources) == 1 else ",".join(sorted(sources)),
            steps=steps,
            batch_size=_held_sizes(parts, steps, total),
            shape_events=self._shape_events(parts),
            dense_steps=dense_steps,
            dense=dense,
            notes=notes,
            workers=workers,
        )


def _union_steps(parts):
    """int64: the steps any of `parts` covers, sorted."""
    if not parts:
        return np.zeros((0,), np.int64)
    if all(p.steps is None for p in parts) and len({(p.first, p.last) for p in parts}) == 1:
        return parts[0].step_axis()
    return np.unique(np.concatenate([p.step_axis() for p in parts]))


def _held_sizes(parts, steps, total):
    """int64 [S, R]: each part's batch sizes at `steps`, held from its nearest step (its first
    where it has none before); zeros for a part without steps."""
    sizes = np.zeros((steps.size, total), np.int64)
    column = 0
    for part in parts:
        width = len(part.replicas)
        if part.changes:
            starts = np.array([c[0] for c in part.changes], np.int64)
            values = np.stack([c[1] for c in part.changes])
            index = np.maximum(np.searchsorted(starts, steps, side="right") - 1, 0)
            sizes[:, column : column + width] = values[index]
        column += width
    return sizes


def merge_shape_events(parts):
    """The job's shape events: at every step where some worker's changed, each input's dtypes
    and shapes over every worker (each worker's event in force there, else its first)."""
    event_steps = sorted({e["step"] for p in parts for e in p.events})
    events = []
    for step in event_steps:
        in_force = []
        for part in parts:
            before = [e for e in part.events if e["step"] <= step]
            in_force.append(before[-1] if before else (part.events or [None])[0])
        names = []
        for event in in_force:
            for entry in (event or {}).get("inputs", []):
                if entry["name"] not in names:
                    names.append(entry["name"])
        inputs = [_merged_input(name, parts, in_force) for name in names]
        events.append({"step": step, "inputs": inputs})
    return events


def _merged_input(name, parts, in_force):
    """One input's entry of a job's shape event, over every worker's event in force."""
    dtypes, shapes, kinds, structure = [], [], [], []
    for part, event in zip(parts, in_force, strict=True):
        entries = (event or {}).get("inputs", [])
        entry = next((e for e in entries if e["name"] == name), None)
        count = len(part.replicas)
        if entry is None:
            dtypes += ["missing"] * count
            shapes += [[]] * count
            kinds += ["missing"] * count
            structure += [[-1, -1, -1]] * count
        else:
            dtypes += entry["dtypes"]
            shapes += entry["shapes"]
            kinds += entry.get("kinds", ["dense"] * count)
            structure += entry.get("structure", [[-1, -1, -1]] * count)
    composite = any(k not in ("dense", "missing") for k in kinds)
    dims = mismatch_dims(dtypes, shapes, kinds if composite else None)
    merged = {
        "name": name,
        "dtypes": dtypes,
        "shapes": shapes,
        "mismatch": bool(dims),
        "mismatch_dims": dims,
    }
    if composite:
        merged.update(kinds=kinds, structure=structure)
    return merged


def worker_identity(series):
    """`{"worker", "replicas", "devices"}` of a worker's run (its shapes events), else None."""
    if series is None or series.worker is None:
        return None
    return {"worker": series.worker, "replicas": series.replicas, "devices": series.devices}
