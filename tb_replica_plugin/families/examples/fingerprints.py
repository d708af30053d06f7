"""Per-example fingerprints of the examples family (see `record.py`'s docstring for the hash).

Shared by the probe's path (`record.py`) and the `ParameterServerStrategy` path (`pss.py`).
"""

import tensorflow as tf

SKETCH_SIZE = 16


def byte_view(leaf):
    """`leaf` as the bytes an example row is hashed from: `bool` cast to uint8, numbers bit-cast
    to uint8 (one more dimension of `dtype.size`), strings and 8-bit integers as they are."""
    if leaf.dtype == tf.bool:
        leaf = tf.cast(leaf, tf.uint8)
    if leaf.dtype not in (tf.string, tf.uint8, tf.int8):
        leaf = tf.bitcast(leaf, tf.uint8)
    return leaf


def _leaf_digest(leaf, batch):
    """[B, 8] uint8 farmhash64 of each example row of one leaf."""
    leaf = byte_view(leaf)
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
    tensors = []
    for leaf in leaves:
        if isinstance(leaf, tf.SparseTensor):
            continue  # its dense form may be huge (e.g. [batch, vocabulary]): not fingerprinted
        # A ragged leaf is fingerprinted padded to its longest row (a row's padding is zeros).
        tensors.append(leaf.to_tensor() if isinstance(leaf, tf.RaggedTensor) else leaf)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    tensors = [t for t in tensors if t.shape.rank is None or t.shape.rank >= 1]
    if not tensors:
        return tf.zeros([0], tf.int64)
    batch = tf.shape(tensors[0], out_type=tf.int64)[0]
    digests = [_leaf_digest(tensors[0], None)]
    digests += [_leaf_digest(t, batch) for t in tensors[1:]]
    combined = tf.fingerprint(tf.concat(digests, axis=1))
    return tf.reshape(tf.bitcast(combined, tf.int64), [-1])
