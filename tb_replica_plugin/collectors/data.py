"""Data family: a fingerprint per example, and which replicas were fed the same examples.

Per-example fingerprint (deterministic across processes and machines, so workers of a multi-worker
job can be compared offline; little-endian hosts):

1. For each input leaf (named and ordered as `inputs.flatten_with_names`: dict keys sorted, `x`,
   `y`, `sample_weight` in `fit`) with a leading batch dimension B: its example rows as bytes
   (`bool` cast to uint8, numbers bit-cast to uint8, `[B, -1]`; strings stay strings), hashed by
   `tf.fingerprint` (farmhash64) into 8 bytes per example. A leaf whose leading dimension differs
   from the first leaf's contributes 8 zero bytes; rank-0 leaves are skipped.
2. The leaf digests of one example are concatenated (8 bytes per leaf, leaf order) and hashed
   again with `tf.fingerprint`; the 8 bytes bit-cast to int64 are the example's fingerprint.

Per step the probe keeps, per replica, the set of distinct fingerprints; it computes in-graph the
replica × replica count of shared examples (exact) and writes a bottom-K sketch of each replica's
set (the K smallest fingerprints in signed int64 order), enough to tell identical batches apart
from disjoint ones across workers and to estimate overlaps (Jaccard of two bottom-K sketches).
"""

import tensorflow as tf

SKETCH_SIZE = 16


def _leaf_digest(leaf, batch):
    """[B, 8] uint8 farmhash64 of each example row of one leaf."""
    if leaf.dtype == tf.bool:
        leaf = tf.cast(leaf, tf.uint8)
    if leaf.dtype != tf.string and leaf.dtype != tf.uint8 and leaf.dtype != tf.int8:
        leaf = tf.bitcast(leaf, tf.uint8)
    shape = tf.shape(leaf, out_type=tf.int64)
    rows = tf.reshape(leaf, tf.stack([shape[0], tf.reduce_prod(shape[1:])]))
    digest = tf.fingerprint(rows)
    if batch is None:
        return digest
    return tf.cond(
        tf.equal(shape[0], batch),
        lambda: digest,
        lambda: tf.zeros(tf.stack([batch, 8]), tf.uint8),
    )


def example_fingerprints(leaves):
    """int64 [B]: one fingerprint per example of a replica's batch (see the module docstring).

    Args:
      leaves: the replica's input tensors, in name order.

    Returns:
      An int64 vector with the batch's leading dimension (empty when no leaf has rank >= 1).

    Example:
      >>> example_fingerprints([tf.constant([[1.0], [1.0], [2.0]])]).numpy()[0] == _[1]
      True
    """
    tensors = [tf.convert_to_tensor(leaf) for leaf in leaves]
    tensors = [t for t in tensors if t.shape.rank is None or t.shape.rank >= 1]
    if not tensors:
        return tf.zeros([0], tf.int64)
    batch = tf.shape(tensors[0], out_type=tf.int64)[0]
    digests = [_leaf_digest(tensors[0], None)]
    digests += [_leaf_digest(t, batch) for t in tensors[1:]]
    combined = tf.fingerprint(tf.concat(digests, axis=1))
    return tf.reshape(tf.bitcast(combined, tf.int64), [-1])


class OverlapStats:
    """Cross-replica statistics of one step's example fingerprints (cross-replica context).

    Args:
      fingerprints: list over local replicas of int64 [B_r] vectors.
      sketch_size: K, fingerprints kept per replica in the sketch.

    Attributes:
      batch_size: int64 [R], examples per replica.
      distinct: int64 [R], distinct examples per replica.
      duplicated: int64 [R], distinct examples of a replica also fed to another replica.
      shared: int64 [R, R], distinct examples fed to both replicas (diagonal: `distinct`).
      sketch: int64 [R, K], the K smallest distinct fingerprints per replica, ascending, zero
        padded after `min(distinct, K)` entries.
    """

    def __init__(self, fingerprints, sketch_size=SKETCH_SIZE):
        num = len(fingerprints)
        uniques = [tf.unique(f).y for f in fingerprints]
        self.batch_size = tf.stack([tf.size(f, out_type=tf.int64) for f in fingerprints])
        self.distinct = tf.stack([tf.size(u, out_type=tf.int64) for u in uniques])
        everything = tf.concat(uniques, axis=0)
        owner = tf.concat(
            [tf.fill(tf.shape(u), tf.constant(r, tf.int32)) for r, u in enumerate(uniques)], 0
        )
        values, index = tf.unique(everything, out_idx=tf.int32)
        presence = tf.math.unsorted_segment_max(
            tf.one_hot(owner, num, dtype=tf.int32), index, tf.size(values)
        )
        as_float = tf.cast(presence, tf.float64)
        self.shared = tf.cast(tf.matmul(as_float, as_float, transpose_a=True), tf.int64)
        on_several = tf.cast(tf.reduce_sum(presence, axis=1) > 1, tf.int64)
        self.duplicated = tf.reduce_sum(tf.cast(presence, tf.int64) * on_several[:, None], 0)
        rows = []
        for unique in uniques:
            smallest = tf.sort(unique)[:sketch_size]
            rows.append(tf.pad(smallest, [[0, sketch_size - tf.size(smallest)]]))
        self.sketch = tf.stack(rows)
