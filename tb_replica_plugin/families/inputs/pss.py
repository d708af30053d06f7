"""Inputs family under `ParameterServerStrategy`: each worker's shapes come back with its step.

In the scheduled step (`ReplicaProbe.schedule`), `observe_inputs` puts the worker's shape vector
(and the structure of ragged or sparse leaves) in the step's record; on the coordinator, step k's
vectors of every worker (replica r: worker r) are read in numpy and written as a step of any other
strategy: the same tags, layouts and window (`Window`, the coordinator's own), each write one
eager summary op, a shapes event only where a worker's shapes changed.
"""

import json

import numpy as np
import tensorflow as tf

from tb_replica_plugin.core import distribute
from tb_replica_plugin.core.nest import flatten_with_names
from tb_replica_plugin.families.inputs import schema, shapes


def observe(probe, batch):
    """In the scheduled step: puts this worker's shapes of `batch`'s leaves in its record.

    Args:
      probe: the `ReplicaProbe` (capturing a scheduled step).
      batch: the (nested) structure of this worker's input tensors.
    """
    names_and_leaves = flatten_with_names(batch)
    if not names_and_leaves:
        probe.warn_once("no_inputs", "tb_replica_plugin: observe_inputs got no tensors.")
        return
    names = [name for name, _ in names_and_leaves]
    leaves = [_local(probe, leaf) for _, leaf in names_and_leaves]
    layout = shapes.LeafLayout.of(names, [[leaf] for leaf in leaves])
    tensors = {"shapes": shapes.replica_shape_vector(leaves, layout.ranks[0])}
    others = layout.nondense()
    if others:
        vectors = [shapes.structure_vector(leaves[i]) for i in others]
        tensors["structure"] = tf.concat(vectors, axis=0)
    probe.pss_capture("inputs", layout, tensors)


def _local(probe, leaf):
    """The worker's one local value of `leaf`, as a shapes leaf."""
    return shapes.as_leaf(distribute.worker_local(probe.strategy, leaf))


class Window:
    """The coordinator's state of the inputs family under this strategy (host side, numpy):
    the last step's shapes key, the batch-size window since its last write."""

    def __init__(self):
        self.previous = None
        self.last_step = -1
        self.batch = self.low = self.high = None


def deliver(recorder, per_worker, step):
    """On the coordinator: step `step` of every worker, written as one step of the run: the
    shapes event where any worker's shapes changed, the batch-size window (and its dense write at
    logged steps). Numpy and Python; a write is one eager summary op.

    Args:
      recorder: the inputs family's `Recorder` (its `pss_window`, a `Window`).
      per_worker: per worker, `(LeafLayout, {"shapes": int64 [D], "structure": ...})`.
      step: the step (each worker's `step`-th).

    Raises:
      ValueError: if the workers' inputs have different names (another step function).
    """
    probe, window = recorder.probe, recorder.pss_window
    layouts = [layout for layout, _ in per_worker]
    names = layouts[0].names
    if any(layout.names != names for layout in layouts):
        raise ValueError("the workers observed inputs of different names at one step")
    leaves = [_leaf_shapes(layout, values["shapes"]) for layout, values in per_worker]
    key = (tuple(layouts), tuple(tuple(tuple(s) for s in w) for w in leaves))
    structure = [values.get("structure") for _, values in per_worker]
    key += (tuple(None if v is None else tuple(v.tolist()) for v in structure),)
    if key != window.previous:
        document = _shapes_json(probe.static, layouts, leaves, structure)
        probe.write_now(schema.TAG_SHAPES, lambda: tf.constant(document), step, schema.KIND_SHAPES)
        window.previous = key
    batch = np.array(
        [_batch_size(layout, shape) for layout, shape in zip(layouts, leaves, strict=True)]
    )
    window.batch = batch
    window.low = batch if window.low is None else np.minimum(window.low, batch)
    window.high = batch if window.high is None else np.maximum(window.high, batch)
    window.last_step = step
    if probe.update_freq is not None and step % probe.update_freq == 0:
        write_window(recorder)


def write_window(recorder):
    """Writes the batch-size window since its last write at its last step, if it holds any."""
    window = recorder.pss_window
    if window.low is None:
        return
    value = np.stack([window.batch, window.low, window.high]).astype(np.int32)
    recorder.probe.write_now(
        schema.TAG_BATCH_SIZE, lambda: tf.constant(value), window.last_step, schema.KIND_BATCH_SIZE
    )
    window.low = window.high = None


def _leaf_shapes(layout, vector):
    """Each leaf's shape (a list of ints) from one worker's shape vector (`replica_shape_vector`:
    a leaf of run-time rank has its rank in front)."""
    shapes_of, offset = [], 0
    for rank in layout.ranks[0]:
        if rank is None:
            rank, offset = int(vector[offset]), offset + 1
        shapes_of.append([int(v) for v in vector[offset : offset + rank]])
        offset += rank
    return shapes_of


def _batch_size(layout, leaf_shapes):
    """The leading dimension of the first leaf of rank >= 1 (1 when every leaf is a scalar)."""
    for shape in leaf_shapes:
        if shape:
            return shape[0]
    return 1


def _shapes_json(static, layouts, leaves, structure):
    """The shapes event's JSON document (as `shapes.InputsStats.shapes_json` writes it)."""
    inputs = []
    for index, name in enumerate(layouts[0].names):
        entry = {
            "name": name,
            "dtypes": [layout.dtypes[index][0] for layout in layouts],
        }
        kinds = [layout.kinds[index][0] for layout in layouts]
        if any(kind != shapes.DENSE for kind in kinds):
            entry["kinds"] = kinds
        entry["shapes"] = [worker[index] for worker in leaves]
        if "kinds" in entry:
            start = 3 * layouts[0].nondense().index(index)
            entry["structure"] = [v[start : start + 3].tolist() for v in structure]
        inputs.append(entry)
    return json.dumps({**static, "inputs": inputs}, sort_keys=True)
