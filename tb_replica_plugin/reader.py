"""Reads this plugin's series through a TensorBoard data provider into numpy arrays.

Used by the plugin routes (TensorBoard's provider: Python loader or RustBoard), by
`tb-replica report` and by `tb_replica_plugin.load` (a local provider over a log dir that keeps
every sample). Imports no TensorFlow.
"""

import bisect
import collections
import dataclasses
import fnmatch
import json
import re

import numpy as np

from tb_replica_plugin import metadata

TAG_TIME = metadata.TAG_STEP_TIME
# More samples than any run writes: read_tensors must return every sample it kept.
ALL_SAMPLES = 10_000_000
# Largest step range reconstructed step by step; beyond it only recorded steps are kept.
MAX_DENSE_STEPS = 5_000_000


class RunNotFoundError(KeyError):
    """Raised when a run has no data of this plugin."""


@dataclasses.dataclass
class InputsSeries:
    """The inputs family of one run.

    Attributes:
      run: the run name.
      replicas: global replica ids, the order of every per-replica axis.
      devices: device of each replica.
      source: "fit", "custom_loop" or "inspect_dataset".
      steps: int64 array [S]: every step from the first to the last recorded one.
      batch_size: int64 array [S, R]: batch size per step and replica, exact at every step
        (rebuilt from the shape-change events, each holding until the next one).
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

    @property
    def num_replicas(self):
        return len(self.replicas)


def _mismatch_dims(dtypes, shapes):
    """Which parts of one input disagree across replicas ("dtype", "rank", dim indices)."""
    dims = []
    if len(set(dtypes)) > 1:
        dims.append("dtype")
    ranks = {len(shape) for shape in shapes}
    if len(ranks) > 1:
        dims.append("rank")
    else:
        rank = ranks.pop() if ranks else 0
        dims.extend(d for d in range(1, rank) if len({shape[d] for shape in shapes}) > 1)
    return dims


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
    inputs = []
    for entry in parsed["inputs"]:
        dtypes = [str(d) for d in entry["dtypes"]]
        shapes = [[int(d) for d in shape] for shape in entry["shapes"]]
        dims = _mismatch_dims(dtypes, shapes)
        inputs.append(
            {
                "name": str(entry["name"]),
                "dtypes": dtypes,
                "shapes": shapes,
                "mismatch": bool(dims),
                "mismatch_dims": dims,
            }
        )
    worker = parsed.get("worker")
    return {
        "step": int(step),
        "inputs": inputs,
        "devices": [str(d) for d in parsed.get("devices", [])],
        "replicas": [int(r) for r in parsed.get("replicas", [])],
        "source": str(parsed.get("source", "")),
        "worker": _parse_worker(worker) if isinstance(worker, dict) else None,
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
    dense_points = sorted(
        ((int(s), np.asarray(v, dtype=np.int64)) for s, v in dense_points), key=lambda p: p[0]
    )
    malformed = sum(1 for _, v in dense_points if v.ndim != 2 or v.shape[0] != 3)
    if malformed:
        notes.append(f"{malformed} batch-size sample(s) of an unexpected layout skipped.")
    counts = {v.shape[-1] for _, v in dense_points if v.ndim == 2 and v.shape[0] == 3}
    counts |= {len(sizes) for sizes in sizes_of}
    if len(counts) > 1:
        notes.append(
            f"The replica count changes within this run ({sorted(counts)}); only data with "
            f"{max(counts)} replicas is shown."
        )
    num_replicas = max(counts) if counts else 0
    kept = [i for i, sizes in enumerate(sizes_of) if len(sizes) == num_replicas]
    events = [events[i] for i in kept]
    sizes_of = [sizes_of[i] for i in kept]
    dense_points = [(s, v) for s, v in dense_points if v.shape == (3, num_replicas)]
    dense_steps = np.array([s for s, _ in dense_points], dtype=np.int64)
    dense = (
        np.stack([v for _, v in dense_points])
        if dense_points
        else np.zeros((0, 3, num_replicas), np.int64)
    )
    last_event = events[-1] if events else None
    replicas = (last_event or {}).get("replicas") or list(range(num_replicas))
    devices = (last_event or {}).get("devices") or [""] * num_replicas
    source = (last_event or {}).get("source", "")

    if events:
        event_steps = np.array([e["step"] for e in events], dtype=np.int64)
        event_sizes = np.array(sizes_of, dtype=np.int64)
        first = int(event_steps[0])
        last = int(max(event_steps[-1], dense_steps[-1] if dense_steps.size else first))
        if last - first + 1 <= MAX_DENSE_STEPS:
            steps = np.arange(first, last + 1, dtype=np.int64)
        else:
            steps = np.union1d(event_steps, dense_steps[dense_steps >= first])
            notes.append("Steps span too wide a range to rebuild every step; recorded steps only.")
        index = np.searchsorted(event_steps, steps, side="right") - 1
        batch_size = event_sizes[index]
        if dense_steps.size:
            at = np.searchsorted(steps, dense_steps)
            ok = (at < steps.size) & (steps[np.minimum(at, steps.size - 1)] == dense_steps)
            disagree = ok.copy()
            disagree[ok] = np.any(batch_size[at[ok]] != dense[ok, 0], axis=1)
            if np.any(disagree):
                notes.append(
                    "Some shape-change events are missing (TensorBoard keeps a sample of each "
                    "series by default): start TensorBoard with --samples_per_plugin "
                    f"{metadata.PLUGIN_NAME}=0 to see every step exactly."
                )
                batch_size = batch_size.copy()
                batch_size[at[disagree]] = dense[disagree, 0]
    else:
        steps = dense_steps
        batch_size = dense[:, 0, :] if dense.size else np.zeros((0, num_replicas), np.int64)
        if dense_steps.size:
            notes.append("No shape events were found; batch sizes are shown at logged steps only.")
    return InputsSeries(
        run=run,
        replicas=[int(r) for r in replicas],
        devices=[str(d) for d in devices],
        source=source,
        steps=steps,
        batch_size=batch_size,
        shape_events=events,
        dense_steps=dense_steps,
        dense=dense,
        notes=notes,
        worker=(last_event or {}).get("worker"),
    )


@dataclasses.dataclass
class GradientsSeries:
    """The gradients family of one run: local (pre all-reduce) gradient health per replica.

    Attributes:
      run: the run name.
      replicas: global replica ids, the order of every per-replica axis.
      variables: names of the variables whose gradient norms are recorded (V).
      shapes: shape of each variable.
      has_loss: whether the replicas' losses were recorded (else `loss` is NaN).
      scaling: what the norms are of: "replica_loss" (the gradient of each replica's own loss,
        Keras distribution scaling and loss scale undone) or "as_given" (as passed, divided by
        the `scale` given to `observe_gradients`).
      steps: int64 [S]: the logged steps (dense series).
      global_norm: float64 [S, R]: each replica's local gradient global norm.
      loss: float64 [S, R]: each replica's local loss.
      variable_norms: float64 [S, V, R]: the norm of each variable's gradient per replica.
      nonfinite_steps: int64 [E]: every step at which some replica had a NaN or Inf (gradients
        or loss), logged or not.
      nonfinite: int64 [E, 4, R]: at those steps, per replica: NaN values in gradients, Inf
        values in gradients, loss is NaN (0/1), loss is Inf (0/1).
      loss_scaled: whether a loss-scale optimizer was in use (`fit` with mixed precision): its
        overflow steps are expected and skipped by the optimizer.
    """

    run: str
    replicas: list
    variables: list
    shapes: list
    has_loss: bool
    scaling: str
    steps: np.ndarray
    global_norm: np.ndarray
    loss: np.ndarray
    variable_norms: np.ndarray
    nonfinite_steps: np.ndarray
    nonfinite: np.ndarray
    loss_scaled: bool = False

    @property
    def num_replicas(self):
        return len(self.replicas)


def gradients_from_samples(run, samples, notes):
    """Builds the `GradientsSeries` of a run from its raw samples, or None without any.

    Args:
      run: the run name.
      samples: `RunData.samples`, `{tag: [(step, numpy value)]}` sorted by step.
      notes: the run's notes list (problems are appended to it).

    Returns:
      A `GradientsSeries`, or None when the run has no gradient tags.
    """
    tags = (metadata.TAG_GRAD_NORMS, metadata.TAG_GRAD_NONFINITE, metadata.TAG_GRAD_VARIABLES)
    if not any(samples.get(tag) for tag in tags):
        return None
    documents = []
    for step, value in samples.get(metadata.TAG_GRAD_VARIABLES, []):
        try:
            text = value.item()
            text = text.decode("utf-8") if isinstance(text, bytes) else text
            parsed = json.loads(text)
            documents.append((step, parsed, [str(n) for n in parsed["variables"]]))
        except (ValueError, KeyError, TypeError, AttributeError):
            notes.append(f"An unreadable gradients/variables event at step {step} was skipped.")
    last = documents[-1][1] if documents else {}
    names = documents[-1][2] if documents else []
    dense = [
        (int(step), np.asarray(value, np.float64))
        for step, value in samples.get(metadata.TAG_GRAD_NORMS, [])
        if np.ndim(value) == 2
    ]
    counts = {value.shape for _, value in dense}
    if documents:
        width = len(names) + 2
    elif dense:
        width = dense[-1][1].shape[0]
        names = [f"variable {i}" for i in range(width - 2)]
    else:
        width = None
    replicas_of = {value.shape[1] for _, value in dense}
    nonfinite = [
        (int(step), np.asarray(value, np.int64))
        for step, value in samples.get(metadata.TAG_GRAD_NONFINITE, [])
        if np.ndim(value) == 2 and np.shape(value)[0] == 4
    ]
    replicas_of |= {value.shape[1] for _, value in nonfinite}
    num_replicas = len(last.get("replicas", [])) or (max(replicas_of) if replicas_of else 0)
    kept = [(s, v) for s, v in dense if v.shape == (width, num_replicas)]
    if len(kept) < len(dense) or len(counts) > 1:
        notes.append(
            f"{len(dense) - len(kept)} gradient-norm sample(s) with another variable or replica "
            "count were skipped (only the last variable list is shown)."
        )
    nonfinite = [(s, v) for s, v in nonfinite if v.shape[1] == num_replicas]
    by_step = dict(kept)  # a later write at the same step wins
    steps = np.array(sorted(by_step), np.int64)
    stacked = (
        np.stack([by_step[s] for s in steps.tolist()])
        if steps.size
        else np.zeros((0, (width or 2), num_replicas))
    )
    events = dict(nonfinite)
    event_steps = np.array(sorted(events), np.int64)
    return GradientsSeries(
        run=run,
        replicas=[int(r) for r in last.get("replicas", range(num_replicas))],
        variables=names,
        shapes=[list(s) for s in last.get("shapes", [[]] * len(names))],
        has_loss=bool(last.get("loss", False)),
        scaling=str(last.get("scaling", "")),
        steps=steps,
        global_norm=stacked[:, 0, :],
        loss=stacked[:, 1, :],
        variable_norms=stacked[:, 2:, :],
        nonfinite_steps=event_steps,
        nonfinite=(
            np.stack([events[s] for s in event_steps.tolist()])
            if event_steps.size
            else np.zeros((0, 4, num_replicas), np.int64)
        ),
        loss_scaled=bool(last.get("loss_scaled", False)),
    )


def list_runs(provider, ctx, experiment_id):
    """Runs with data of this plugin.

    Args:
      provider: a TensorBoard `DataProvider`.
      ctx: the `RequestContext`.
      experiment_id: the experiment id ("" for a local log dir).

    Returns:
      A dict `{run: {tag: TensorTimeSeries}}`, runs sorted by name.
    """
    mapping = provider.list_tensors(
        ctx, experiment_id=experiment_id, plugin_name=metadata.PLUGIN_NAME
    )
    return {run: mapping[run] for run in sorted(mapping)}


@dataclasses.dataclass
class RngSeries:
    """The rng family of one run, at its logged steps.

    Attributes:
      run: the run name.
      replicas, devices: as in `InputsSeries`.
      generators: one dict per generator: `name`, `kind` ("keras.SeedGenerator" or
        "tf.random.Generator"), `layer`, `layer_class`, `mirrored`, `state_size`.
      steps: int64 [S], the logged steps.
      fingerprint: int64 [S, G, R], stream fingerprint of each generator's next draw per replica:
        equal values mean equal random numbers.
      state: int64 [S, G, R, W], state words (zero-padded beyond `state_size`).
      notes: plain-language problems met while reading.
    """

    run: str
    replicas: list
    devices: list
    generators: list
    steps: np.ndarray
    fingerprint: np.ndarray
    state: np.ndarray
    notes: list

    @property
    def num_replicas(self):
        return len(self.replicas)


@dataclasses.dataclass
class DataSeries:
    """The data family of one run, at its logged steps (each closing a window of steps).

    Attributes:
      run, replicas: as in `InputsSeries` (replica order of every per-replica axis).
      steps: int64 [S], the logged steps.
      window_steps: int64 [S], steps in the window each logged step closes (1 when every step
        is logged).
      batch_size, distinct: int64 [S, R], examples and distinct examples at the logged step.
      duplicated: int64 [S, R], distinct examples of that replica also fed to another replica
        at that step; `window_duplicated` the same summed over the window.
      shared: int64 [S, R, R], distinct examples fed to both replicas at the logged step
        (diagonal: distinct examples); `window_shared` summed over the window.
      steps_shared: int64 [S, R, R], steps of the window where the two replicas shared at least
        one example (diagonal: `window_steps`).
      sketch: int64 [S, R, K], bottom-K sketch of each replica's example fingerprints (the first
        `min(distinct, K)` entries are valid).
      notes: plain-language problems met while reading.
      window_start: int64 [S], first step of the window each logged step closes (the step after
        the previous logged step; for the first, the run's first step when known). None: not
        known, taken as `steps - window_steps + 1` (exact when every step was sampled).
      sampled: True when some window holds steps that were not sampled (`examples_every` > 1):
        `window_steps`, the window sums and `steps_shared` then count sampled steps only. A
        step that was not sampled is simply absent: it is never a step with 0 examples.
    """

    run: str
    replicas: list
    steps: np.ndarray
    window_steps: np.ndarray
    batch_size: np.ndarray
    distinct: np.ndarray
    duplicated: np.ndarray
    window_duplicated: np.ndarray
    shared: np.ndarray
    window_shared: np.ndarray
    steps_shared: np.ndarray
    sketch: np.ndarray
    notes: list
    window_start: np.ndarray | None = None
    sampled: bool = False

    @property
    def num_replicas(self):
        return len(self.replicas)

    def window_starts(self):
        """int64 [S]: `window_start`, or `steps - window_steps + 1` when it is not known."""
        if self.window_start is not None:
            return self.window_start
        return self.steps - np.maximum(self.window_steps, 1) + 1


def rng_from_samples(run, samples, notes):
    """Builds the `RngSeries` of a run from its raw samples, or None when it has none.

    A streams sample is read with the latest generators document written at or before its step,
    when their layouts (generator count) match; the layout of the last logged step wins.
    """
    streams = samples.get(metadata.TAG_RNG_STREAMS, [])
    if not streams:
        return None
    documents = {}
    for step, value in samples.get(metadata.TAG_RNG_GENERATORS, []):
        try:
            text = value.item()
            documents[step] = json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
        except (ValueError, AttributeError, UnicodeDecodeError):
            continue
    # The document is written at the first logged step of each layout: each streams sample
    # takes the latest document written at or before its step.
    document_steps = sorted(documents)
    paired = []
    for step, value in streams:
        at = bisect.bisect_right(document_steps, step) - 1
        document = documents[document_steps[at]] if at >= 0 else None
        if document is None or value.ndim != 3:
            continue
        if value.shape[0] != len(document.get("generators", [])):
            continue
        paired.append((step, value, document))
    if not paired:
        notes.append("rng: no readable generator series (missing generator names).")
        return None
    last = paired[-1][2]
    layout = [g.get("name") for g in last["generators"]]
    kept = [
        (step, value)
        for step, value, document in paired
        if [g.get("name") for g in document["generators"]] == layout
        and value.shape == paired[-1][1].shape
    ]
    if len(kept) < len(streams):
        notes.append(
            f"rng: {len(streams) - len(kept)} logged step(s) with another generator layout "
            "were skipped."
        )
    values = np.stack([v for _, v in kept]).astype(np.int64)
    num = values.shape[2]
    return RngSeries(
        run=run,
        replicas=[int(r) for r in last.get("replicas", range(num))],
        devices=[str(d) for d in last.get("devices", [""] * num)],
        generators=[
            {
                "name": str(g.get("name")),
                "kind": str(g.get("kind", "")),
                "layer": g.get("layer"),
                "layer_class": g.get("layer_class"),
                "mirrored": bool(g.get("mirrored", False)),
                "state_size": int(g.get("state_size", values.shape[3] - 1)),
            }
            for g in last["generators"]
        ],
        steps=np.array([s for s, _ in kept], dtype=np.int64),
        fingerprint=values[:, :, :, 0],
        state=values[:, :, :, 1:],
        notes=notes,
    )


def data_from_samples(run, samples, notes, replicas=None, first_step=None):
    """Builds the `DataSeries` of a run from its raw samples, or None when it has none.

    Args:
      run: the run name.
      samples: `RunData.samples`.
      notes: the run's notes list (appended to).
      replicas: replica ids (from the inputs family); `range(R)` when None.
      first_step: the run's first step (from the inputs family), or None: the first window
        then starts `window_steps - 1` steps before its logged step.
    """
    examples = dict(samples.get(metadata.TAG_DATA_EXAMPLES, []))
    overlap = dict(samples.get(metadata.TAG_DATA_OVERLAP, []))
    steps = sorted(set(examples) & set(overlap))
    if not steps:
        return None
    counts = collections.Counter(examples[s].shape[0] for s in steps)
    num = counts.most_common(1)[0][0]
    kept = [
        s
        for s in steps
        if examples[s].ndim == 2
        and examples[s].shape[0] == num
        and examples[s].shape[1] >= 4
        and overlap[s].shape == (3, num, num)
    ]
    if len(kept) < len(steps):
        notes.append(f"data: {len(steps) - len(kept)} logged step(s) of another layout skipped.")
    if not kept:
        return None
    ex = np.stack([examples[s] for s in kept]).astype(np.int64)
    ov = np.stack([overlap[s] for s in kept]).astype(np.int64)
    if replicas is None or len(replicas) != num:
        replicas = list(range(num))
    steps = np.array(kept, dtype=np.int64)
    window_steps = np.diagonal(ov[:, 2], axis1=1, axis2=2)[:, 0].copy()
    # Windows run from the step after the previous logged step; with sampling (examples_every
    # > 1) they hold more steps than they sampled.
    start = steps - np.maximum(window_steps, 1) + 1
    start[1:] = steps[:-1] + 1
    if first_step is not None and first_step <= steps[0]:
        start[0] = first_step
    sampled = bool((window_steps < steps - start + 1).any())
    return DataSeries(
        run=run,
        replicas=[int(r) for r in replicas],
        steps=steps,
        window_steps=window_steps,
        batch_size=ex[:, :, 0],
        distinct=ex[:, :, 1],
        duplicated=ex[:, :, 2],
        window_duplicated=ex[:, :, 3],
        shared=ov[:, 0],
        window_shared=ov[:, 1],
        steps_shared=ov[:, 2],
        sketch=ex[:, :, 4:],
        notes=notes,
        window_start=start,
        sampled=sampled,
    )


@dataclasses.dataclass
class StepTimeSeries:
    """Per-worker step timing of a multi-worker job, at the steps every worker logged.

    Times are host wall-clock seconds taken in-graph (`tf.timestamp`) when a worker's inputs of
    the step were ready (where `observe_inputs` runs). In a synchronous job every worker waits
    at the all-reduce for the last one, so all workers have the same period; what differs is
    when they arrive. A worker's `busy` time is its period minus the time it waited for the
    last worker to arrive: the time per step it would take alone.

    Attributes:
      run: the job name.
      workers: worker names (`worker_0`, ...), the order of every per-worker axis.
      steps: int64 [S], steps logged by every worker.
      arrival: float64 [S, W], wall-clock seconds (since the epoch) of each worker's arrival.
      period: float64 [S, W], seconds since the worker's previous step (NaN at its first).
      window_mean: float64 [S, W], mean seconds per step over the logging window (NaN at first).
      lateness: float64 [S, W], seconds after the first worker's arrival at that step.
      busy: float64 [S, W], `max(0, period - (latest arrival - arrival))` (NaN where period is
        NaN).
    """

    run: str
    workers: list
    steps: np.ndarray
    arrival: np.ndarray
    period: np.ndarray
    window_mean: np.ndarray
    lateness: np.ndarray
    busy: np.ndarray


@dataclasses.dataclass
class VariablesSeries:
    """The variables family (weight drift and placement) of one run.

    Axes: S logged steps, V variables (the order of `variables`), R local replicas, K sketch
    buckets. Divergence is always of replica r's copy from replica 0's copy; it is exactly 0
    where the bitwise hashes are equal, and NaN where either replica holds no copy.

    Attributes:
      run: the run name.
      replicas: replica ids (the R axis); devices: the device of each replica.
      source: what wrote the run ("fit", "custom_loop").
      central_storage: the strategy keeps one copy of each variable on a parameter device on
        purpose (CentralStorageStrategy): variables are not expected to be mirrored.
      variables: one dict per variable, from the latest placement event: `name`, `shape`,
        `dtype`, `trainable`, `sync` ("on_write", "on_read", "none"), `devices` (of its copies),
        `columns` (replica position of each copy, -1 when on no replica device), `mirrored`.
      placement_events: `[(step, document)]` of every placement event.
      steps: int64 [S] logged steps (values after the update of that step).
      hash: int64 [S, V, R] bitwise hash of each copy; present: bool [V, R].
      stats: float64 [S, V, R, 4] (min, max, sum, sum of squares); sketch: [S, V, R, K].
      identical: bool [S, V, R]: copy r is bit-identical to copy 0 (hashes equal, by the same
        algorithm).
      hash_comparable: bool [V, R]: copies r and 0 exist and were hashed by the same algorithm
        (placement `"hash"` per copy: "farmhash64" on CPU, "mix64" elsewhere; logs of
        fingerprint version 1 used "mix64" everywhere). Elsewhere bit identity is unknown and
        only the sketch compares the copies.
      l2_estimate, rel_l2_estimate: float64 [S, V, R]: ||copy_r - copy_0|| and that over
        ||copy_0||, estimated from the sketches (exact for variables of at most K elements).
      max_abs_lower: float64 [S, V, R]: a lower bound of max |copy_r - copy_0| from the stats
        (exact for variables of at most K elements).
      exact: bool [S]: the exact check ran at that step; exact_max_abs, exact_l2, exact_rel_l2:
        float64 [S, V, R], NaN where it did not run.
      rel_l2, max_abs: float64 [S, V, R]: the exact value where it ran, else the estimate (rel
        L2) or the lower bound (max-abs).
      notes: plain-language problems met while reading.
    """

    run: str
    replicas: list
    devices: list
    source: str
    central_storage: bool
    variables: list
    placement_events: list
    steps: np.ndarray
    hash: np.ndarray
    present: np.ndarray
    stats: np.ndarray
    sketch: np.ndarray
    identical: np.ndarray
    hash_comparable: np.ndarray
    l2_estimate: np.ndarray
    rel_l2_estimate: np.ndarray
    max_abs_lower: np.ndarray
    exact: np.ndarray
    exact_max_abs: np.ndarray
    exact_l2: np.ndarray
    exact_rel_l2: np.ndarray
    rel_l2: np.ndarray
    max_abs: np.ndarray
    notes: list

    @property
    def num_replicas(self):
        return len(self.replicas)

    @property
    def names(self):
        return [v["name"] for v in self.variables]


def _relative(l2, norm0):
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = l2 / norm0
    rel = np.where((norm0 == 0) & (l2 == 0), 0.0, rel)
    return np.where((norm0 == 0) & (l2 > 0), np.inf, rel)


def build_variables_series(run, placement_events, hash_points, fingerprint_points, exact_points):
    """Builds a `VariablesSeries` from decoded samples (pure; no data provider needed).

    Args:
      run: the run name.
      placement_events: `[(step, document dict)]`.
      hash_points: `[(step, int64 [V, R])]`; fingerprint_points: `[(step, float64 [V, R, 4+K])]`;
        exact_points: `[(step, float64 [V, R, 2])]`.

    Returns:
      A `VariablesSeries`, or None when there is no placement event.
    """
    notes = []
    if not placement_events:
        return None
    placement_events = sorted(placement_events, key=lambda p: p[0])
    document = placement_events[-1][1]
    variables = list(document.get("variables", []))
    devices = [str(d) for d in document.get("devices", [])]
    replicas = [int(r) for r in document.get("replicas", range(len(devices)))]
    num_v, num_r = len(variables), len(devices)
    hashes = {s: v for s, v in hash_points if v.shape == (num_v, num_r)}
    fingerprints = {
        s: v for s, v in fingerprint_points if v.ndim == 3 and v.shape[:2] == (num_v, num_r)
    }
    exacts = {s: v for s, v in exact_points if v.shape == (num_v, num_r, 2)}
    dropped = {s for s, _ in hash_points} - set(hashes)
    if dropped or len(placement_events) > 1:
        notes.append(
            f"The variable list changed during this run ({len(placement_events)} placement "
            f"events); shown: the {num_v} variables of the last one"
            + (f", {len(dropped)} logged step(s) of other lists skipped." if dropped else ".")
        )
    steps = np.array(sorted(set(hashes) & set(fingerprints)), dtype=np.int64)
    width = next(iter(fingerprints.values())).shape[2] if fingerprints else 4
    hash_arr = np.stack([hashes[s] for s in steps]) if steps.size else np.zeros((0, num_v, num_r))
    hash_arr = hash_arr.astype(np.int64)
    fp = (
        np.stack([fingerprints[s] for s in steps]).astype(np.float64)
        if steps.size
        else np.zeros((0, num_v, num_r, width))
    )
    present = np.zeros((num_v, num_r), dtype=bool)
    algorithm = np.full((num_v, num_r), "mix64", dtype=object)  # fingerprint version 1: mix64
    sizes = np.zeros(num_v, dtype=np.float64)
    for index, variable in enumerate(variables):
        columns = variable.get("columns", [])
        algorithms = variable.get("hash") or ["mix64"] * len(columns)
        for column, name in zip(columns, algorithms, strict=False):
            if 0 <= column < num_r:
                present[index, column] = True
                algorithm[index, column] = str(name)
        shape = variable.get("shape") or []
        # Unknown dimensions: the sketch was hashed, never the exact small-variable copy.
        known = all(d is not None for d in shape)
        sizes[index] = float(np.prod(shape)) if known and shape else (1.0 if known else np.inf)
    stats, sketch = fp[..., :4], fp[..., 4:]
    both = present & present[:, :1]  # [V, R]: copies of r and of 0 exist
    comparable = both & (algorithm == algorithm[:, :1])
    identical = (hash_arr == hash_arr[:, :, :1]) & comparable[None]
    if (both & ~comparable).any():
        notes.append(
            "Some copies were hashed with a different algorithm than replica 0's (farmhash64 on "
            "CPU devices, mix64 on others): their bit identity is unknown, their drift is "
            "estimated from the sketches only."
        )
    nan = np.full(hash_arr.shape, np.nan)
    with np.errstate(invalid="ignore"):
        l2 = np.sqrt(np.sum(np.square(sketch - sketch[:, :, :1]), axis=-1))
        norm0 = np.sqrt(np.maximum(stats[:, :, :1, 3], 0.0))
        rel = _relative(l2, norm0)
        delta = np.abs(stats - stats[:, :, :1])
        lower = np.maximum(delta[..., 0], delta[..., 1])
        lower = np.maximum(lower, delta[..., 2] / np.maximum(sizes, 1.0)[None, :, None])
        lower = np.nan_to_num(lower, nan=np.nan, posinf=np.inf)
        small = (sizes <= sketch.shape[-1])[None, :, None]
        sketch_max = np.max(np.abs(sketch - sketch[:, :, :1]), axis=-1, initial=0.0)
        lower = np.where(small, np.maximum(lower, sketch_max), lower)
    l2 = np.where(identical, 0.0, np.where(both[None], l2, nan))
    rel = np.where(identical, 0.0, np.where(both[None], rel, nan))
    lower = np.where(identical, 0.0, np.where(both[None], lower, nan))
    exact = np.array([s in exacts for s in steps], dtype=bool)
    exact_max_abs = nan.copy()
    exact_l2 = nan.copy()
    for i, step in enumerate(steps):
        if step in exacts:
            exact_max_abs[i] = exacts[step][..., 0]
            exact_l2[i] = exacts[step][..., 1]
    exact_rel = _relative(exact_l2, norm0) if steps.size else nan.copy()
    exact_rel = np.where(np.isnan(exact_l2), np.nan, exact_rel)
    rel_best = np.where(exact[:, None, None], exact_rel, rel)
    max_abs_best = np.where(exact[:, None, None], exact_max_abs, lower)
    return VariablesSeries(
        run=run,
        replicas=replicas,
        devices=devices,
        source=str(document.get("source", "")),
        central_storage=bool(document.get("central", False)),
        variables=variables,
        placement_events=placement_events,
        steps=steps,
        hash=hash_arr,
        present=present,
        stats=stats,
        sketch=sketch,
        identical=identical,
        hash_comparable=comparable,
        l2_estimate=l2,
        rel_l2_estimate=rel,
        max_abs_lower=lower,
        exact=exact,
        exact_max_abs=exact_max_abs,
        exact_l2=exact_l2,
        exact_rel_l2=exact_rel,
        rel_l2=rel_best,
        max_abs=max_abs_best,
        notes=notes,
    )


def variables_from_samples(run, samples, notes):
    """Builds the `VariablesSeries` of a run from its raw samples, or None without any."""
    events = []
    bad = 0
    for step, value in samples.get(metadata.TAG_VARIABLE_PLACEMENT, []):
        try:
            raw = value.item()
            document = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
            if not isinstance(document.get("variables"), list):
                raise ValueError("not a placement event")
            events.append((step, document))
        except (ValueError, AttributeError, TypeError):
            bad += 1
    if bad:
        notes.append(f"{bad} unreadable variable placement event(s) skipped.")
    series = build_variables_series(
        run,
        events,
        samples.get(metadata.TAG_VARIABLE_HASH, []),
        samples.get(metadata.TAG_VARIABLE_FINGERPRINT, []),
        samples.get(metadata.TAG_VARIABLE_EXACT, []),
    )
    if series is not None:
        notes.extend(series.notes)
        series.notes = notes
    return series


@dataclasses.dataclass
class RunData:
    """Every family of one run, as read from the data provider.

    Each stat family (inputs, gradients, variables, ...) has one attribute holding its series
    dataclass, or None when the run has none of its tags. `samples` keeps the raw decoded
    samples per tag, `{tag: [(step, numpy value), ...]}` sorted by step, for family builders.

    A multi-worker job (the runs `<job>/worker_<i>` written by the workers of one
    `MultiWorkerMirroredStrategy` job) is one `RunData` named `<job>`: its families are merged
    over workers on global replica ids (see `JOB_MERGERS`), `workers` groups the replica axis by
    worker and `worker_runs` keeps each worker's own `RunData`.

    Attributes:
      run: the run (or job) name.
      inputs: the `InputsSeries` (empty arrays when the run has no inputs tags).
      rng: the `RngSeries`, or None when the run has no rng tags.
      data: the `DataSeries`, or None when the run has no data tags.
      variables: the `VariablesSeries` (weight drift and placement), or None.
      samples: raw samples per readable tag (empty for a job: see `worker_runs`).
      notes: plain-language problems met while reading (shared by every family).
      gradients: the `GradientsSeries`, or None when the run has no gradient tags.
      workers: for a job, one dict per worker in replica order (see `InputsSeries.workers`);
        empty for a single-worker run.
      worker_runs: for a job, `{run: RunData}` of its workers' runs.
      step_time: for a job, the `StepTimeSeries`; None otherwise.
    """

    run: str
    inputs: InputsSeries
    samples: dict
    notes: list
    rng: RngSeries | None = None
    data: DataSeries | None = None
    variables: VariablesSeries | None = None
    gradients: GradientsSeries | None = None
    workers: list = dataclasses.field(default_factory=list)
    worker_runs: dict = dataclasses.field(default_factory=dict)
    step_time: StepTimeSeries | None = None

    @property
    def is_job(self):
        return bool(self.workers)


def _readable_tags(tags_of_run, notes):
    """Tags whose metadata this version can read; the others get a note."""
    readable = []
    for tag, series in tags_of_run.items():
        try:
            content = metadata.parse_plugin_content(series.plugin_content)
        except metadata.UnsupportedSchemaError as error:
            notes.append(f"Series {tag!r} skipped: {error}")
            continue
        if metadata.TAG_KINDS.get(tag) == content.get("kind"):
            readable.append(tag)
    return readable


def read_run(provider, ctx, experiment_id, run, tags_of_run=None):
    """Reads every family of one run with a single `read_tensors` call.

    Args:
      provider: a TensorBoard `DataProvider`.
      ctx: the `RequestContext`.
      experiment_id: the experiment id.
      run: the run name.
      tags_of_run: `{tag: TensorTimeSeries}` of the run if already listed.

    Returns:
      A `RunData`.

    Raises:
      RunNotFoundError: if the run has no data of this plugin.
    """
    from tensorboard.data import provider as provider_lib

    if tags_of_run is None:
        tags_of_run = list_runs(provider, ctx, experiment_id).get(run)
    if not tags_of_run:
        raise RunNotFoundError(run)
    notes = []
    readable = _readable_tags(tags_of_run, notes)
    data = {}
    if readable:
        data = provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=metadata.PLUGIN_NAME,
            downsample=ALL_SAMPLES,
            run_tag_filter=provider_lib.RunTagFilter(runs=[run], tags=readable),
        ).get(run, {})
    samples = {
        tag: sorted(
            ((int(d.step), np.asarray(d.numpy)) for d in data.get(tag, [])), key=lambda p: p[0]
        )
        for tag in readable
    }
    inputs = inputs_from_samples(run, samples, notes)
    rng = rng_from_samples(run, samples, notes)
    data = data_from_samples(
        run,
        samples,
        notes,
        inputs.replicas or None,
        int(inputs.steps[0]) if inputs.steps.size else None,
    )
    variables = variables_from_samples(run, samples, notes)
    gradients = gradients_from_samples(run, samples, notes)
    return RunData(
        run=run,
        inputs=inputs,
        samples=samples,
        notes=notes,
        rng=rng,
        data=data,
        variables=variables,
        gradients=gradients,
    )


def inputs_from_samples(run, samples, notes):
    """Builds the `InputsSeries` of a run from its raw samples (see `RunData.samples`)."""
    shape_events = []
    bad = 0
    for step, value in samples.get(metadata.TAG_SHAPES, []):
        try:
            shape_events.append(parse_shape_event(step, value.item()))
        except (ValueError, KeyError, TypeError, AttributeError):
            bad += 1
    if bad:
        notes.append(f"{bad} unreadable shapes event(s) skipped.")
    dense_points = samples.get(metadata.TAG_BATCH_SIZE, [])
    # The series shares the run's notes list: a note added by any family shows once.
    series = build_inputs_series(run, shape_events, dense_points)
    notes.extend(series.notes)
    series.notes = notes
    return series


def read_inputs(provider, ctx, experiment_id, run, tags_of_run=None):
    """Reads the inputs family of one run (`read_run(...).inputs`).

    Raises:
      RunNotFoundError: if the run has no data of this plugin.
    """
    return read_run(provider, ctx, experiment_id, run, tags_of_run).inputs


# ------------------------------------------------------------------------ multi-worker jobs

# `<job>/<task_type>_<task_index>`: the run a worker's probe writes (`ReplicaProbe.run_dir`).
WORKER_RUN = re.compile(r"^(?:(?P<job>.+)/)?(?P<task_type>chief|worker)_(?P<task_index>\d+)$")
ROOT_JOB = "."


def job_of_run(run):
    """The job name of a worker's run (`"mw/replicas"` for `"mw/replicas/worker_1"`), else None.

    Whether it is one is confirmed by its data (the worker fields of its shapes events).
    """
    match = WORKER_RUN.match(run)
    if match is None:
        return None
    return match.group("job") or ROOT_JOB


def candidate_jobs(run_names):
    """`{job: [worker runs]}` for runs named like a worker's run, grouped by job name."""
    jobs = {}
    for run in run_names:
        job = job_of_run(run)
        if job is not None:
            jobs.setdefault(job, []).append(run)
    return jobs


def _worker_name(worker):
    return f"{worker['task_type']}_{worker['task_index']}"


def merge_inputs(job, members, workers, notes):
    """The inputs family of a job: every worker's series on one global replica axis.

    Args:
      job: the job name.
      members: the workers' `InputsSeries`, in worker order.
      workers: the per-worker grouping (`InputsSeries.workers`).
      notes: the job's notes list (appended to).

    Returns:
      An `InputsSeries` whose replicas are the global replica ids of every worker; per step,
      each worker's batch sizes and shapes at that step (held from its last change).
    """
    with_steps = [m for m in members if m.steps.size]
    steps = np.unique(np.concatenate([m.steps for m in with_steps])) if with_steps else None
    if steps is None:
        steps = np.zeros((0,), np.int64)
    ranges = {(int(m.steps[0]), int(m.steps[-1])) for m in with_steps}
    if len(ranges) > 1 or len(with_steps) < len(members):
        notes.append(
            "The workers recorded different step ranges; a worker's batch sizes are held from "
            "its nearest recorded step where it has none."
        )
    columns = []
    for member in members:
        if not member.steps.size:
            columns.append(np.zeros((steps.size, member.num_replicas), np.int64))
            continue
        index = np.searchsorted(member.steps, steps, side="right") - 1
        columns.append(member.batch_size[np.clip(index, 0, member.steps.size - 1)])
    batch_size = np.concatenate(columns, axis=1) if columns else np.zeros((0, 0), np.int64)

    event_steps = sorted({e["step"] for m in members for e in m.shape_events})
    events = []
    for step in event_steps:
        in_force = []
        for member in members:
            before = [e for e in member.shape_events if e["step"] <= step]
            event = before[-1] if before else (member.shape_events or [None])[0]
            in_force.append(event)
        names = []
        for event in in_force:
            for entry in (event or {}).get("inputs", []):
                if entry["name"] not in names:
                    names.append(entry["name"])
        inputs = []
        for name in names:
            dtypes, shapes = [], []
            for member, event in zip(members, in_force, strict=True):
                entries = (event or {}).get("inputs", [])
                entry = next((e for e in entries if e["name"] == name), None)
                if entry is None:
                    dtypes += ["missing"] * member.num_replicas
                    shapes += [[]] * member.num_replicas
                else:
                    dtypes += entry["dtypes"]
                    shapes += entry["shapes"]
            dims = _mismatch_dims(dtypes, shapes)
            inputs.append(
                {
                    "name": name,
                    "dtypes": dtypes,
                    "shapes": shapes,
                    "mismatch": bool(dims),
                    "mismatch_dims": dims,
                }
            )
        events.append({"step": step, "inputs": inputs})

    dense_sets = [set(m.dense_steps.tolist()) for m in members]
    dense_common = sorted(set.intersection(*dense_sets)) if dense_sets else []
    dense_steps = np.array(dense_common, dtype=np.int64)
    if dense_common:
        parts = []
        for member in members:
            at = np.searchsorted(member.dense_steps, dense_steps)
            parts.append(member.dense[at])
        dense = np.concatenate(parts, axis=2)
    else:
        dense = np.zeros((0, 3, sum(m.num_replicas for m in members)), np.int64)
    sources = {m.source for m in members if m.source}
    return InputsSeries(
        run=job,
        replicas=[r for m in members for r in m.replicas],
        devices=[d for m in members for d in m.devices],
        source=sources.pop() if len(sources) == 1 else ",".join(sorted(sources)),
        steps=steps,
        batch_size=batch_size,
        shape_events=events,
        dense_steps=dense_steps,
        dense=dense,
        notes=notes,
        workers=workers,
    )


def merge_step_time(job, member_runs, workers, notes):
    """The `StepTimeSeries` of a job from each worker's `workers/step_time` samples.

    Args:
      job: the job name.
      member_runs: the workers' `RunData`, in worker order.
      workers: the per-worker grouping.
      notes: the job's notes list (appended to).

    Returns:
      A `StepTimeSeries` over the steps every worker logged, or None if no worker logged any.
    """
    per_worker = [
        {step: np.asarray(value, np.float64) for step, value in m.samples.get(TAG_TIME, [])}
        for m in member_runs
    ]
    if not any(per_worker):
        return None
    common = sorted(set.intersection(*(set(p) for p in per_worker)))
    if any(len(p) != len(common) for p in per_worker):
        notes.append(
            "Step times are compared at the steps every worker logged; some workers logged "
            "steps the others did not."
        )
    shape = (len(common), len(per_worker))
    table = np.full(shape + (3,), np.nan)
    for w, points in enumerate(per_worker):
        for i, step in enumerate(common):
            value = points[step]
            if value.shape == (3,):
                table[i, w] = value
    arrival, period, window_mean = table[..., 0], table[..., 1], table[..., 2]
    if arrival.size:
        with np.errstate(invalid="ignore"):
            first = np.nanmin(arrival, axis=1, keepdims=True) if shape[1] else arrival
            last = np.nanmax(arrival, axis=1, keepdims=True) if shape[1] else arrival
    else:
        first = last = arrival
    return StepTimeSeries(
        run=job,
        workers=[w["name"] for w in workers],
        steps=np.array(common, dtype=np.int64),
        arrival=arrival,
        period=period,
        window_mean=window_mean,
        lateness=arrival - first,
        # Clamped at 0: a worker that started its first steps late can show a period shorter
        # than its wait right after.
        busy=np.maximum(period - (last - arrival), 0.0),
    )


def _merge_inputs_family(job, member_runs, workers, notes):
    return merge_inputs(job, [m.inputs for m in member_runs], workers, notes)


def merge_variables(job, member_runs, workers, notes):
    """Cross-worker weight drift of a job from the per-copy fingerprints each worker wrote.

    No weights cross workers: each worker fingerprinted its own copies on their devices (bitwise
    hash, stats, linear sketch, the same projection on every worker); here those fingerprints are
    put on one global replica axis, so the drift of every copy from global replica 0 (worker 0's
    first copy) is computed as within one worker. The exact element-wise check (`exact=True`)
    compares copies within a worker only; it stays in each worker's own run.

    Returns:
      A `VariablesSeries` over the steps every worker logged, or None when no worker recorded
      variables (or their variable lists differ: noted).
    """
    series = _members_with(
        "variables",
        member_runs,
        workers,
        notes,
        "variables",
        "no cross-worker weight drift; call observe_variables on every worker",
    )
    if series is None:
        return None
    versions = {
        int(s.placement_events[-1][1].get("fingerprint", {}).get("version", 1)) for s in series
    }
    if len(versions) > 1:
        notes.append(
            f"The workers wrote fingerprints of different versions ({sorted(versions)}: "
            "different versions of tb_replica_plugin): cross-worker weight drift is not computed "
            "(use the same version on every worker)."
        )
        return None
    if any(s.names != series[0].names for s in series):
        notes.append(
            "The workers recorded different variable lists: cross-worker weight drift is not "
            "computed (pass the same variables on every worker)."
        )
        return None
    steps = sorted(set.intersection(*(set(s.steps.tolist()) for s in series)))
    offsets = np.cumsum([0] + [s.num_replicas for s in series])[:-1]
    variables = []
    for index, first in enumerate(series[0].variables):
        entries = [s.variables[index] for s in series]
        merged = dict(first)
        merged["devices"] = [d for e in entries for d in e.get("devices", [])]
        merged["hash"] = [
            h for e in entries for h in (e.get("hash") or ["mix64"] * len(e.get("columns", [])))
        ]
        merged["columns"] = [
            int(c) + int(offset) if c >= 0 else -1
            for e, offset in zip(entries, offsets, strict=True)
            for c in e.get("columns", [])
        ]
        merged["mirrored"] = all(e.get("mirrored", False) for e in entries)
        variables.append(merged)
    document = {
        "variables": variables,
        "devices": [d for s in series for d in s.devices],
        "replicas": [r for s in series for r in s.replicas],
        "source": series[0].source,
        "fingerprint": series[0].placement_events[-1][1].get("fingerprint", {}),
    }
    at = [np.searchsorted(s.steps, steps) for s in series]
    hash_points, fingerprint_points = [], []
    for k, step in enumerate(steps):
        hash_points.append(
            (step, np.concatenate([s.hash[i[k]] for s, i in zip(series, at, strict=True)], 1))
        )
        fingerprint_points.append(
            (
                step,
                np.concatenate(
                    [
                        np.concatenate([s.stats[i[k]], s.sketch[i[k]]], axis=-1)
                        for s, i in zip(series, at, strict=True)
                    ],
                    axis=1,
                ),
            )
        )
    first_step = steps[0] if steps else 0
    merged = build_variables_series(
        job, [(first_step, document)], hash_points, fingerprint_points, []
    )
    if merged is not None:
        notes.extend(merged.notes)
        merged.notes = notes
    return merged


def _members_with(family, member_runs, workers, notes, what, how):
    """The workers' series of one family, or None (with a note when only some have it)."""
    series = [getattr(m, family, None) for m in member_runs]
    if all(s is None for s in series):
        return None
    if any(s is None for s in series):
        missing = [w["name"] for w, s in zip(workers, series, strict=True) if s is None]
        notes.append(
            f"Workers {', '.join(missing)} recorded no {what}: the job view has none "
            f"({how}); each worker's own run still shows its own."
        )
        return None
    return series


def _common_steps(series, notes, what):
    """Steps every worker logged (sorted list); a note when some logged steps the others did not."""
    steps = sorted(set.intersection(*(set(s.steps.tolist()) for s in series)))
    if any(s.steps.size != len(steps) for s in series):
        notes.append(
            f"{what}: the job view shows the {len(steps)} step(s) every worker logged; some "
            "workers logged steps the others did not."
        )
    return steps


def merge_gradients(job, member_runs, workers, notes):
    """Every worker's local gradient health on one global replica axis.

    Per-replica norms and losses are concatenated in global replica order at the logged steps
    every worker has (the others are noted). NaN/Inf events are kept at every step any worker
    had one (a worker without an event at that step counts 0 for its replicas). When the
    workers recorded different variable lists, the global norms and losses are still merged and
    the per-variable norms left out (noted).

    Returns:
      A `GradientsSeries`, or None when no worker (or not every worker: noted) recorded
      gradients.
    """
    series = _members_with(
        "gradients",
        member_runs,
        workers,
        notes,
        "gradients",
        "call observe_gradients on every worker",
    )
    if series is None:
        return None
    same_variables = all(s.variables == series[0].variables for s in series)
    if not same_variables:
        notes.append(
            "The workers recorded gradients of different variable lists: the job view shows "
            "each replica's global norm and loss, not the per-variable norms."
        )
    steps = _common_steps(series, notes, "gradients")
    at = [np.searchsorted(s.steps, steps).astype(np.int64) for s in series]

    def concat(field):
        return np.concatenate([getattr(s, field)[i] for s, i in zip(series, at, strict=True)], -1)

    total = sum(s.num_replicas for s in series)
    variable_norms = (
        concat("variable_norms") if same_variables else np.zeros((len(steps), 0, total))
    )
    event_steps = np.array(
        sorted(set().union(*(s.nonfinite_steps.tolist() for s in series))), np.int64
    )
    events = np.zeros((event_steps.size, 4, total), np.int64)
    column = 0
    for s in series:
        where = np.searchsorted(event_steps, s.nonfinite_steps)
        events[where, :, column : column + s.num_replicas] = s.nonfinite
        column += s.num_replicas
    scalings = {s.scaling for s in series}
    return GradientsSeries(
        run=job,
        replicas=[r for s in series for r in s.replicas],
        variables=list(series[0].variables) if same_variables else [],
        shapes=list(series[0].shapes) if same_variables else [],
        has_loss=all(s.has_loss for s in series),
        scaling=scalings.pop() if len(scalings) == 1 else ",".join(sorted(scalings)),
        steps=np.array(steps, np.int64),
        global_norm=concat("global_norm"),
        loss=concat("loss"),
        variable_norms=variable_norms,
        nonfinite_steps=event_steps,
        nonfinite=events,
        loss_scaled=any(s.loss_scaled for s in series),
    )


def merge_rng(job, member_runs, workers, notes):
    """Every worker's random-stream fingerprints on one global replica axis.

    A generator's stream fingerprint depends only on the numbers its next draw gives, so
    fingerprints written by different workers compare directly: the merged series puts them
    side by side (global replica order) at the steps every worker logged, and the identical-
    streams and desync rules then see pairs of replicas on different workers too. Generators
    are matched by name and must be the same on every worker (else noted, none merged); a
    generator is mirrored on the job when it is on every worker.

    Returns:
      An `RngSeries`, or None when no worker (or not every worker, or with other generators:
      noted) recorded random streams.
    """
    series = _members_with(
        "rng", member_runs, workers, notes, "random streams", "observe the same generators"
    )
    if series is None:
        return None
    names = [g["name"] for g in series[0].generators]
    if any([g["name"] for g in s.generators] != names for s in series):
        notes.append(
            "The workers recorded different random generators: the job view shows none "
            "(observe the same generators on every worker); each worker's own run shows its own."
        )
        return None
    steps = _common_steps(series, notes, "rng")
    at = [np.searchsorted(s.steps, steps).astype(np.int64) for s in series]
    width = max(s.state.shape[-1] for s in series)
    states = [
        np.pad(s.state[i], [(0, 0)] * 3 + [(0, width - s.state.shape[-1])])
        for s, i in zip(series, at, strict=True)
    ]
    generators = []
    for index, generator in enumerate(series[0].generators):
        merged = dict(generator)
        merged["mirrored"] = all(s.generators[index]["mirrored"] for s in series)
        generators.append(merged)
    return RngSeries(
        run=job,
        replicas=[r for s in series for r in s.replicas],
        devices=[d for s in series for d in s.devices],
        generators=generators,
        steps=np.array(steps, np.int64),
        fingerprint=np.concatenate(
            [s.fingerprint[i] for s, i in zip(series, at, strict=True)], axis=2
        ),
        state=np.concatenate(states, axis=2),
        notes=notes,
    )


def sketch_overlaps(sketch, distinct):
    """Examples each pair of replicas shares, from their bottom-K sketches (one step).

    Args:
      sketch: int64 [R, K] bottom-K sketches (`DataSeries.sketch` rows: the smallest distinct
        fingerprints, ascending, the first `min(distinct, K)` valid).
      distinct: int64 [R], the replicas' distinct example counts.

    Returns:
      `(shared, exact, duplicated)`: int64 [R, R] shared examples per pair (diagonal:
      `distinct`), bool [R, R] where that count is exact, and int64 [R] the distinct examples of
      each replica found on another replica (exact when every replica has at most K).
      For a pair (a, b), let t = the smaller of the two sketches' largest entries (a set of at
      most K elements is whole: its t is +inf). Every fingerprint of either set up to t is in
      its sketch, so `both` (sketch entries in both) and `union` (entries of either up to t)
      are exact counts over the fingerprints up to t; J = both / union estimates the Jaccard
      index and `shared = round(J (|A| + |B|) / (1 + J))` (clipped to the smaller set). When
      both sets have at most K elements, t = +inf and this is the exact intersection. Computed
      for every pair at once with two matrix products over the sketch entries.

    Example:
      >>> sketch_overlaps(np.array([[1, 2, 3, 0], [2, 3, 5, 0]]), np.array([3, 3]))[0].tolist()
      [[3, 2], [2, 3]]
    """
    sketch = np.asarray(sketch, np.int64)
    distinct = np.asarray(distinct, np.int64)
    num, size = sketch.shape
    valid = np.arange(size)[None, :] < np.minimum(distinct, size)[:, None]
    values, inverse = np.unique(sketch[valid], return_inverse=True)
    owner = np.nonzero(valid)[0]
    presence = np.zeros((values.size, num), np.float32)
    presence[inverse, owner] = 1.0
    complete = distinct <= size
    last = np.where(valid.any(axis=1), sketch[np.arange(num), np.maximum(valid.sum(1) - 1, 0)], 0)
    below = np.where(complete[None, :], True, values[:, None] <= last[None, :]).astype(np.float32)
    both = np.rint(presence.T @ presence).astype(np.int64)
    up_to = np.rint(presence.T @ below).astype(np.int64)  # [r, q]: r's entries up to q's t
    union = up_to + up_to.T - both
    with np.errstate(divide="ignore", invalid="ignore"):
        jaccard = np.where(union > 0, both / np.maximum(union, 1), 0.0)
        total = (distinct[:, None] + distinct[None, :]).astype(np.float64)
        shared = np.rint(jaccard * total / (1.0 + jaccard)).astype(np.int64)
    shared = np.minimum(shared, np.minimum(distinct[:, None], distinct[None, :]))
    exact = complete[:, None] & complete[None, :]
    shared = np.where(exact, both, shared)
    np.fill_diagonal(shared, distinct)
    on_others = presence.sum(axis=1) > 1
    duplicated = np.rint(presence.T @ on_others.astype(np.float32)).astype(np.int64)
    return shared, exact, duplicated


def sketch_overlap(sketch_a, distinct_a, sketch_b, distinct_b):
    """`(count, exact)`: examples two replicas share, from their sketches (`sketch_overlaps`).

    Example:
      >>> sketch_overlap(np.array([1, 2, 3, 0]), 3, np.array([2, 3, 5, 0]), 3)
      (2, True)
    """
    shared, exact, _ = sketch_overlaps(
        np.stack([sketch_a, sketch_b]), np.array([distinct_a, distinct_b])
    )
    return int(shared[0, 1]), bool(exact[0, 1])


def merge_data(job, member_runs, workers, notes):
    """Examples fed to replicas of different workers at the same step, from the sketches.

    Within a worker every count is exact (each worker's own `shared`, `duplicated` and window
    fields). Across workers no example crosses: each replica wrote a bottom-K sketch (K = 16)
    of its example fingerprints at every logged step, and for each pair of global replicas on
    different workers and each step every worker logged:

    - `shared`: exact when both replicas had at most K distinct examples at that step (the
      sketches are the whole sets), else the bottom-K Jaccard estimate (`sketch_overlaps`);
      the steps where it was estimated are noted.
    - `duplicated` (distinct examples of a replica also on another replica): exact when every
      replica had at most K distinct examples at that step (computed from the whole sets),
      else at least the largest of the worker's own count and the cross-worker pairs'.
    - window fields (`window_shared`, `steps_shared`, `window_duplicated`): the within-worker
      parts are exact; the cross-worker parts are known only at the logged step and are
      extrapolated to its window (times `window_steps`; a pair counts every step of the window
      as shared when it shared at the logged step). With `update_freq=1` every window is that
      one step and nothing is extrapolated.

    Returns:
      A `DataSeries` on the global replica axis, or None when no worker (or not every worker:
      noted) recorded example fingerprints.
    """
    series = _members_with(
        "data", member_runs, workers, notes, "example fingerprints", "call observe_examples"
    )
    if series is None:
        return None
    steps = _common_steps(series, notes, "data")
    at = [np.searchsorted(s.steps, steps).astype(np.int64) for s in series]

    def concat(field):
        return np.concatenate([getattr(s, field)[i] for s, i in zip(series, at, strict=True)], 1)

    windows = np.stack([s.window_steps[i] for s, i in zip(series, at, strict=True)])
    if windows.size and np.any(windows != windows[:1]):
        notes.append(
            "data: the workers' logging windows differ; the job view uses the shortest window "
            "of each logged step."
        )
    window_steps = windows.min(axis=0) if windows.size else np.zeros(0, np.int64)
    batch_size, distinct = concat("batch_size"), concat("distinct")
    sketch = concat("sketch")
    size = sketch.shape[-1]
    total = distinct.shape[1]
    owner = np.concatenate([np.full(s.num_replicas, w) for w, s in enumerate(series)])
    offsets = np.cumsum([0] + [s.num_replicas for s in series])
    shape = (len(steps), total, total)
    shared = np.zeros(shape, np.int64)
    window_shared = np.zeros(shape, np.int64)
    steps_shared = np.zeros(shape, np.int64)
    duplicated = concat("duplicated").copy()
    window_duplicated = concat("window_duplicated").copy()
    for s, i, start, stop in zip(series, at, offsets[:-1], offsets[1:], strict=True):
        inside = (slice(None), slice(start, stop), slice(start, stop))
        shared[inside] = s.shared[i]
        window_shared[inside] = s.window_shared[i]
        steps_shared[inside] = s.steps_shared[i]
    estimated = 0
    cross = owner[:, None] != owner[None, :]
    for k in range(len(steps)):
        pairs, _, found = sketch_overlaps(sketch[k], distinct[k])
        shared[k][cross] = pairs[cross]
        if np.all(distinct[k] <= size):
            duplicated[k] = found  # every set is whole: exact
        else:
            estimated += 1
            across = np.where(cross, shared[k], 0).max(axis=1)
            duplicated[k] = np.minimum(np.maximum(duplicated[k], across), distinct[k])
        span = max(int(window_steps[k]), 1)
        window_shared[k][cross] = shared[k][cross] * span
        steps_shared[k][cross] = np.where(shared[k][cross] > 0, span, 0)
        window_duplicated[k] = np.maximum(window_duplicated[k], duplicated[k] * span)
    if estimated:
        notes.append(
            f"data: at {estimated} of {len(steps)} logged step(s) a replica had more than "
            f"{size} distinct examples; the examples shared across workers are estimated there "
            f"from bottom-{size} sketches (exact within a worker)."
        )
    if np.any(window_steps > 1):
        notes.append(
            "data: not every step is logged; the examples shared across workers are known at "
            "the logged steps and extrapolated to the steps between them (exact within a "
            "worker)."
        )
    return DataSeries(
        run=job,
        replicas=[r for s in series for r in s.replicas],
        steps=np.array(steps, np.int64),
        window_steps=window_steps.astype(np.int64),
        batch_size=batch_size,
        distinct=distinct,
        duplicated=duplicated,
        window_duplicated=window_duplicated,
        shared=shared,
        window_shared=window_shared,
        steps_shared=steps_shared,
        sketch=sketch,
        notes=notes,
        # The shortest window of each logged step (as window_steps); sampled when any worker was.
        window_start=np.max(
            [s.window_starts()[i] for s, i in zip(series, at, strict=True)], axis=0
        ).astype(np.int64),
        sampled=any(s.sampled for s in series),
    )


# How each family of a job is built from its workers' `RunData` (in worker order):
# `{RunData attribute: fn(job, member_runs, workers, notes) -> series or None}`. A family that
# compares workers (cross-worker weight drift from per-copy fingerprints, duplicated data from
# example sketches) adds its merger here; families without one stay None on the job.
JOB_MERGERS = {
    "inputs": _merge_inputs_family,
    "step_time": merge_step_time,
    "variables": merge_variables,
    "gradients": merge_gradients,
    "rng": merge_rng,
    "data": merge_data,
}


def merge_job(job, member_runs):
    """One `RunData` for the runs of the workers of one job (see `RunData`).

    Args:
      job: the job name.
      member_runs: the `RunData` of its workers' runs, each with `inputs.worker` set.

    Returns:
      The job's `RunData`, replica axis in global replica order.
    """
    members = sorted(member_runs, key=lambda m: (m.inputs.worker["worker"], m.run))
    notes = []
    workers = []
    for member in members:
        info = member.inputs.worker
        workers.append(
            {
                "run": member.run,
                "name": _worker_name(info),
                "task_type": info["task_type"],
                "task_index": info["task_index"],
                "worker": info["worker"],
                "replicas": list(member.inputs.replicas),
                "devices": list(member.inputs.devices),
            }
        )
        notes.extend(f"{_worker_name(info)}: {note}" for note in member.notes)
    expected = max(m.inputs.worker["num_workers"] for m in members)
    if len(members) < expected:
        seen = {m.inputs.worker["worker"] for m in members}
        missing = sorted(set(range(expected)) - seen)
        notes.append(
            f"Only {len(members)} of the job's {expected} workers wrote data (workers "
            f"{missing} are missing): give every worker the same log dir or copy their runs in."
        )
    if len({m.inputs.worker["job"] for m in members}) > 1:
        notes.append(
            "These worker runs come from jobs with different cluster specs (the log dir was "
            "reused); write each job to its own log dir."
        )
    data = RunData(
        run=job,
        inputs=None,
        samples={},
        notes=notes,
        workers=workers,
        worker_runs={m.run: m for m in members},
    )
    for attribute, merger in JOB_MERGERS.items():
        setattr(data, attribute, merger(job, members, workers, notes))
    return data


def read_runs(provider, ctx, experiment_id, run=None, runs=None):
    """Reads runs and multi-worker jobs: `{name: RunData}`, the workers of a job as one entry.

    Runs named `<job>/<task_type>_<index>` whose data says they are workers of one job are read
    and merged into one `RunData` named `<job>` (they are not listed on their own).

    Args:
      provider, ctx, experiment_id: as for `read_run`.
      run: a run or job name to read alone (a worker's own run can be read by its name too).
      runs: `list_runs(...)` if already listed.

    Returns:
      `{name: RunData}` sorted by name.

    Raises:
      RunNotFoundError: if `run` is neither a run nor a job with data of this plugin.
    """
    if runs is None:
        runs = list_runs(provider, ctx, experiment_id)
    jobs = {job: members for job, members in candidate_jobs(runs).items() if job not in runs}

    def read(name):
        return read_run(provider, ctx, experiment_id, name, runs[name])

    def read_job(job):
        members = [read(name) for name in jobs[job]]
        if all(m.inputs.worker is not None for m in members):
            return {job: merge_job(job, members)}
        return {m.run: m for m in members}

    if run is not None:
        if run in runs:
            return {run: read(run)}
        if run in jobs:
            result = read_job(run)
            if run in result:
                return result
        raise RunNotFoundError(run)
    result = {}
    in_jobs = {name for members in jobs.values() for name in members}
    for name in runs:
        if name not in in_jobs:
            result[name] = read(name)
    for job in jobs:
        result.update(read_job(job))
    return {name: result[name] for name in sorted(result)}


def local_provider(logdir):
    """A data provider over a local log dir that keeps every sample of this plugin.

    Args:
      logdir: the log directory (runs are its sub-directories holding event files).

    Returns:
      `(provider, ctx, experiment_id)` ready for `list_runs` / `read_inputs`.
    """
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={metadata.PLUGIN_NAME: 0}, max_reload_threads=1
    )
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    return data_provider.MultiplexerDataProvider(multiplexer, logdir), context.RequestContext(), ""


def read_log_dir(logdir, run_pattern=None):
    """Reads every run of this plugin under a log dir, keeping every sample.

    Args:
      logdir: the log directory.
      run_pattern: optional shell-style pattern (`fnmatch`) the run names must match.

    Returns:
      A dict `{run: RunData}` sorted by run name; the workers of a multi-worker job are one
      entry named after the job (see `read_runs`).
    """
    provider, ctx, experiment_id = local_provider(logdir)
    return {
        name: data
        for name, data in read_runs(provider, ctx, experiment_id).items()
        if run_pattern is None or fnmatch.fnmatchcase(name, run_pattern)
    }
