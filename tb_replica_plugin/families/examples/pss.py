"""Examples family under `ParameterServerStrategy`: which examples each worker was fed.

Each worker runs its own input pipeline; a `dataset_fn` that does not shard (or a
`tf.data.Dataset` given to tf_keras `fit`, which every worker iterates whole) feeds every worker
the same examples, and the updates of one batch reach the parameter servers once per worker.

In the scheduled step (`ReplicaProbe.schedule`, or tf_keras `fit`), `observe_examples` decides on
the worker whether this batch is sampled *from its content*: the farmhash64 of its first
example's first leaf, modulo `examples_every` (every batch with `examples_every=1`). Two workers
fed the same batch decide alike, so an unsharded pipeline is caught whatever steps the workers
are at; a sampled batch puts its examples' fingerprints (`record.example_fingerprints`, 8 bytes
per example) in the step's record. On the coordinator, step k of every worker is compared when
every worker's k-th batch was sampled, and written in the family's tags and layouts
(`data/examples`, `data/overlap`, with its window sums) at logged steps and window writes.
"""

import numpy as np
import tensorflow as tf

from tb_replica_plugin.core import distribute
from tb_replica_plugin.core.nest import flatten_with_names
from tb_replica_plugin.families.examples import schema
from tb_replica_plugin.families.examples.fingerprints import (
    SKETCH_SIZE,
    byte_view,
    example_fingerprints,
)


def observe(probe, batch):
    """In the scheduled step: puts this worker's example fingerprints in its record when its
    batch is sampled.

    Args:
      probe: the `ReplicaProbe` (capturing a scheduled step).
      batch: the (nested) structure of this worker's input tensors.
    """
    local = distribute.worker_local
    leaves = [local(probe.strategy, leaf) for _, leaf in flatten_with_names(batch)]
    leaves = [leaf for leaf in leaves if not isinstance(leaf, tf.SparseTensor)]
    dense = [leaf for leaf in leaves if not isinstance(leaf, tf.RaggedTensor)]
    dense = [tf.convert_to_tensor(leaf) for leaf in dense]
    dense = [leaf for leaf in dense if leaf.shape.rank is None or leaf.shape.rank >= 1]
    if not dense:
        probe.warn_once("data_none", "tb_replica_plugin: observe_examples got no tensors.")
        return
    sampled = _sampled(dense[0], probe.examples_every)
    fingerprints = tf.cond(
        sampled, lambda: example_fingerprints(leaves), lambda: tf.zeros([0], tf.int64)
    )
    tensors = {"sampled": tf.reshape(tf.cast(sampled, tf.int64), [1]), "fp": fingerprints}
    probe.pss_capture("examples", None, tensors)


def _sampled(first, every):
    """Whether a batch is sampled, from its content: its first example of `first` hashed."""
    rows = tf.shape(first)[0]
    if every == 1:
        return rows > 0

    def by_hash():
        row = tf.reshape(byte_view(first[:1]), [1, -1])
        digest = tf.bitcast(tf.fingerprint(row), tf.int64)
        return tf.equal(tf.math.floormod(tf.reshape(digest, []), every), 0)

    return tf.cond(rows > 0, by_hash, lambda: tf.constant(False))


class Window:
    """The coordinator's state of the examples family under this strategy (numpy): the last
    compared step's values and the window's sums since the last write."""

    def __init__(self, workers):
        self.last = None  # (step, examples [R, 4 + K], overlap [3, R, R])
        self.dup = np.zeros(workers, np.int64)
        self.shared = np.zeros((workers, workers), np.int64)
        self.steps = np.zeros((workers, workers), np.int64)


def step_stats(fingerprints):
    """`(examples [R, 4 + K], shared [R, R])` of one step's fingerprints per worker, as
    `record.OverlapStats` computes them on a device (numpy).

    Args:
      fingerprints: per worker, an int64 array of its batch's example fingerprints.

    Example:
      >>> step_stats([np.array([1, 2, 2]), np.array([2, 3])])[1].tolist()
      [[2, 1], [1, 2]]
    """
    uniques = [np.unique(f) for f in fingerprints]
    workers = len(uniques)
    shared = np.array(
        [[np.intersect1d(a, b, assume_unique=True).size for b in uniques] for a in uniques],
        np.int64,
    ).reshape(workers, workers)
    rows = []
    for index, unique in enumerate(uniques):
        others = [u for other, u in enumerate(uniques) if other != index]
        elsewhere = np.concatenate(others) if others else np.zeros(0, np.int64)
        duplicated = int(np.isin(unique, elsewhere).sum())
        sketch = np.zeros(SKETCH_SIZE, np.int64)
        smallest = unique[:SKETCH_SIZE]  # np.unique sorts (signed int64 order)
        sketch[: smallest.size] = smallest
        rows.append([fingerprints[index].size, unique.size, duplicated, 0, *sketch])
    return np.array(rows, np.int64).reshape(workers, 4 + SKETCH_SIZE), shared


def deliver(recorder, per_worker, step):
    """On the coordinator: step `step` of every worker compared when every worker's batch was
    sampled; written at logged steps (else kept for the window write).

    Args:
      recorder: the examples family's `Recorder` (its `pss_window`, a `Window`).
      per_worker: per worker, `(None, {"sampled": [1], "fp": int64 [B]})`.
      step: the step (each worker's `step`-th).
    """
    if not all(int(values["sampled"][0]) for _, values in per_worker):
        return
    window = recorder.pss_window
    examples, shared = step_stats([values["fp"] for _, values in per_worker])
    any_shared = (shared > 0).astype(np.int64)
    np.fill_diagonal(any_shared, 1)
    window.dup += examples[:, 2]
    window.shared += shared
    window.steps += any_shared
    examples[:, 3] = window.dup
    window.last = (step, examples, np.stack([shared, window.shared, window.steps]))
    probe = recorder.probe
    if probe.update_freq is not None and step % probe.update_freq == 0:
        write_window(recorder)


def write_window(recorder):
    """Writes the last compared step with the window's sums, if any step was compared since."""
    window = recorder.pss_window
    if window is None or window.last is None:
        return
    step, examples, overlap = window.last
    overlap = np.minimum(overlap, 2**31 - 1).astype(np.int32)
    probe = recorder.probe
    probe.write_now(
        schema.TAG_DATA_EXAMPLES, lambda: tf.constant(examples), step, schema.KIND_DATA_EXAMPLES
    )
    probe.write_now(
        schema.TAG_DATA_OVERLAP, lambda: tf.constant(overlap), step, schema.KIND_DATA_OVERLAP
    )
    workers = len(examples)
    recorder.pss_window = Window(workers)
