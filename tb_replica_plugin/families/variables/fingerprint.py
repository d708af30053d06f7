"""Variables family, in-graph fingerprints: weight drift and placement of every variable copy.

Each copy of a variable is fingerprinted on the device that holds it; only the fingerprint
(a few dozen numbers, whatever the variable's size) leaves that device. A fingerprint is:

- `hash`: a 64-bit hash of the copy's raw bits (int64), by one of two algorithms, recorded per
  copy in the placement document (`"hash"` of each variable, one name per copy):
  - `"farmhash64"` on CPU devices: `tf.fingerprint` (FarmHash64) of the copy's bytes in native
    (little-endian) order, row-major. It has a CPU kernel only, hence:
  - `"mix64"` on every other device (GPU, TPU...), with integer ops every device has, so no copy
    leaves its device: the bits are read as unsigned words u_j of 32 bits (8- and 16-bit
    types: one word per element; row-major, little-endian) and
    `hash = sum_j mix(u_j + (j + 1) * G) mod 2^64`, with `mix` the splitmix64 finalizer (a
    bijection of 64-bit integers) and G = 0x9E3779B97F4A7C15. A difference in a single word
    always changes it (exactly one term changes).
  Equal bits give equal hashes; other differences (one ulp, a -0.0 against a +0.0, a NaN
  payload) go unnoticed with a chance of about 2^-64. Hashes are only compared between copies
  hashed by the same algorithm (the reader falls back to the sketch otherwise).
- `stats`: `(min, max, sum, sum of squares)` of the copy's elements: min and max in the copy's
  own type (exact), sum and sum of squares accumulated in float64 (measured: as cheap as float32
  on CPU, and float32 sums would put rounding noise near the 1e-6 drift threshold).
- `sketch`: float64 `[K]` (K = `SKETCH_SIZE` = 64). A variable of at most K elements is copied
  into its sketch unchanged (exact). A larger one gets a structured linear sketch of
  W = `SKETCH_WIDTH` = 61 buckets (then 3 zeros): its flattened elements, cast to float64 and
  zero-padded, are laid out as rows of W, so element i = r * W + c goes to bucket c = i mod W
  with sign `s(r, c)` = -1 if bit c of `h(r) = mix((r + 1) * G XOR S)` is set, else +1
  (S = `SKETCH_SEED`): `sketch[c] = sum_r s(r, c) x[r * W + c]`. Only the ROW index is hashed
  (61 times fewer hashes than one per element) and the sum is an element-wise product and a
  column sum. W is prime so that power-of-two strides (one column of a [256, 256] kernel) spread
  over all buckets, and the signs are independent per element (not a sign per row times a
  sign per column), so even a uniform difference is estimated with 61 degrees of freedom.
  Every process, worker and device type computes the same projection (integer arithmetic
  modulo 2^64).

Because the projection is linear and the same for every copy, `sketch(a) - sketch(b)` is the
sketch of `a - b`, and `||sketch(a) - sketch(b)||` estimates `||a - b||` without moving either
copy: unbiased for the squared norm, with a relative standard deviation of the squared norm of
about sqrt(2 / W) (about 1 / sqrt(2W) for the norm: 9 % with W = 61) as long as no bucket holds
most of the difference. What it cannot spread: a difference confined to elements whose flat
indices are congruent modulo 61 (e.g. one column of a variable with 61·m columns) falls into
one bucket, and its norm is then estimated from one signed sum (still unbiased, but a relative
standard deviation of up to 141 % for the squared norm). See docs/data-format.md.

Bit-identical copies have identical stats and sketch, so `VariablesStats` hashes every copy
first and, under a `tf.cond` on "every copy's hash equals replica 0's", summarizes replica 0's
copy only and gives its row to every replica (the normal case: one summary and one written row
per variable, `record.fingerprint_rows`); otherwise the differing copies are summarized.

`exact=True` adds the true element-wise difference: every copy is sent to replica 0's device and
compared there (traffic: the whole variable per replica), giving the true max-abs and L2 norm of
`copy_r - copy_0`.

Everything here runs in cross-replica context (or eagerly) on the per-device component variables.
"""

import functools
import json

import numpy as np
import tensorflow as tf

SKETCH_SIZE = 64  # written width; also the largest variable copied exactly into its sketch
SKETCH_WIDTH = 61  # buckets of the structured sketch (a prime); buckets 61..63 stay 0
STAT_COLUMNS = ("min", "max", "sum", "sum_sq")
# Version of the fingerprint (hash, stats, sketch): bump when any of it changes, so fingerprints
# of different versions are never compared across workers (docs/data-format.md lists them; 3: the
# stats and sketches of many copies computed at once, by segment sums in element order).
FINGERPRINT_VERSION = 3
HASH_FARMHASH = "farmhash64"
HASH_MIX = "mix64"
# splitmix64: the golden-ratio increment and the two multipliers of its finalizer.
GOLDEN = 0x9E3779B97F4A7C15
MIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
MIX_SHIFTS = (30, 27, 31)
SKETCH_SEED = 0x5EED_D21F_7A11_0001  # XORed into the row-index hash of the sketch
# A device holding at least this many copies has them summarized at once (`fused_summary`: a
# few segment ops, whatever the number of variables; traced ops matter more than run time then).
# Fewer copies are summarized one by one (`copy_summary`: reductions, faster at run time).
FUSED_MIN_COPIES = 64


def _canonical(device):
    return tf.DeviceSpec.from_string(device).to_string() if device else ""


def unwrap(variable):
    """The TensorFlow variable and the display name of a Keras or TensorFlow variable.

    Args:
      variable: a `keras.Variable` (its `.value` is the TF variable, e.g. a `MirroredVariable`),
        a `tf.Variable` or a distributed variable.

    Returns:
      `(tf_variable, name)`; the name is the Keras path ("dense/kernel") or the TF name without
      ":0".
    """
    if not isinstance(variable, tf.Variable) and hasattr(variable, "path"):
        return variable.value, str(variable.path)
    name = getattr(variable, "name", "variable") or "variable"
    return variable, name[:-2] if name.endswith(":0") else name


def hash_algorithm(device, dtype):
    """The hash algorithm of a copy on `device`: "farmhash64" (tf.fingerprint) on a CPU device
    or for strings, "mix64" on any other (or unknown) device."""
    if tf.as_dtype(dtype) == tf.string:
        return HASH_FARMHASH
    try:
        device_type = tf.DeviceSpec.from_string(device or "").device_type
    except ValueError:
        device_type = None
    return HASH_FARMHASH if (device_type or "").upper() == "CPU" else HASH_MIX


def _copies(tf_variable):
    distributed = isinstance(tf_variable, tf.distribute.DistributedValues)
    return list(tf_variable.values) if distributed else [tf_variable]


def _sync_name(tf_variable):
    sync = getattr(tf_variable, "synchronization", None)
    if not isinstance(tf_variable, tf.distribute.DistributedValues):
        return "none"
    return {
        tf.VariableSynchronization.ON_WRITE: "on_write",
        tf.VariableSynchronization.ON_READ: "on_read",
    }.get(sync, "on_write")


class VariableEntry:
    """One variable: its copies, mapped to the local replica devices.

    Attributes:
      name: display name (unique within one call; repeated names get "#2", "#3").
      copies: component variables, one per copy.
      devices: canonical device of each copy.
      columns: replica position of each copy (-1 when the copy is on no replica device).
      mirrored: True when every replica device holds exactly one copy.
      sync: "on_write" (mirrored), "on_read" (each replica keeps its own value on purpose) or
        "none" (a plain variable, one copy).
    """

    def __init__(self, variable, replica_devices):
        tf_variable, self.name = unwrap(variable)
        self.copies = _copies(tf_variable)
        self.devices = [_canonical(c.device) for c in self.copies]
        position = {d: r for r, d in enumerate(replica_devices)}
        self.columns = [position.get(d, -1) for d in self.devices]
        covered = sorted(c for c in self.columns if c >= 0)
        self.mirrored = covered == list(range(len(replica_devices)))
        self.sync = _sync_name(tf_variable)
        self.trainable = bool(getattr(variable, "trainable", tf_variable.trainable))
        self.dtype = tf.as_dtype(tf_variable.dtype)
        self.shape = [None if d is None else int(d) for d in tf_variable.shape.as_list()]
        self.hashes = [hash_algorithm(d, self.dtype) for d in self.devices]

    def describe(self):
        return {
            "name": self.name,
            "shape": self.shape,
            "dtype": self.dtype.name,
            "trainable": self.trainable,
            "sync": self.sync,
            "devices": self.devices,
            "columns": self.columns,
            "mirrored": self.mirrored,
            "hash": self.hashes,
        }


def describe_variables(variables, replica_devices):
    """`VariableEntry` of each variable, names made unique."""
    entries = []
    seen = {}
    for variable in variables:
        entry = VariableEntry(variable, replica_devices)
        count = seen.get(entry.name, 0) + 1
        seen[entry.name] = count
        if count > 1:
            entry.name = f"{entry.name}#{count}"
        entries.append(entry)
    return entries


def placement_json(entries, static_fields):
    """The placement document (a Python string, constant for a given variable list)."""
    document = dict(static_fields)
    document["variables"] = [e.describe() for e in entries]
    document["fingerprint"] = {
        "version": FINGERPRINT_VERSION,
        "hash": {
            HASH_FARMHASH: "tf.fingerprint of the copy's bytes (CPU devices)",
            HASH_MIX: "sum of splitmix64(u_j + (j + 1) * golden) over the 32-bit words u_j",
        },
        "golden": GOLDEN,
        "mix_multipliers": list(MIX_MULTIPLIERS),
        "mix_shifts": list(MIX_SHIFTS),
        "stats": list(STAT_COLUMNS),
        "sketch": "row_signs",
        "sketch_size": SKETCH_SIZE,
        "sketch_width": SKETCH_WIDTH,
        "sketch_seed": SKETCH_SEED,
    }
    return json.dumps(document, sort_keys=True)


def _u64(value):
    return tf.constant(value, tf.uint64)


def mix64(z):
    """The splitmix64 finalizer of a uint64 tensor (a bijection; wrapping arithmetic)."""
    (m1, m2), (s1, s2, s3) = MIX_MULTIPLIERS, MIX_SHIFTS
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(s1))) * _u64(m1)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(s2))) * _u64(m2)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(s3)))


def _index_terms(count):
    """(j + 1) * GOLDEN mod 2^64 for j < count, as uint64."""
    index = tf.cast(tf.range(tf.cast(count, tf.int64), dtype=tf.int64), tf.uint64)
    return (index + _u64(1)) * _u64(GOLDEN)


def row_signs(rows, dtype=tf.float64):
    """Signs `s(r, c)` of the structured sketch for `rows` rows of SKETCH_WIDTH elements.

    Args:
      rows: int64 scalar tensor or int.
      dtype: the float type of the result.

    Returns:
      `[rows, SKETCH_WIDTH]` tensor of +1/-1: -1 where bit c of `mix((r + 1) * G XOR S)` is set.
    """
    hashed = mix64(tf.bitwise.bitwise_xor(_index_terms(rows), _u64(SKETCH_SEED)))
    shifts = tf.constant(np.arange(SKETCH_WIDTH, dtype=np.uint64))
    bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(hashed[:, None], shifts[None, :]), _u64(1))
    return 1.0 - 2.0 * tf.cast(bits, dtype)


def _words32(value, dtype):
    """The copy's raw bits as uint64 words of 32 bits (8/16-bit types: one per element),
    row-major, little-endian."""
    if dtype.is_bool:
        return tf.reshape(tf.cast(value, tf.uint64), [-1])
    if dtype.size == 1:
        return tf.reshape(tf.cast(tf.bitcast(value, tf.uint8), tf.uint64), [-1])
    if dtype.size == 2:
        return tf.reshape(tf.cast(tf.bitcast(value, tf.uint16), tf.uint64), [-1])
    # [..., size / 4] words for 8- and 16-byte types.
    return tf.reshape(tf.cast(tf.bitcast(value, tf.uint32), tf.uint64), [-1])


def farmhash(value, dtype):
    """`tf.fingerprint` (FarmHash64) of a tensor's bytes, native order (int64 scalar; CPU
    kernel only). Strings: of the flattened strings."""
    if dtype == tf.string:
        data = tf.reshape(value, [1, -1])
    elif dtype.is_bool:
        data = tf.reshape(tf.cast(value, tf.uint8), [1, -1])
    else:
        data = tf.reshape(tf.bitcast(value, tf.uint8), [1, -1])
    return tf.reshape(tf.bitcast(tf.fingerprint(data), tf.int64), [])


def copy_hash(value, dtype, algorithm, cache=None):
    """The hash of one copy by `algorithm` ("farmhash64" or "mix64"), int64 scalar."""
    if algorithm == HASH_FARMHASH:
        return farmhash(value, dtype)
    return bitwise_hash(value, dtype, cache)


def bitwise_hash(value, dtype, cache=None):
    """The "mix64" hash of a tensor's raw bits, computed where `value` lives (int64 scalar).

    Args:
      value: the tensor.
      dtype: its `tf.DType`. Strings fall back to `tf.fingerprint` (a CPU kernel).
      cache: optional dict shared by the copies hashed in one graph (index terms per device and
        word count).

    Returns:
      An int64 scalar tensor: the sum, modulo 2^64, of `mix64(u_j + (j + 1) * GOLDEN)`.
    """
    if dtype == tf.string:
        return farmhash(value, dtype)
    words = _words32(value, dtype)
    key = ("hash", value.device, words.shape[0])
    if cache is not None and key in cache:
        terms = cache[key]
    else:
        terms = _index_terms(tf.size(words, out_type=tf.int64))
        if cache is not None:
            cache[key] = terms
    mixed = tf.bitcast(mix64(words + terms), tf.int64)
    # Wrapping int64 addition is associative: the sum is the same in any reduction order.
    return tf.reduce_sum(mixed)


def is_numeric(dtype):
    """Whether copies of `dtype` get stats and a sketch (floats, integers, booleans)."""
    return dtype.is_floating or dtype.is_integer or dtype.is_bool


def _mix64_numpy(z):
    """`mix64` on a numpy uint64 array (wrapping arithmetic)."""
    (m1, m2), (s1, s2, s3) = MIX_MULTIPLIERS, MIX_SHIFTS
    z = z.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(s1))) * np.uint64(m1)
        z = (z ^ (z >> np.uint64(s2))) * np.uint64(m2)
    return z ^ (z >> np.uint64(s3))


def _row_negative(rows):
    """bool [rows, SKETCH_WIDTH]: where the sketch sign `s(r, c)` is -1 (see `row_signs`)."""
    with np.errstate(over="ignore"):
        terms = (np.arange(rows, dtype=np.uint64) + np.uint64(1)) * np.uint64(GOLDEN)
    hashed = _mix64_numpy(terms ^ np.uint64(SKETCH_SEED))
    shifts = np.arange(SKETCH_WIDTH, dtype=np.uint64)
    return ((hashed[:, None] >> shifts[None, :]) & np.uint64(1)).astype(bool)


class SummaryLayout:
    """Where each element of the copies on one device goes in the fused summary (static tables).

    The copies' flattened elements are concatenated; element i of variable v (of n elements)
    belongs to segment v and adds to sketch slot `v * SKETCH_SIZE + c` with c = i when n <=
    SKETCH_SIZE (copied exactly) else c = i mod SKETCH_WIDTH, negated where `s(i // W, c)` is -1.
    The tables are built once per variable list on the host (numpy) and captured by the traced
    check as tensors on the device (5 bytes per element: an int32 slot and a bool sign).

    Args:
      sizes: the static element count of each copy, in concatenation order.
      device: the device holding the copies (the tables are placed there).
    """

    def __init__(self, sizes, device):
        segment, slot, negative, empty = _layout_tables(tuple(int(n) for n in sizes))
        self.num = len(sizes)
        self.any_empty = bool(empty.any())
        self.starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()
        with tf.init_scope(), tf.device(device):
            self.segment = tf.constant(segment, tf.int32)
            self.slot = tf.constant(slot, tf.int32)
            self.negative = tf.constant(negative, tf.bool)
            self.empty = tf.constant(empty, tf.bool)


@functools.lru_cache(maxsize=8)
def _layout_tables(sizes):
    """numpy `(segment, slot, negative, empty)` of `SummaryLayout` (shared by the devices).

    Built variable by variable from slices of one table of row signs (the elements of a variable
    of n > SKETCH_SIZE elements are its rows of SKETCH_WIDTH, row-major, cut at n), so a model of
    millions of elements takes a few numpy copies, not per-element fancy indexing.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    segment = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    large = sizes[sizes > SKETCH_SIZE]
    rows = int(-(-large.max() // SKETCH_WIDTH)) if large.size else 0
    negative_rows = _row_negative(rows).reshape(-1)  # row r's signs at [r * W, (r + 1) * W)
    columns = np.tile(np.arange(SKETCH_WIDTH, dtype=np.int32), rows)
    slot_parts, negative_parts = [], []
    for index, size in enumerate(sizes.tolist()):
        base = index * SKETCH_SIZE
        if size <= SKETCH_SIZE:  # copied exactly: slot c = i, no sign
            slot_parts.append(np.arange(base, base + size, dtype=np.int32))
            negative_parts.append(np.zeros(size, dtype=bool))
        else:
            slot_parts.append(columns[:size] + np.int32(base))
            negative_parts.append(negative_rows[:size])
    slot = np.concatenate(slot_parts or [np.zeros(0, dtype=np.int32)])
    negative = np.concatenate(negative_parts or [np.zeros(0, dtype=bool)])
    return segment, slot, negative, sizes == 0


def fused_summary(flat, layout):
    """Stats and sketch of every copy in `flat` at once; call under `tf.device` of the copies.

    Args:
      flat: float64 [N]: the copies' elements, concatenated in `layout` order.
      layout: the `SummaryLayout` of those copies.

    Returns:
      float64 `[V, 4 + SKETCH_SIZE]`: per copy min, max, sum, sum of squares, then the sketch.
    """
    num = layout.num
    if layout.any_empty:
        zero = tf.zeros([num], tf.float64)
        low = tf.where(layout.empty, zero, tf.math.unsorted_segment_min(flat, layout.segment, num))
        high = tf.where(layout.empty, zero, tf.math.unsorted_segment_max(flat, layout.segment, num))
        total = tf.math.unsorted_segment_sum(flat, layout.segment, num)
        squares = tf.math.unsorted_segment_sum(tf.square(flat), layout.segment, num)
    else:  # sorted segments (the ids are contiguous): about 3x faster on CPU
        low = tf.math.segment_min(flat, layout.segment)
        high = tf.math.segment_max(flat, layout.segment)
        total = tf.math.segment_sum(flat, layout.segment)
        squares = tf.math.segment_sum(tf.square(flat), layout.segment)
    signed = tf.where(layout.negative, -flat, flat)
    sketch = tf.math.unsorted_segment_sum(signed, layout.slot, num * SKETCH_SIZE)
    stats = tf.stack([low, high, total, squares], axis=1)
    return tf.concat([stats, tf.reshape(sketch, [num, SKETCH_SIZE])], axis=1)


def partial_fused_summary(parts, runs, layout, need):
    """`fused_summary` of only the copies where `need` holds (other rows are meaningless).

    Used for a replica whose copies are not all bit-identical to replica 0's: the copies whose
    hash equals replica 0's reuse its rows, so only the drifted ones (e.g. Keras 3's per-replica
    BatchNormalization statistics) are summarized here, at a cost proportional to their elements.

    Args:
      parts: the copies' elements, one 1-D tensor per run of one dtype (`_joined_by_dtype`).
      runs: `(first, end)` copy indices of each part (`_dtype_runs`).
      layout: the `SummaryLayout` of the copies.
      need: bool [V]: the copies to summarize.

    Returns:
      float64 `[V, 4 + SKETCH_SIZE]`, valid in the rows where `need` holds.
    """
    num = layout.num
    values, positions = [], []
    for part, (first, end) in zip(parts, runs, strict=True):
        start, stop = layout.starts[first], layout.starts[end]
        # Which elements of this part belong to a needed copy, as positions in the part.
        local = tf.where(tf.gather(need, layout.segment[start:stop]))[:, 0]
        picked = tf.gather(part, local)
        values.append(_to_float64(picked))
        positions.append(local + start)
    flat = tf.concat(values, axis=0) if len(values) > 1 else values[0]
    position = tf.concat(positions, axis=0) if len(positions) > 1 else positions[0]
    segment = tf.gather(layout.segment, position)
    zero = tf.zeros([num], tf.float64)
    low = tf.where(layout.empty, zero, tf.math.unsorted_segment_min(flat, segment, num))
    high = tf.where(layout.empty, zero, tf.math.unsorted_segment_max(flat, segment, num))
    total = tf.math.unsorted_segment_sum(flat, segment, num)
    squares = tf.math.unsorted_segment_sum(tf.square(flat), segment, num)
    signed = tf.where(tf.gather(layout.negative, position), -flat, flat)
    sketch = tf.math.unsorted_segment_sum(
        signed, tf.gather(layout.slot, position), num * SKETCH_SIZE
    )
    stats = tf.stack([low, high, total, squares], axis=1)
    return tf.concat([stats, tf.reshape(sketch, [num, SKETCH_SIZE])], axis=1)


def _static_size(value):
    size = value.shape.num_elements()
    return None if size is None else int(size)


def _dtype_runs(dtypes):
    """`(first, end)` index ranges of the runs of one dtype in `dtypes`."""
    runs = []
    for index, dtype in enumerate(dtypes):
        if runs and dtypes[runs[-1][0]] == dtype:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs


def _joined_by_dtype(flats):
    """The elements of `flats` (1 x n tensors) as 1-D tensors, one per run of one dtype."""
    return [
        tf.reshape(tf.concat(flats[a:b], axis=1) if b - a > 1 else flats[a], [-1])
        for a, b in _dtype_runs([flat.dtype for flat in flats])
    ]


def _to_float64(values):
    return tf.cast(tf.cast(values, tf.uint8) if values.dtype.is_bool else values, tf.float64)


def _as_float64(parts):
    """One float64 vector of `parts` (from `_joined_by_dtype`), in order."""
    cast = [_to_float64(p) for p in parts]
    if not cast:
        return tf.zeros([0], tf.float64)
    return tf.concat(cast, axis=0) if len(cast) > 1 else cast[0]


def _sketch_signs(projection, device, static_size, rows):
    """The row signs for `rows` rows on `device`, cached in `projection` for static sizes."""
    key = ("signs", device, static_size)  # static sizes only: dynamic ones vary
    if projection is not None and static_size is not None and key in projection:
        return projection[key]
    signs = row_signs(rows)
    if projection is not None and static_size is not None:
        projection[key] = signs
    return signs


def copy_summary(value, dtype, projection=None):
    """Stats and sketch of one copy (no hash) by reductions; call under `tf.device(copy.device)`.

    `VariablesStats` summarizes the copies of a short variable list this way (about 20 ops per
    copy, fast at run time) and a long one with `fused_summary` (a few ops per device).

    Args:
      value: the copy's value (a tensor).
      dtype: its `tf.DType`.
      projection: optional cache of sketch signs per device and static size.

    Returns:
      float64 `[4 + SKETCH_SIZE]`: min, max, sum, sum of squares, then the sketch (all NaN for
      non-numeric types).
    """
    if not is_numeric(dtype):
        return tf.fill([len(STAT_COLUMNS) + SKETCH_SIZE], tf.constant(np.nan, tf.float64))
    native = tf.reshape(value, [-1])
    if dtype.is_bool:
        native = tf.cast(native, tf.uint8)
    flat = tf.cast(native, tf.float64)
    static_size = flat.shape[0]
    size = tf.size(flat, out_type=tf.int64)
    zero = tf.constant(0.0, tf.float64)
    # min and max in the copy's own type (exact, half the bytes of float64 for float32).
    low = tf.cast(tf.reduce_min(native), tf.float64)
    high = tf.cast(tf.reduce_max(native), tf.float64)
    if static_size is None or static_size == 0:
        empty = tf.equal(size, 0)
        low, high = tf.where(empty, zero, low), tf.where(empty, zero, high)
    stats = tf.stack([low, high, tf.reduce_sum(flat), tf.reduce_sum(tf.square(flat))])
    if static_size is not None and static_size <= SKETCH_SIZE:
        # Small variables are their own sketch: exact, no hashing.
        sketch = tf.pad(flat, [[0, SKETCH_SIZE - static_size]])
    else:
        rows = (size + SKETCH_WIDTH - 1) // SKETCH_WIDTH
        signs = _sketch_signs(projection, value.device, static_size, rows)
        grid = tf.reshape(tf.pad(flat, [[0, rows * SKETCH_WIDTH - size]]), [-1, SKETCH_WIDTH])
        sketch = tf.reduce_sum(grid * signs, axis=0)
        sketch = tf.pad(sketch, [[0, SKETCH_SIZE - SKETCH_WIDTH]])
    return tf.concat([stats, sketch], axis=0)


def copy_fingerprint(value, dtype, projection=None, algorithm=HASH_MIX):
    """`(copy_hash(...), copy_summary(...))` of one copy (int64 scalar, float64 [4 + K]), e.g. as
    a reference for tests; call under `tf.device(copy.device)`. `algorithm`: the copy device's
    `hash_algorithm`; `projection`: optional cache shared by the copies of one graph."""
    return copy_hash(value, dtype, algorithm, projection), copy_summary(value, dtype, projection)


def exact_difference(value, reference, dtype):
    """True `(max |value - reference|, ||value - reference||_2)` in float64 (on the caller's
    device, normally replica 0's)."""
    if not is_numeric(dtype):
        return tf.constant([np.nan, np.nan], tf.float64)
    diff = tf.reshape(tf.cast(value, tf.float64) - tf.cast(reference, tf.float64), [-1])
    empty = tf.equal(tf.size(diff), 0)
    max_abs = tf.where(empty, tf.constant(0.0, tf.float64), tf.reduce_max(tf.abs(diff)))
    return tf.stack([max_abs, tf.sqrt(tf.reduce_sum(tf.square(diff)))])


def _read(copy):
    """The value of a component variable: one `ReadVariableOp` (no Python-side wrappers)."""
    handle = getattr(copy, "handle", None)
    if handle is None:
        return tf.convert_to_tensor(copy)
    return tf.raw_ops.ReadVariableOp(resource=handle, dtype=copy.dtype)


class _Column:
    """The copies on one replica device: their hashes, and what the fused summary needs."""

    def __init__(self):
        self.hashes = {}  # variable index -> int64 scalar
        self.farm_rows = []  # (variable index, [1, 8] uint8 fingerprint)
        self.fused = []  # (variable index, [1, n] flat copy) in summary order
        self.single = {}  # variable index -> summary of a copy outside the fused summary
        self.device = None
        self.joined = None  # the fused copies' elements (`_joined_by_dtype`), once joined

    def hash_vector(self, num):
        """int64 [num]: each variable's copy's hash (0 where the device holds none), assembled
        on the device, so one tensor per device leaves it (not one scalar per copy)."""
        others = sorted(self.hashes)  # copies not hashed by `tf.fingerprint` rows
        order = [index for index, _ in self.farm_rows] + others
        if not order:
            return tf.zeros([num], tf.int64)
        with tf.device(self.device):
            parts = [tf.stack([self.hashes[i] for i in others])] if others else []
            if self.farm_rows:
                rows = tf.concat([row for _, row in self.farm_rows], axis=0)
                parts.insert(0, tf.reshape(tf.bitcast(rows, tf.int64), [-1]))
            if order == list(range(num)):
                return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]
            where = {index: i for i, index in enumerate(order)}
            table = tf.concat([*parts, tf.zeros([1], tf.int64)], axis=0)
            return tf.gather(table, [where.get(i, len(order)) for i in range(num)])

    def join(self):
        """Joins the fused copies' elements by dtype now (a branch then captures a few tensors)."""
        with tf.device(self.device):
            self.joined = _joined_by_dtype([flat for _, flat in self.fused])


class VariablesStats:
    """The variables family for one logged step, in cross-replica context.

    Per replica device, every copy is hashed (`copy_hash`: one `tf.fingerprint` per copy on a
    CPU) and all the copies' stats and sketches are computed at once (`fused_summary`: a few
    segment sums over the concatenated elements), so the traced check has a handful of ops per
    copy whatever the model. Bit-identical copies have identical summaries: under one `tf.cond`
    on "every copy's hash equals replica 0's" only replica 0's copies are summarized and their
    rows are written for every replica; otherwise every replica's copies are summarized.

    Args:
      entries: `VariableEntry` list (the V axis).
      num_replicas: R, the number of local replica devices (the R axis).
      exact: also compute the exact element-wise difference from replica 0.
      layouts: optional dict caching the `SummaryLayout` of each device and size list.
      fused_min_copies: a device holding at least this many copies has them summarized at once
        (`fused_summary`), fewer one by one (`copy_summary`). The default suits a check that
        runs in the training step; a check traced for one host-side call (epoch ends) passes 1,
        as its cost is tracing, not running.
      part: `part(index, value)`: the slice of variable `index`'s copy to check (`rotation.py`).

    Attributes:
      hash: int64 [V, R] (0 where replica r's device holds no copy).
      fingerprint: float64 [V, R, 4 + K] (NaN where replica r's device holds no copy).
      exact: float64 [V, R, 2] `(max_abs, l2)` of copy r minus copy 0, or None.
      present: bool numpy [V, R]: replica r's device holds a copy.
      shareable: bool numpy [V]: a copy hashing like replica 0's has replica 0's row exactly.
    """

    def __init__(
        self,
        entries,
        num_replicas,
        exact=False,
        layouts=None,
        fused_min_copies=FUSED_MIN_COPIES,
        part=None,
    ):
        width = len(STAT_COLUMNS) + SKETCH_SIZE
        layouts = {} if layouts is None else layouts
        columns = [_Column() for _ in range(num_replicas)]
        values = []  # per variable {column: value}
        exacts = []
        projection = {}
        # One constant of each for every copy's ops (fewer nodes to trace and optimize).
        row_shape = tf.constant([1, -1], tf.int32)
        farmhash_method = tf.constant("farmhash64")
        for index, entry in enumerate(entries):
            present = {}
            for copy, column, algorithm in zip(
                entry.copies, entry.columns, entry.hashes, strict=True
            ):
                if column < 0 or column in present:
                    continue
                target = columns[column]
                with tf.device(copy.device):
                    target.device = target.device or copy.device
                    value = _read(copy) if part is None else part(index, _read(copy))
                    present[column] = value
                    numeric = is_numeric(entry.dtype) and _static_size(value) is not None
                    flat = tf.reshape(value, row_shape) if numeric else None
                    if algorithm == HASH_FARMHASH and numeric:
                        # tf.fingerprint hashes the raw bytes of each slice: the whole copy.
                        target.farm_rows.append(
                            (index, tf.raw_ops.Fingerprint(data=flat, method=farmhash_method))
                        )
                    else:
                        target.hashes[index] = copy_hash(value, entry.dtype, algorithm, projection)
                    if numeric:
                        target.fused.append((index, flat))
                    else:
                        target.single[index] = copy_summary(value, entry.dtype)
            values.append(present)
            if exact:
                row = [tf.constant([np.nan, np.nan], tf.float64)] * num_replicas
                if 0 in present:
                    with tf.device(entries[index].copies[entries[index].columns.index(0)].device):
                        for column, value in present.items():
                            # Copies the whole of copy r to replica 0's device.
                            row[column] = exact_difference(value, present[0], entry.dtype)
                exacts.append(tf.stack(row))
        num = len(entries)
        hashes = [column.hash_vector(num) for column in columns]
        self.hash = tf.stack(hashes, axis=1) if num else tf.zeros([0, num_replicas], tf.int64)

        missing = tf.fill([1, width], tf.constant(np.nan, tf.float64))

        def at_once(column):  # the column's copies summarized at once (`fused_summary`)
            return bool(column.fused) and len(column.fused) >= fused_min_copies

        def summarize(column, reuse=None):
            """[rows of the column's fused copies + singles, then a NaN row], and row of each
            variable index. `reuse`: `(need, rows)` for a fused column, bool [copies] and their
            rows of replica 0: only the copies where `need` holds are summarized."""
            rows = []
            where = {index: i for i, (index, _) in enumerate(column.fused)}
            if at_once(column):
                sizes = tuple(_static_size(flat) for _, flat in column.fused)
                dtypes = tuple(flat.dtype for _, flat in column.fused)
                key = (column.device, sizes, dtypes)
                if key not in layouts:
                    layouts[key] = SummaryLayout(sizes, column.device)
                with tf.device(column.device):
                    if column.joined is None:
                        column.join()
                    if reuse is None:
                        rows.append(fused_summary(_as_float64(column.joined), layouts[key]))
                    else:
                        need, shared_rows = reuse
                        own = partial_fused_summary(
                            column.joined, _dtype_runs(dtypes), layouts[key], need
                        )
                        rows.append(tf.where(need[:, None], own, shared_rows))
            elif column.fused:
                with tf.device(column.device):
                    rows.append(
                        tf.stack([copy_summary(f, f.dtype, projection) for _, f in column.fused])
                    )
            for index, summary in column.single.items():
                where[index] = len(where)
                rows.append(summary[None, :])
            rows.append(missing)
            return tf.concat(rows, axis=0), where

        def gather(table, where):
            """One row per variable: its row of `table`, or the NaN row (the last)."""
            return tf.gather(table, [where.get(i, len(where)) for i in range(num)])

        shareable = [
            i
            for i, entry in enumerate(entries)
            if 0 in values[i]
            and len(values[i]) > 1
            and is_numeric(entry.dtype)
            and len(set(entry.hashes)) == 1
        ]
        present = [[r in copies for r in range(num_replicas)] for copies in values]
        self.present = np.array(present, dtype=bool).reshape(num, num_replicas)
        self.shareable = np.isin(np.arange(num), shareable)
        if not num:
            self.fingerprint = tf.zeros([0, num_replicas, width], tf.float64)
        else:
            table0, where0 = summarize(columns[0])
            matrices = [gather(table0, where0)]
            if num_replicas > 1:
                same = tf.constant(True)
                if shareable:
                    # Every present copy of a shareable variable hashes like replica 0's.
                    mask = self.present & self.shareable[:, None]
                    equal = tf.equal(self.hash, self.hash[:, :1])
                    same = tf.reduce_all(tf.logical_or(equal, tf.constant(~mask)))
                shared = set(shareable)

                def agree(r):
                    column = columns[r]
                    own = _Column()
                    own.device = column.device
                    own.fused = [(i, f) for i, f in column.fused if i not in shared]
                    own.single = {i: s for i, s in column.single.items() if i not in shared}
                    table, where = summarize(own)
                    full = tf.concat([table0, table], axis=0)
                    offset = table0.shape[0]
                    positions = []
                    for i in range(num):
                        if i in shared and r in values[i]:
                            positions.append(where0[i])
                        elif i in where:
                            positions.append(offset + where[i])
                        else:
                            positions.append(offset + len(where))  # NaN row
                    return tf.gather(full, positions)

                def differ(r):
                    column = columns[r]
                    reuse = None
                    if at_once(column):
                        # A copy bit-identical to replica 0's takes its rows (the same values
                        # the agreeing branch writes); the others are summarized.
                        indices = [i for i, _ in column.fused]
                        reusable = [i in shared for i in indices]  # each in where0
                        equal = tf.gather(tf.equal(self.hash[:, r], self.hash[:, 0]), indices)
                        need = tf.logical_not(tf.logical_and(equal, tf.constant(reusable)))
                        positions0 = [where0[i] if i in shared else 0 for i in indices]
                        rows0 = tf.gather(table0, positions0)
                        reuse = (need, rows0)
                    table, where = summarize(column, reuse)
                    return gather(table, where)

                for column in columns[1:]:
                    if at_once(column):
                        column.join()  # outside the cond: one capture per dtype, not per copy

                others = tf.cond(
                    same,
                    lambda: [agree(r) for r in range(1, num_replicas)],
                    lambda: [differ(r) for r in range(1, num_replicas)],
                )
                matrices.extend(others)
            self.fingerprint = tf.stack(matrices, axis=1)
        self.exact = None
        if exact:
            self.exact = tf.stack(exacts) if exacts else tf.zeros([0, num_replicas, 2], tf.float64)
