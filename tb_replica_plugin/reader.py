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

import numpy as np

from tb_replica_plugin import metadata

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
    return {
        "step": int(step),
        "inputs": inputs,
        "devices": [str(d) for d in parsed.get("devices", [])],
        "replicas": [int(r) for r in parsed.get("replicas", [])],
        "source": str(parsed.get("source", "")),
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

    @property
    def num_replicas(self):
        return len(self.replicas)


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


def data_from_samples(run, samples, notes, replicas=None):
    """Builds the `DataSeries` of a run from its raw samples, or None when it has none.

    Args:
      run: the run name.
      samples: `RunData.samples`.
      notes: the run's notes list (appended to).
      replicas: replica ids (from the inputs family); `range(R)` when None.
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
    return DataSeries(
        run=run,
        replicas=[int(r) for r in replicas],
        steps=np.array(kept, dtype=np.int64),
        window_steps=np.diagonal(ov[:, 2], axis1=1, axis2=2)[:, 0].copy(),
        batch_size=ex[:, :, 0],
        distinct=ex[:, :, 1],
        duplicated=ex[:, :, 2],
        window_duplicated=ex[:, :, 3],
        shared=ov[:, 0],
        window_shared=ov[:, 1],
        steps_shared=ov[:, 2],
        sketch=ex[:, :, 4:],
        notes=notes,
    )


@dataclasses.dataclass
class RunData:
    """Every family of one run, as read from the data provider.

    Each stat family (inputs, gradients, variables, ...) has one attribute holding its series
    dataclass, or None when the run has none of its tags. `samples` keeps the raw decoded
    samples per tag, `{tag: [(step, numpy value), ...]}` sorted by step, for family builders.

    Attributes:
      run: the run name.
      inputs: the `InputsSeries` (empty arrays when the run has no inputs tags).
      rng: the `RngSeries`, or None when the run has no rng tags.
      data: the `DataSeries`, or None when the run has no data tags.
      samples: raw samples per readable tag.
      notes: plain-language problems met while reading (shared by every family).
      gradients: the `GradientsSeries`, or None when the run has no gradient tags.
    """

    run: str
    inputs: InputsSeries
    samples: dict
    notes: list
    rng: RngSeries | None = None
    data: DataSeries | None = None
    gradients: GradientsSeries | None = None


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
    data = data_from_samples(run, samples, notes, inputs.replicas or None)
    gradients = gradients_from_samples(run, samples, notes)
    return RunData(
        run=run,
        inputs=inputs,
        samples=samples,
        notes=notes,
        rng=rng,
        data=data,
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
      A dict `{run: RunData}` sorted by run name.
    """
    provider, ctx, experiment_id = local_provider(logdir)
    runs = list_runs(provider, ctx, experiment_id)
    return {
        run: read_run(provider, ctx, experiment_id, run, tags)
        for run, tags in runs.items()
        if run_pattern is None or fnmatch.fnmatchcase(run, run_pattern)
    }
