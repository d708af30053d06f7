"""The rng family read side: `RngSeries` from the samples, and its multi-worker merge.

Imports no TensorFlow.
"""

import dataclasses
import json

import numpy as np

from tb_replica_plugin.core import columns, jobs
from tb_replica_plugin.families.rng import schema


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


def from_samples(run, samples, notes, needed=None):
    """Builds the `RngSeries` of a run from its raw samples, or None when it has none.

    A streams sample is read with the latest generators document written at or before its step,
    when their layouts (generator count) match; the layout of the last logged step wins.

    Args:
      run: the run name.
      samples: `RunData.samples`.
      notes: the run's notes list (appended to).
      needed: unused.

    Returns:
      An `RngSeries`, or None.
    """
    streams = samples.get(schema.TAG_RNG_STREAMS, [])
    if not streams:
        return None
    documents = _documents(samples.get(schema.TAG_RNG_GENERATORS, []))
    kept = _in_the_last_layout(streams, documents)
    if kept is None:
        notes.append("rng: no readable generator series (missing generator names).")
        return None
    steps, values, last = kept
    if len(steps) < len(streams):
        notes.append(
            f"rng: {len(streams) - len(steps)} logged step(s) with another generator layout "
            "were skipped."
        )
    num = values.shape[2]
    return RngSeries(
        run=run,
        replicas=[int(r) for r in last.get("replicas", range(num))],
        devices=[str(d) for d in last.get("devices", [""] * num)],
        generators=[_generator(g, values.shape[3] - 1) for g in last["generators"]],
        steps=steps,
        fingerprint=values[:, :, :, 0],
        state=values[:, :, :, 1:],
        notes=notes,
    )


def _documents(generator_samples):
    """`(steps, documents)`: the readable generators documents and their steps, in step order
    (a later one at the same step wins)."""
    documents = {}
    for step, value in generator_samples:
        try:
            text = value.item()
            documents[step] = json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
        except (ValueError, AttributeError, UnicodeDecodeError):
            continue
    steps = sorted(documents)
    return np.array(steps, np.int64), [documents[s] for s in steps]


def _in_the_last_layout(streams, documents):
    """`(steps, int64 values, document)` of the streams samples read with the latest generators
    document written at or before their step (written at the first logged step of each layout),
    where the two agree on the generator count, and in the last such sample's layout (its
    document's generator names, its value shape); None when no sample has a document.

    Args:
      streams: the run's `rng/streams` samples.
      documents: `_documents`' `(steps, documents)`.
    """
    document_steps, docs = documents
    counts = np.array([len(d.get("generators", [])) for d in docs] + [-1], np.int64)
    paired = []  # (group, document of each sample: -1 for none or another count)
    for group in columns.by_shape(streams):
        if len(group.shape) != 3:
            continue
        at = np.searchsorted(document_steps, group.steps, side="right") - 1
        at[counts[at] != group.shape[0]] = -1  # `at` -1: no document (count -1)
        if (at >= 0).any():
            paired.append((group, at))
    if not paired:
        return None
    group, at = max(paired, key=lambda pair: pair[0].positions[pair[1] >= 0][-1])
    last = docs[at[at >= 0][-1]]
    layout = [g.get("name") for g in last["generators"]]
    names = [[g.get("name") for g in d.get("generators", [])] for d in docs]
    same = np.array([n == layout for n in names] + [False])
    kept = same[at]
    return group.steps[kept], group.values[kept].astype(np.int64), last


def _generator(document, state_size):
    """One generator's entry of `RngSeries.generators` from its document entry."""
    return {
        "name": str(document.get("name")),
        "kind": str(document.get("kind", "")),
        "layer": document.get("layer"),
        "layer_class": document.get("layer_class"),
        "mirrored": bool(document.get("mirrored", False)),
        "state_size": int(document.get("state_size", state_size)),
    }


class RngMerger(jobs.Merger):
    """Every worker's random-stream fingerprints on one global replica axis (`jobs.Merger`).

    A generator's stream fingerprint depends only on the numbers its next draw gives, so
    fingerprints written by different workers compare directly: the merged series puts them
    side by side (global replica order) at the steps every worker logged, and the identical-
    streams and desync rules then see pairs of replicas on different workers too. Generators
    are matched by name and must be the same on every worker (else noted, none merged); a
    generator is mirrored on the job when it is on every worker.

    Example:
      >>> merger = RngMerger(expected_workers=2)
      >>> for slot, member in enumerate(members):
      ...     merger.add(slot, member, None)
      >>> merger.result("job", [0, 1], workers, []).fingerprint.shape  # [steps, generators, R]
      (3, 2, 4)
    """

    attribute = "rng"

    def __init__(self, expected_workers=1):
        super().__init__(expected_workers)
        self.rows = jobs.StepArrays(expected_workers)
        self.axis = jobs.ReplicaAxis()
        self.layouts = {}  # slot -> (generators, replicas, devices)

    def add(self, slot, member, since):
        """Writes worker `slot`'s fingerprints and states from step `since` on (all: None).

        Raises:
          jobs.Irregular: if the worker's generators or replicas changed.
        """
        series = self.series_of(slot, member)
        if series is None:
            return
        layout = (series.generators, series.replicas, series.devices)
        if self.layouts.setdefault(slot, layout) != layout:
            raise jobs.Irregular(f"worker slot {slot}: other generators")
        columns = self.axis.add(slot, series.num_replicas)
        generators, width = len(series.generators), series.state.shape[-1]
        if not self.rows.arrays:
            replicas = self.expected_workers * series.num_replicas
            self.rows.declare("fingerprint", (generators, replicas), np.int64, 0, (1,))
            self.rows.declare("state", (generators, replicas, width), np.int64, 0, (1,))
        if self.rows.arrays["fingerprint"].shape[1] != generators:
            return  # other generators than the first worker's: not merged (`result` notes it)
        self._widen_state(width)
        self.rows.widen(self.axis.total)
        keep = series.steps >= since if since is not None else slice(None)
        rows = self.rows.place(slot, series.steps[keep])
        self.rows.write(slot, "fingerprint", rows, columns, series.fingerprint[keep])
        state = self.rows.arrays["state"]
        padded = np.zeros((*series.state[keep].shape[:-1], state.shape[-1]), np.int64)
        padded[..., :width] = series.state[keep]
        self.rows.write(slot, "state", rows, columns, padded)

    def _widen_state(self, width):
        """The state words axis at least `width` long (zeros beyond a worker's words)."""
        if self.rows.arrays["state"].shape[-1] < width:
            self.rows.lengthen("state", width)

    def result(self, job, order, workers, notes):
        """The job's `RngSeries`, or None when no worker (or not every worker, or with other
        generators: noted) recorded random streams."""
        if self.absent(workers, order, notes, "random streams", "observe the same generators"):
            return None
        layouts = [self.layouts[slot] for slot in order]
        names = [g["name"] for g in layouts[0][0]]
        if any([g["name"] for g in layout[0]] != names for layout in layouts):
            notes.append(
                "The workers recorded different random generators: the job view shows none "
                "(observe the same generators on every worker); each worker's own run shows its "
                "own."
            )
            return None
        self.rows.drop_dead()
        jobs.common_note(self.rows, order, notes, "rng")
        rows, total, columns = self.rows.complete_rows(), self.axis.total, self.axis.order(order)
        generators = []
        for index, generator in enumerate(layouts[0][0]):
            merged = dict(generator)
            merged["mirrored"] = all(layout[0][index]["mirrored"] for layout in layouts)
            generators.append(merged)
        return RngSeries(
            run=job,
            replicas=[r for layout in layouts for r in layout[1]],
            devices=[d for layout in layouts for d in layout[2]],
            generators=generators,
            steps=np.asarray(self.rows.steps[rows], np.int64),
            fingerprint=self.rows.view("fingerprint", rows, total, columns),
            state=self.rows.view("state", rows, total, columns),
            notes=notes,
        )
