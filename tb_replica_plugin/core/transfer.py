"""One transfer per replica: what every family sends from a replica's device to the host at a
step, packed into one int64 vector, and how the host unpacks it.

    replica r's device: shape vectors, counts, sums of squares, stats ... ─┐  (one int64 vector)
    (and, where one of its float values is not finite, the fault branch) ──┘──► host: unpacked
                                                                                per family

A `Transfer` holds one `Packet` per local replica. Families put their per-replica values in it
(`Packet.shapes`, `ints`, `floats`; `on_fault`: values computed only where a float value of that
replica is not finite, on its device) and register what the host does with them
(`Transfer.on_host`). When the transfer is delivered (`deliver`: at the end of a step scope, or at
once for a call outside one), each packet becomes one vector on its replica's device: the shape
vectors of all dense tensors from one `ShapeN`, the float values bit-cast into int64 words, the
fault branch's words; the host receives it once, stacks the replicas' vectors into an
`[R, words]` matrix and calls each family's handler with a `Delivery`, which slices its values
back out. A step scope also takes a host timestamp at its start and one when each replica's
vector has arrived (after an identity of the received tensor on the host: a data dependency,
which on an accelerator waits for the copy, so for the work that produced it).

Values needed only at some steps do not travel at the others: they stay in the step's graph as
tensors a host branch reads when it is taken (the examples' batch; on logical CPU replicas the
batch is on the host already), or come from the replica's fault branch.
"""

import dataclasses

import tensorflow as tf

from tb_replica_plugin.core.recorder import cond_value

# Regions of a packed vector, in order.
SHAPES, INTS, FLOATS, FAULTS = "shapes", "ints", "floats", "faults"


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where one value sits in every replica's vector.

    Attributes:
      key: `(family, name)`.
      region: one of SHAPES, INTS, FLOATS, FAULTS.
      start: the first word of the value in its region.
      size: its number of words.
      dtype: int64 or float64 (a float value comes back as float64).
    """

    key: tuple
    region: str
    start: int
    size: int
    dtype: tf.DType


class Packet:
    """One replica's values of one transfer (built on its device when delivered).

    Args:
      device: the replica's device.

    Attributes:
      device: the replica's device.
      kept: `{key: value}` handed to the host as they are (not packed: a value whose size is
        only known at run time; tensors a host branch reads at the steps it is taken).
      meta: `{key: Python object}` known when tracing (names, dtypes, static shapes).
    """

    def __init__(self, device):
        self.device = device
        self.kept = {}
        self.meta = {}
        self._shapes = []  # (key, [dense tensors of known rank])
        self._ints = []  # (key, int64 [n])
        self._floats = []  # (key, float32 or float64 vector, or a list of such scalars)
        self._faults = []  # (key, fn, size, dtype, guard)

    def shapes(self, key, tensors):
        """The shapes of dense `tensors` (each of known rank), as one int64 value.

        Raises:
          ValueError: if a tensor's rank is unknown (send its shape with `keep` then).
        """
        ranks = [t.shape.rank for t in tensors]
        if None in ranks:
            raise ValueError(f"{key}: a tensor of unknown rank cannot be packed")
        self._shapes.append((key, list(tensors)))

    def ints(self, key, vector):
        """An integer vector of static length (sent as int64). Compute it on the replica's
        device (`tf.device(packet.device)`): a value computed elsewhere is one more copy."""
        with tf.device(self.device):
            vector = tf.convert_to_tensor(vector)
            _static_length(key, vector)
            if vector.dtype != tf.int64:
                vector = tf.cast(vector, tf.int64)
        self._ints.append((key, vector))

    def floats(self, key, values):
        """Float values computed on the replica's device (they come back as float64): a vector
        of static length, or a list of scalars (every scalar of a packet of one dtype is stacked
        by one op). Any of a packet's float values that is not finite runs its fault branch
        (`on_fault`)."""
        with tf.device(self.device):
            if isinstance(values, (list, tuple)):
                values = [_float(tf.convert_to_tensor(v)) for v in values]
                if not values:
                    return
                if any(v.shape.rank != 0 for v in values):
                    raise ValueError(f"{key}: a list of float values holds scalars only")
                if len({v.dtype for v in values}) > 1:
                    values = [tf.cast(v, tf.float64) for v in values]
            else:
                values = _float(tf.convert_to_tensor(values))
                _static_length(key, values)
        self._floats.append((key, values))

    def on_fault(self, key, fn, size, dtype, guard=()):
        """A value computed on the replica's device only where one of its float values is not
        finite (zeros elsewhere): `fn()` returns a vector of `size` values of `dtype` (int64 or
        float64). `guard`: keys of the float values whose finiteness alone decides it (inside
        the fault branch, the value is zeroed where they are finite); empty: any of the packet's
        float values."""
        self._faults.append((key, fn, int(size), tf.as_dtype(dtype), tuple(guard)))

    def keep(self, key, value):
        """`value` handed to the host as it is (see `kept`)."""
        self.kept[key] = value

    def drop(self, family):
        """Forgets every value of `family` (its recording failed half-way)."""
        self._shapes = [p for p in self._shapes if p[0][0] != family]
        self._ints = [p for p in self._ints if p[0][0] != family]
        self._floats = [p for p in self._floats if p[0][0] != family]
        self._faults = [p for p in self._faults if p[0][0] != family]
        for store in (self.kept, self.meta):
            for key in [k for k in store if k[0] == family]:
                del store[key]

    def layout(self):
        """The `Slot`s of this packet's vector, in order, and its length in words."""
        slots, offset = [], 0
        regions = (
            (SHAPES, [(k, sum(t.shape.rank for t in ts), tf.int64) for k, ts in self._shapes]),
            (INTS, [(k, int(v.shape[0]), tf.int64) for k, v in self._ints]),
            (FLOATS, [(k, _length(v), tf.float64) for k, v in self._float_order()]),
            (FAULTS, [(k, size, dtype) for k, _, size, dtype, _ in self._faults]),
        )
        for region, entries in regions:
            start = 0
            for key, size, dtype in entries:
                slots.append(Slot(key, region, start, size, dtype))
                start += size
            offset += start
        return tuple(slots), offset

    def _float_order(self):
        """The float values in vector order: float32 ones (scalars, then vectors), then float64
        ones (the same), so that each dtype's scalars are stacked and cast together."""
        order = []
        for dtype in (tf.float32, tf.float64):
            same = [(k, v) for k, v in self._floats if _dtype(v) == dtype]
            order += [p for p in same if isinstance(p[1], list)]
            order += [p for p in same if not isinstance(p[1], list)]
        return order

    @property
    def empty(self):
        return not (self._shapes or self._ints or self._floats or self._faults)

    def vector(self, slots):
        """int64 [words]: this packet's values packed on its device (see the module docstring).

        Args:
          slots: `layout()`'s slots (the same for every replica of the transfer).
        """
        with tf.device(self.device):
            words = []
            words.extend(_shapes(t for _, ts in self._shapes for t in ts))
            words.extend(v for _, v in self._ints)
            floats = self._float_words()
            if floats is not None:
                words.append(tf.bitcast(floats, tf.int64))
            if self._faults:
                words.append(self._fault_words(floats, slots))
            if not words:
                return tf.zeros([0], tf.int64)
            return tf.concat(words, axis=0) if len(words) > 1 else tf.reshape(words[0], [-1])

    def _float_words(self):
        """float64 [floats] in `_float_order`, or None without any: per dtype, its scalars
        stacked by one op and its vectors joined; the float32 ones cast by one op."""
        groups = []
        for dtype in (tf.float32, tf.float64):
            parts, scalars = [], []
            for _, values in self._float_order():
                if _dtype(values) != dtype:
                    continue
                if isinstance(values, list):
                    scalars.extend(values)
                else:
                    parts.append(values)
            if scalars:
                parts.insert(0, tf.stack(scalars))
            if parts:
                joined = tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]
                groups.append(joined if dtype == tf.float64 else tf.cast(joined, tf.float64))
        if not groups:
            return None
        return tf.concat(groups, axis=0) if len(groups) > 1 else groups[0]

    def _fault_words(self, floats, slots):
        """int64 [fault words]: the fault branch's values where a float value is not finite."""
        size = sum(size for _, _, size, _, _ in self._faults)
        float_slots = {s.key: s for s in slots if s.region == FLOATS}

        def guarded(fn, dtype, guard):
            # Inside the fault branch (a faulty step only): the value computed, then zeroed
            # where its own floats are finite. A mask, not a second cond per value: one op at
            # those steps instead of two branch functions to trace for every replica.
            words = _as_words(fn(), dtype)
            if not guard or floats is None:
                return words
            own = tf.concat(
                [
                    floats[float_slots[k].start : float_slots[k].start + float_slots[k].size]
                    for k in guard
                ],
                axis=0,
            )
            return tf.where(tf.math.is_finite(tf.reduce_sum(own)), tf.zeros_like(words), words)

        def branch():
            parts = [guarded(fn, dtype, guard) for _, fn, _, dtype, guard in self._faults]
            return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]

        if floats is None:
            return tf.zeros([size], tf.int64)
        return cond_value(
            tf.math.is_finite(tf.reduce_sum(floats)),
            lambda: tf.zeros([size], tf.int64),
            branch,
            as_function=True,
        )


def _shapes(tensors):
    """int64 shape vectors of `tensors`, in order: one `ShapeN` per dtype (it takes one)."""
    tensors = list(tensors)
    by_dtype = {}
    for index, tensor in enumerate(tensors):
        by_dtype.setdefault(tensor.dtype, []).append(index)
    shapes = [None] * len(tensors)
    for indices in by_dtype.values():
        group = [tensors[i] for i in indices]
        if len(group) == 1:
            found = [tf.shape(group[0], out_type=tf.int64)]
        else:
            found = tf.shape_n(group, out_type=tf.int64)
        for index, shape in zip(indices, found, strict=True):
            shapes[index] = shape
    return shapes


def _float(value):
    """`value` as float32 or float64 (narrower floats widened to float32, others to float64)."""
    if value.dtype in (tf.float32, tf.float64):
        return value
    return tf.cast(value, tf.float32 if value.dtype.is_floating else tf.float64)


def _dtype(values):
    return values[0].dtype if isinstance(values, list) else values.dtype


def _length(values):
    return len(values) if isinstance(values, list) else int(values.shape[0])


def _as_words(value, dtype):
    value = tf.reshape(tf.cast(value, dtype), [-1])
    return value if dtype == tf.int64 else tf.bitcast(value, tf.int64)


def _static_length(key, vector):
    if vector.shape.rank != 1 or vector.shape[0] is None:
        raise ValueError(f"{key}: a packed value is a vector of static length, not {vector.shape}")


class Transfer:
    """One transfer of a step: a `Packet` per local replica and the host's handlers.

    Args:
      devices: the local replicas' devices.
      scope: whether it carries a whole step scope (else one call outside a scope).

    Attributes:
      packets: one `Packet` per local replica.
      scope: see Args.
    """

    def __init__(self, devices, scope=False):
        self.packets = [Packet(device) for device in devices]
        self.scope = scope
        self._handlers = {}  # family -> [handlers], families in the order they came

    def on_host(self, family, handler):
        """Calls `handler(delivery)` on the host when the transfer is delivered (after the
        handlers registered before it)."""
        self._handlers.setdefault(family, []).append(handler)

    def handlers(self):
        """`[(family, handler)]` in the order they were registered."""
        return [(family, h) for family, handlers in self._handlers.items() for h in handlers]

    def drop(self, family):
        """Forgets everything `family` put in (its recording failed half-way)."""
        self._handlers.pop(family, None)
        for packet in self.packets:
            packet.drop(family)

    @property
    def empty(self):
        return all(packet.empty for packet in self.packets)


# `Delivery.cache` key: bool scalar tensor, every local replica's gradients and loss finite at
# the delivered step (set by the gradients family, read by the families delivered after it).
GRADIENTS_FINITE = "gradients_finite"


class Delivery:
    """The host's view of one delivered transfer (cross-replica context, on the host CPU).

    Args:
      transfer: the `Transfer`.
      slots: `{key: Slot}` of its vectors.
      matrix: int64 [R, words], every replica's vector as received (None when empty).
      step: the step scope's step (int64 scalar tensor), or None for a call outside a scope.
      start: float64 scalar, host time at the scope's start (None outside a scope).
      arrival_stamps: float64 scalars, the host time when each replica's vector arrived (None
        outside a scope).

    Attributes:
      step, start, arrival_stamps: as given.
      matrix: as given.
      cache: `{name: value}` of the delivery's step (`steps`: the step each caller recorded at).
    """

    def __init__(self, transfer, slots, matrix, step=None, start=None, arrival_stamps=None):
        self.transfer = transfer
        self.step = step
        self.start = start
        self.arrival_stamps = arrival_stamps
        self.matrix = matrix
        self.cache = {}
        self._slots = slots
        self._regions = {}

    def has(self, key):
        """Whether every replica's vector carries `key`."""
        return key in self._slots

    def _region(self, name):
        """The `[R, words]` columns of region `name` (float64 for FLOATS), once per graph (a
        value first read inside a branch belongs to that branch's graph)."""
        key = (_graph_key(), name)
        if key not in self._regions:
            slots = [s for s in self._slots.values() if s.region == name]
            offset = _region_offset(self._slots, name)
            width = sum(s.size for s in slots)
            with tf.device("/cpu:0"):
                region = self.matrix[:, offset : offset + width]
                if name == FLOATS:
                    region = tf.bitcast(region, tf.float64)
            self._regions[key] = region
        return self._regions[key]

    def value(self, key):
        """The `[R, size]` value of `key` (int64, or float64 for a float value); a fault value
        is zeros where the replica's fault branch was not taken.

        Raises:
          KeyError: if the transfer does not carry `key`.
        """
        slot = self._slots[key]
        with tf.device("/cpu:0"):
            if slot.region == FLOATS:
                value = self._region(slot.region)[:, slot.start : slot.start + slot.size]
            else:  # int64 words: one slice of the matrix (no slice of the region first)
                start = _region_offset(self._slots, slot.region) + slot.start
                value = self.matrix[:, start : start + slot.size]
            if slot.region == FAULTS and slot.dtype == tf.float64:
                value = tf.bitcast(value, tf.float64)
            return value

    def kept(self, key):
        """`[value of each replica]` of a kept value, None where a replica's packet lacks it."""
        values = [packet.kept.get(key) for packet in self.transfer.packets]
        return None if any(value is None for value in values) else values

    def meta(self, key):
        """`[object of each replica]` of a meta value."""
        return [packet.meta.get(key) for packet in self.transfer.packets]


def _graph_key():
    return None if tf.executing_eagerly() else id(tf.compat.v1.get_default_graph())


def _region_offset(slots, name):
    order = (SHAPES, INTS, FLOATS, FAULTS)
    widths = {region: 0 for region in order}
    for slot in slots.values():
        widths[slot.region] += slot.size
    return sum(widths[region] for region in order[: order.index(name)])


def common_layout(transfer):
    """The slots every packet of `transfer` shares, or None when the replicas' layouts differ.

    Returns:
      `(slots, words)`: the `Slot`s in vector order and the vector length.
    """
    layouts = [packet.layout() for packet in transfer.packets]
    first = layouts[0]
    if any(layout != first for layout in layouts[1:]):
        return None
    return first


def receive(vectors, timed):
    """Host side: the replicas' vectors as one `[R, words]` matrix and, when `timed`, the host
    time each arrived.

    Each vector goes through an identity on the host CPU, a data dependency on the received
    tensor, and the timestamp of a timed transfer waits for that identity alone, so it marks the
    arrival of that replica's vector (on an accelerator: the end of the work that produced it,
    not the launch of its kernels). The timestamps run independently of the step's other
    stateful ops (`independent`).

    Returns:
      `(matrix, stamps)`: int64 [R, words], and R float64 scalars or None.
    """
    with tf.device("/cpu:0"):
        received = [tf.identity(vector) for vector in vectors]
        stamps = None
        if timed:
            stamps = []
            for tensor in received:
                with tf.control_dependencies([tensor]):
                    stamps.append(independent(tf.timestamp()))
        return tf.stack(received), stamps


def independent(stamp):
    """`stamp` (a timestamp) kept out of the step's automatic ordering of stateful ops.

    Inside a `tf.function`, TensorFlow chains the stateful ops that touch no resource in program
    order: a replica's arrival stamp would wait for the stamps created before it, and the step's
    start stamp for the stateful ops above it. Marked independent, each runs when its own inputs
    are ready (the start stamp, having none, when the function's body starts).
    """
    graph = tf.compat.v1.get_default_graph()
    manager = getattr(graph, "experimental_acd_manager", None)
    if manager is not None and not tf.executing_eagerly():
        manager.run_independently(stamp.op)
    return stamp


def step_start():
    """A host timestamp at the start of the step function (see `independent`)."""
    with tf.device("/cpu:0"):
        return independent(tf.timestamp())
