"""Inputs family: per-replica batch size, and the shape and dtype of every input leaf.

Everything here runs in cross-replica context on the per-replica tensors of one step (a list over
local replicas). The batch size is the leading dimension of the first input leaf; shapes are kept
only as small int vectors until a change has to be written, when they are formatted to JSON
in-graph (see `shapes_json`).
"""

import hashlib
import json

import tensorflow as tf

# Names Keras gives to the parts of a `fit` batch, in `unpack_x_y_sample_weight` order.
FIT_BATCH_NAMES = ("x", "y", "sample_weight")


def flatten_with_names(structure, prefix=""):
    """Flattens nested dicts/lists/tuples of tensors into `(name, leaf)` pairs.

    Dict keys are sorted (as `tf.nest` does), sequence items are numbered, namedtuple fields keep
    their names, `None` leaves are dropped. Any other object is a leaf.

    Args:
      structure: the nested structure, e.g. `{"image": t1, "label": t2}` or `(t1, t2)`.
      prefix: the name of `structure` itself ("" for the root).

    Returns:
      A list of `(name, leaf)` pairs; names are joined with "/", e.g. `"x/image"`.

    Example:
      >>> flatten_with_names({"b": 1, "a": (2, None)})
      [('a/0', 2), ('b', 1)]
    """

    def join(key):
        return f"{prefix}/{key}" if prefix else str(key)

    if structure is None:
        return []
    if isinstance(structure, dict):
        pairs = []
        for key in sorted(structure, key=str):
            pairs.extend(flatten_with_names(structure[key], join(key)))
        return pairs
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        pairs = []
        for key in structure._fields:
            pairs.extend(flatten_with_names(getattr(structure, key), join(key)))
        return pairs
    if isinstance(structure, (list, tuple)):
        pairs = []
        for index, item in enumerate(structure):
            pairs.extend(flatten_with_names(item, join(index)))
        return pairs
    return [(prefix or "input", structure)]


def name_fit_batch(data):
    """Names the parts of a Keras `fit` batch `(x,)`, `(x, y)` or `(x, y, sample_weight)`.

    Args:
      data: the batch as `train_step` receives it.

    Returns:
      A dict `{"x": ..., "y": ..., "sample_weight": ...}` without the missing parts.
    """
    if isinstance(data, tuple) and not hasattr(data, "_fields") and 1 <= len(data) <= 3:
        return {
            name: part
            for name, part in zip(FIT_BATCH_NAMES, data, strict=False)
            if part is not None
        }
    return {"x": data}


class InputsStats:
    """The inputs family for one step, computed from per-replica leaves in cross-replica context.

    Each replica's shapes are packed into one int64 vector on that replica's device, so a step
    moves one small tensor per replica to the merge point, whatever the number of inputs.

    Args:
      names: input names, one per leaf.
      per_replica_leaves: `per_replica_leaves[l][r]` is the tensor of leaf `l` on replica `r`.
      devices: optional device of each replica, where its shape vector is computed.

    Attributes:
      batch_size: int32 tensor [R], leading dimension of the first leaf of rank >= 1 (0 for a
        replica whose leaf is empty, 1 if every leaf is a scalar).
      fingerprint: int64 scalar tensor, changes whenever any shape or dtype on any replica changes.
    """

    def __init__(self, names, per_replica_leaves, devices=None):
        self.names = list(names)
        self.num_replicas = len(per_replica_leaves[0]) if per_replica_leaves else 0
        self.dtypes = [[t.dtype.name for t in leaf] for leaf in per_replica_leaves]
        devices = list(devices or [None] * self.num_replicas)
        # ranks[r][l]: static rank, or None when only known at run time.
        self._ranks = [
            [leaf[r].shape.rank for leaf in per_replica_leaves] for r in range(self.num_replicas)
        ]
        vectors = []
        for replica in range(self.num_replicas):
            with tf.device(devices[replica]):
                pieces = []
                for leaf, rank in zip(per_replica_leaves, self._ranks[replica], strict=True):
                    shape = tf.shape(leaf[replica], out_type=tf.int64)
                    if rank is None:  # the rank goes in front, so [4, 3] and [43] cannot collide
                        pieces.append(tf.reshape(tf.size(shape, out_type=tf.int64), [1]))
                    pieces.append(shape)
                vectors.append(tf.concat(pieces, axis=0) if pieces else tf.zeros([0], tf.int64))
        self._vectors = vectors
        self.batch_size = self._batch_size()
        self.fingerprint = self._fingerprint()

    def _leaf_shape(self, replica, leaf):
        """Shape of one leaf on one replica, sliced from that replica's vector (run-time rank
        leaves carry their rank in front)."""
        offset = 0
        vector = self._vectors[replica]
        for index, rank in enumerate(self._ranks[replica]):
            if rank is None:
                size = vector[offset]
                if index == leaf:
                    return vector[offset + 1 : offset + 1 + size]
                offset = offset + 1 + size
            else:
                if index == leaf:
                    return vector[offset : offset + rank]
                offset = offset + rank
        raise IndexError(leaf)

    def _batch_size(self):
        for leaf in range(len(self.names)):
            ranks = [self._ranks[r][leaf] for r in range(self.num_replicas)]
            if ranks and all(rank is None or rank >= 1 for rank in ranks):
                # A run-time rank of 0 would make [0] fail; such inputs are rare (scalars).
                return tf.cast(
                    tf.stack([self._leaf_shape(r, leaf)[0] for r in range(self.num_replicas)]),
                    tf.int32,
                )
        return tf.ones([self.num_replicas], tf.int32)

    def _fingerprint(self):
        static = json.dumps([self.names, self.dtypes, self._ranks]).encode("utf-8")
        static_hash = int.from_bytes(hashlib.blake2b(static, digest_size=7).digest(), "little")
        lengths = [tf.reshape(tf.size(v, out_type=tf.int64), [1]) for v in self._vectors]
        signature = tf.concat([tf.constant([static_hash], tf.int64), *lengths, *self._vectors], 0)
        digest = tf.fingerprint(tf.expand_dims(tf.bitcast(signature, tf.uint8), 0))
        return tf.reshape(tf.bitcast(digest, tf.int64), [])

    def shapes_json(self, static_fields):
        """Builds the JSON document of a shapes event as a scalar string tensor.

        Args:
          static_fields: dict of JSON-serialisable fields known when tracing (devices, replica
            ids, source) merged into the document.

        Returns:
          A scalar tf.string tensor, e.g. `{"inputs": [{"name": "x", "dtypes": ["float32"],
          "shapes": [[4, 3]]}], "devices": [...], ...}`.
        """
        pieces = [json.dumps(static_fields, sort_keys=True)[:-1], ', "inputs": [']
        for index, (name, dtypes) in enumerate(zip(self.names, self.dtypes, strict=True)):
            head = json.dumps({"name": name, "dtypes": dtypes})[:-1] + ', "shapes": ['
            pieces.append(("" if index == 0 else ", ") + head)
            for replica in range(self.num_replicas):
                shape = self._leaf_shape(replica, index)
                pieces.append("[" if replica == 0 else ", [")
                pieces.append(tf.strings.reduce_join(tf.strings.as_string(shape), separator=", "))
                pieces.append("]")
            pieces.append("]}")
        pieces.append("]}")
        return tf.strings.join(pieces)
