"""Inputs family under `ParameterServerStrategy`: each worker's shapes come back with its step.

In the scheduled step (`ReplicaProbe.schedule`), `observe_inputs` puts the worker's shape vector
(and the structure of ragged or sparse leaves) in the step's record; on the coordinator, step k's
vectors of every worker become one `InputsStats` (replica r: worker r) that the family's own
write records, as a step of any other strategy: the same tags, layouts and window.
"""

import tensorflow as tf

from tb_replica_plugin.core.nest import flatten_with_names
from tb_replica_plugin.families.inputs import shapes


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
    """The worker's one local value of `leaf` (a `PerReplica` of one replica, or a tensor)."""
    if isinstance(leaf, tf.distribute.DistributedValues):
        values = probe.strategy.experimental_local_results(leaf)
        if len(values) != 1:
            raise ValueError(
                f"got {len(values)} replicas on one worker; under ParameterServerStrategy the "
                "probe records workers of one replica each"
            )
        leaf = values[0]
    return shapes.as_leaf(leaf)


def deliver(recorder, per_worker, step):
    """On the coordinator: step `step` of every worker, written as one step of the run.

    Args:
      recorder: the inputs family's `Recorder`.
      per_worker: per worker, `(LeafLayout, {"shapes": int64 [D], "structure": ...})`.
      step: the step (each worker's `step`-th).

    Raises:
      ValueError: if the workers' inputs have different names (another step function).
    """
    layouts = [layout for layout, _ in per_worker]
    names = layouts[0].names
    if any(layout.names != names for layout in layouts):
        raise ValueError("the workers observed inputs of different names at one step")
    layout = shapes.LeafLayout(
        names=names,
        dtypes=tuple(tuple(lay.dtypes[i][0] for lay in layouts) for i in range(len(names))),
        kinds=tuple(tuple(lay.kinds[i][0] for lay in layouts) for i in range(len(names))),
        ranks=tuple(lay.ranks[0] for lay in layouts),
    )
    with tf.init_scope(), tf.device("/cpu:0"):
        vectors = [tf.constant(values["shapes"], tf.int64) for _, values in per_worker]
        structure = None
        if layout.nondense():
            structure = tf.constant([values["structure"] for _, values in per_worker], tf.int64)
        stats = shapes.InputsStats(layout, vectors=vectors, structure=structure)
        recorder.write_step(stats, tf.constant(step, tf.int64))
