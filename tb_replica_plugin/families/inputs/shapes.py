"""The shapes of a structure of leaves on every replica: what the inputs family records, and the
watch family with it.

Per replica, the shapes of the leaves go into the step's transfer (`put_shapes`): those of dense
leaves of known rank are taken by the one `ShapeN` of the replica's packed vector
(`core.transfer`), a ragged or sparse leaf's (`shape_vector`) and what it holds
(`structure_vector`) are small int64 vectors packed beside them. On the host, `InputsStats` reads
them back as one `[R, D]` matrix: every replica's batch size, one fingerprint of every shape and
dtype, and the JSON of a shapes event (formatted only at a step whose fingerprint changed).
"""

import dataclasses
import hashlib
import json

import tensorflow as tf

# Kinds of leaf: a dense tensor, a `tf.RaggedTensor`, a `tf.SparseTensor`.
DENSE, RAGGED, SPARSE = "dense", "ragged", "sparse"
# The size recorded for a ragged dimension (its row lengths vary within the leaf).
RAGGED_DIM = -1


def leaf_kind(value):
    """ "dense", "ragged" (`tf.RaggedTensor`) or "sparse" (`tf.SparseTensor`)."""
    if isinstance(value, tf.RaggedTensor):
        return RAGGED
    if isinstance(value, tf.SparseTensor):
        return SPARSE
    return DENSE


def as_leaf(value):
    """`value` as a tensor, a `tf.RaggedTensor` or a `tf.SparseTensor` (others converted)."""
    if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
        return value
    return tf.convert_to_tensor(value)


def leaf_rank(value):
    """The static rank of a leaf (None when only known at run time)."""
    if isinstance(value, tf.RaggedTensor):
        inner = value.flat_values.shape.rank
        return None if inner is None else value.ragged_rank + inner
    return value.shape.rank


def shape_vector(value):
    """int64 [rank]: the shape of one leaf as recorded.

    Dense: `tf.shape`. Sparse: `dense_shape`. Ragged: `[nrows, -1 for each ragged dimension,
    the uniform inner dimensions of flat_values]`, so a ragged leaf's shape changes only when its
    row count or structure does, not with its row lengths.

    Example:
      >>> shape_vector(tf.ragged.constant([[1, 2], [3]])).numpy()
      array([ 2, -1])
    """
    if isinstance(value, tf.RaggedTensor):
        return tf.concat(
            [
                tf.reshape(value.nrows(out_type=tf.int64), [1]),
                tf.fill([value.ragged_rank], tf.constant(RAGGED_DIM, tf.int64)),
                tf.shape(value.flat_values, out_type=tf.int64)[1:],
            ],
            axis=0,
        )
    if isinstance(value, tf.SparseTensor):
        return tf.cast(value.dense_shape, tf.int64)
    return tf.shape(value, out_type=tf.int64)


def structure_vector(value):
    """int64 [3]: what one leaf holds at this step, besides its shape.

    Ragged: (total values in `flat_values`, shortest row, longest row) of the outermost ragged
    dimension (0, 0 without rows). Sparse: (nnz, -1, -1). Dense: (size, -1, -1).

    Example:
      >>> structure_vector(tf.ragged.constant([[1, 2], [3]])).numpy()
      array([3, 1, 2])
    """
    none = tf.constant(-1, tf.int64)
    if isinstance(value, tf.RaggedTensor):
        lengths = tf.cast(value.row_lengths(), tf.int64)
        has_rows = tf.size(lengths) > 0
        zero = tf.constant(0, tf.int64)
        shortest = tf.where(has_rows, tf.reduce_min(lengths), zero)
        longest = tf.where(has_rows, tf.reduce_max(lengths), zero)
        return tf.stack([tf.size(value.flat_values, out_type=tf.int64), shortest, longest])
    if isinstance(value, tf.SparseTensor):
        return tf.stack([tf.shape(value.indices, out_type=tf.int64)[0], none, none])
    return tf.stack([tf.size(value, out_type=tf.int64), none, none])


@dataclasses.dataclass(frozen=True)
class LeafLayout:
    """What is known of the leaves when tracing: names, and per leaf and replica dtype, kind and
    static rank.

    Attributes:
      names: one per leaf.
      dtypes: `dtypes[l][r]`, dtype names.
      kinds: `kinds[l][r]`, `DENSE`, `RAGGED` or `SPARSE`.
      ranks: `ranks[r][l]`, the static rank (None when only known at run time).
    """

    names: tuple
    dtypes: tuple
    kinds: tuple
    ranks: tuple

    @classmethod
    def of(cls, names, per_replica_leaves):
        """The layout of `per_replica_leaves[l][r]` named `names`."""
        count = len(per_replica_leaves[0]) if per_replica_leaves else 0
        return cls(
            names=tuple(names),
            dtypes=tuple(tuple(t.dtype.name for t in leaf) for leaf in per_replica_leaves),
            kinds=tuple(tuple(leaf_kind(t) for t in leaf) for leaf in per_replica_leaves),
            ranks=tuple(
                tuple(leaf_rank(leaf[r]) for leaf in per_replica_leaves) for r in range(count)
            ),
        )

    @property
    def num_replicas(self):
        return len(self.ranks)

    @property
    def uniform(self):
        """Every replica's ranks are known and the same: one static layout of the shapes."""
        first = self.ranks[0] if self.ranks else ()
        return bool(self.ranks) and None not in first and all(r == first for r in self.ranks)

    @property
    def dense(self):
        return all(kind == DENSE for kinds in self.kinds for kind in kinds)

    def nondense(self):
        """The indices of the leaves that are ragged or sparse (on some replica)."""
        return [i for i, kinds in enumerate(self.kinds) if any(k != DENSE for k in kinds)]


def replica_shape_vector(leaves, ranks):
    """int64: the shapes of one replica's leaves, one after the other (a leaf of run-time rank
    has its rank in front, so [4, 3] and [43] cannot collide)."""
    pieces = []
    for leaf, rank in zip(leaves, ranks, strict=True):
        shape = shape_vector(leaf)
        if rank is None:
            pieces.append(tf.reshape(tf.size(shape, out_type=tf.int64), [1]))
        pieces.append(shape)
    return tf.concat(pieces, axis=0) if pieces else tf.zeros([0], tf.int64)


def put_shapes(transfer, owner, layout, per_replica_leaves):
    """Puts every replica's shapes of `per_replica_leaves` in `transfer` (cross-replica context).

    Key `(owner, "shapes")`: packed (one `ShapeN` per replica for dense leaves, a vector of
    static length otherwise) when `layout.uniform`, else kept as each replica's vector;
    `(owner, "structure")`: `structure_vector` of each ragged or sparse leaf; `(owner,
    "layout")`: the `LeafLayout` (meta).
    """
    key = (owner, "shapes")
    for replica, packet in enumerate(transfer.packets):
        leaves = [leaf[replica] for leaf in per_replica_leaves]
        packet.meta[(owner, "layout")] = layout
        if layout.uniform and layout.dense:
            packet.shapes(key, leaves)
        else:
            with tf.device(packet.device):
                vector = replica_shape_vector(leaves, layout.ranks[replica])
            if layout.uniform:
                packet.ints(key, vector)
            else:
                packet.keep(key, vector)
        others = layout.nondense()
        if others:
            with tf.device(packet.device):
                structure = tf.concat([structure_vector(leaves[i]) for i in others], axis=0)
            packet.ints((owner, "structure"), structure)


def received(delivery, owner):
    """The `InputsStats` of what `put_shapes` put in a delivered transfer (host side)."""
    layout = delivery.meta((owner, "layout"))[0]
    key = (owner, "shapes")
    structure = None
    if delivery.has((owner, "structure")):
        structure = delivery.value((owner, "structure"))
    if delivery.has(key):
        return InputsStats(layout, matrix=delivery.value(key), structure=structure)
    return InputsStats(layout, vectors=delivery.kept(key), structure=structure)


class InputsStats:
    """The shapes of a structure of leaves at one step, on the host.

    Args:
      layout: the `LeafLayout`.
      matrix: int64 [R, D], every replica's shapes (`layout.uniform`), or None.
      vectors: each replica's int64 shape vector (`replica_shape_vector`) otherwise.
      structure: int64 [R, 3 * ragged or sparse leaves] (`structure_vector`s), or None.

    Attributes:
      batch_size: int32 tensor [R], leading dimension of the first leaf of rank >= 1 (0 for a
        replica whose leaf is empty, 1 if every leaf is a scalar).
      batch_size_int64: the same as int64 (the shapes' own dtype: no cast).
      fingerprint: int64 scalar tensor, changes whenever any shape or dtype on any replica changes.
    """

    def __init__(self, layout, matrix=None, vectors=None, structure=None):
        self.layout = layout
        self.names = list(layout.names)
        self.num_replicas = layout.num_replicas
        self.dtypes = [list(d) for d in layout.dtypes]
        self.kinds = [list(k) for k in layout.kinds]
        self._ranks = [list(r) for r in layout.ranks]
        self._structure = structure
        with tf.device("/cpu:0"):
            self._matrix = matrix
            if matrix is None and layout.uniform:
                self._matrix = tf.stack(vectors)
            self._vectors = vectors
            ranks = self._ranks[0] if self._ranks else []
            uniform = self._matrix is not None
            self._offsets = [sum(ranks[:i]) for i in range(len(ranks))] if uniform else None
            self.batch_size_int64 = self._batch_size()
            self.batch_size = tf.cast(self.batch_size_int64, tf.int32)
            self.fingerprint = self._fingerprint()

    @classmethod
    def of_leaves(cls, names, per_replica_leaves, devices=None):
        """The stats of `per_replica_leaves[l][r]` (each replica's shapes computed on its device,
        e.g. eagerly), without a transfer."""
        layout = LeafLayout.of(names, per_replica_leaves)
        devices = list(devices or [None] * layout.num_replicas)
        vectors, rows = [], []
        for replica, device in enumerate(devices):
            leaves = [leaf[replica] for leaf in per_replica_leaves]
            with tf.device(device):
                vectors.append(replica_shape_vector(leaves, layout.ranks[replica]))
                others = layout.nondense()
                if others:
                    rows.append(tf.concat([structure_vector(leaves[i]) for i in others], 0))
        structure = tf.stack(rows) if rows else None
        return cls(layout, vectors=vectors, structure=structure)

    def _leaf_shape(self, replica, leaf):
        """Shape of one leaf on one replica, sliced from that replica's vector (run-time rank
        leaves carry their rank in front)."""
        if self._matrix is not None:
            offset = self._offsets[leaf]
            return self._matrix[replica, offset : offset + self._ranks[replica][leaf]]
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

    def leaf_size(self, leaf):
        """`(values, leading dimension)` of dense leaf `leaf` on every replica: float64 [R] each
        (a scalar's leading dimension is 1)."""
        if self._matrix is not None:
            rank, offset = self._ranks[0][leaf], self._offsets[leaf]
            columns = self._matrix[:, offset : offset + rank]
        else:
            columns = None
        with tf.device("/cpu:0"):
            if columns is None:
                shapes = [self._leaf_shape(r, leaf) for r in range(self.num_replicas)]
                size = tf.stack([tf.reduce_prod(shape) for shape in shapes])
                padded = [tf.concat([shape, tf.ones([1], tf.int64)], 0)[0] for shape in shapes]
                nrows = tf.stack(padded)
            else:
                size = tf.reduce_prod(columns, axis=1)
                nrows = columns[:, 0] if rank else tf.ones([self.num_replicas], tf.int64)
            return tf.cast(size, tf.float64), tf.cast(nrows, tf.float64)

    def _batch_size(self):
        for leaf in range(len(self.names)):
            ranks = [self._ranks[r][leaf] for r in range(self.num_replicas)]
            if ranks and all(rank is None or rank >= 1 for rank in ranks):
                if self._matrix is not None:
                    return self._matrix[:, self._offsets[leaf]]
                # A run-time rank of 0 would make [0] fail; such inputs are rare (scalars).
                return tf.stack([self._leaf_shape(r, leaf)[0] for r in range(self.num_replicas)])
        return tf.ones([self.num_replicas], tf.int64)

    def _fingerprint(self):
        static = json.dumps([self.names, self.dtypes, self.kinds, self._ranks]).encode("utf-8")
        static_hash = int.from_bytes(hashlib.blake2b(static, digest_size=7).digest(), "little")
        if self._matrix is not None:
            # The vectors' lengths are known when tracing: in the static hash.
            signature = tf.concat(
                [tf.constant([static_hash], tf.int64), tf.reshape(self._matrix, [-1])], 0
            )
        else:
            lengths = [tf.reshape(tf.size(v, out_type=tf.int64), [1]) for v in self._vectors]
            signature = tf.concat(
                [tf.constant([static_hash], tf.int64), *lengths, *self._vectors], 0
            )
        digest = tf.fingerprint(tf.expand_dims(tf.bitcast(signature, tf.uint8), 0))
        return tf.reshape(tf.bitcast(digest, tf.int64), [])

    def shapes_json(self, static_fields, key="inputs", tail=()):
        """Builds the JSON document of a shapes event as a scalar string tensor.

        Args:
          static_fields: dict of JSON-serialisable fields known when tracing (devices, replica
            ids, source) merged into the document.
          key: the document's key of the list of leaves.
          tail: more JSON pieces (strings or scalar string tensors), each starting with ", ",
            before the document's closing brace.

        Returns:
          A scalar tf.string tensor, e.g. `{"inputs": [{"name": "x", "dtypes": ["float32"],
          "shapes": [[4, 3]]}], "devices": [...], ...}`. A ragged or sparse leaf also has
          `kinds` (per replica) and `structure` (per replica, `structure_vector`: total values
          and row-length range, or nnz).
        """
        head = json.dumps(static_fields, sort_keys=True)[:-1]
        pieces = [head, f'{", " if static_fields else ""}"{key}": [']
        strings = tf.strings.as_string(self._matrix) if self._matrix is not None else None
        for index, (name, dtypes) in enumerate(zip(self.names, self.dtypes, strict=True)):
            fields = {"name": name, "dtypes": dtypes}
            kinds = self.kinds[index]
            if any(kind != DENSE for kind in kinds):
                fields["kinds"] = kinds
            pieces.append(("" if index == 0 else ", ") + json.dumps(fields)[:-1] + ', "shapes": [')
            pieces.extend(self._shapes_of(index, strings))
            pieces.append("]")
            if "kinds" in fields:
                pieces.extend(self._structure_of(index))
            pieces.append("}")
        pieces.extend(["]", *tail, "}"])
        return tf.strings.join(pieces)

    def _shapes_of(self, index, strings):
        """The JSON pieces of leaf `index`'s shapes on every replica."""
        if strings is not None:
            # One static layout: every replica's shape of a leaf formatted in one set of ops.
            rank, offset = self._ranks[0][index], self._offsets[index]
            if rank == 0:
                return [", ".join(["[]"] * self.num_replicas)]
            rows = tf.strings.reduce_join(
                strings[:, offset : offset + rank], axis=1, separator=", "
            )
            return ["[", tf.strings.reduce_join(rows, separator="], ["), "]"]
        pieces = []
        for replica in range(self.num_replicas):
            shape = tf.strings.as_string(self._leaf_shape(replica, index))
            pieces += [
                "[" if replica == 0 else ", [",
                tf.strings.reduce_join(shape, separator=", "),
            ]
            pieces.append("]")
        return pieces

    def _structure_of(self, index):
        """The JSON pieces of what each replica's ragged or sparse leaf `index` holds."""
        pieces = [', "structure": [']
        start = 3 * self.layout.nondense().index(index)
        for replica in range(self.num_replicas):
            vector = self._structure[replica, start : start + 3]
            pieces.append("[" if replica == 0 else ", [")
            pieces.append(tf.strings.reduce_join(tf.strings.as_string(vector), separator=", "))
            pieces.append("]")
        pieces.append("]")
        return pieces
