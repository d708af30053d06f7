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

Bit-identical copies have identical stats and sketch, so the check of a step
(`check.VariablesStats`) hashes every copy first and, under a `tf.cond` on "every copy's hash
equals replica 0's", summarizes replica 0's copy only and gives its row to every replica (the
normal case: one summary and one written row per variable, `record.fingerprint_rows`);
otherwise the differing copies are summarized.

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

    The check of a step (`check.VariablesStats`) summarizes the copies of a short variable list
    this way, grouped by size (`grouped_summary`: about 20 ops per group of copies, fast at run
    time), and a long one with `fused_summary` (a few ops per device).

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
    return _matrix_summary(tf.reshape(value, [1, -1]), projection)[0]


def grouped_summary(groups, projection=None):
    """Stats and sketch of copies of one device by reductions, one set per size and dtype.

    The copies of a group are the rows of one matrix, so a group costs the ops of one
    `copy_summary` whatever its number of copies (a model's kernels and their optimizer slots
    share sizes). Each row gets the reductions `copy_summary` applies to one copy.

    Args:
      groups: `[(positions, matrix)]`: `matrix` is the `[k, n]` numeric copies of one dtype and
        static size n, `positions` their k rows in the result (together: 0..count-1).
      projection: optional cache of sketch signs per device and static size.

    Returns:
      float64 `[count, 4 + SKETCH_SIZE]` in `positions` order.
    """
    tables, order = [], []
    for positions, matrix in groups:
        tables.append(_matrix_summary(matrix, projection))
        order.extend(positions)
    table = tf.concat(tables, axis=0) if len(tables) > 1 else tables[0]
    if order == sorted(order):
        return table
    return tf.gather(table, np.argsort(order))


def _matrix_summary(matrix, projection):
    """Stats and sketch of each row of a numeric `[k, n]` matrix (k static, n static or not):
    float64 `[k, 4 + SKETCH_SIZE]`, the reductions of `copy_summary` per row."""
    count, size = int(matrix.shape[0]), matrix.shape[1]  # size: None when not static
    native = tf.cast(matrix, tf.uint8) if matrix.dtype.is_bool else matrix
    flat = tf.cast(native, tf.float64)
    length = size if size is not None else tf.shape(flat, out_type=tf.int64)[1]
    if size == 0:
        stats = tf.zeros([count, len(STAT_COLUMNS)], tf.float64)
    else:
        # min and max in the copy's own type (exact, half the bytes of float64 for float32).
        low = tf.cast(tf.reduce_min(native, axis=1), tf.float64)
        high = tf.cast(tf.reduce_max(native, axis=1), tf.float64)
        if size is None:  # an empty copy has min and max 0
            zero, empty = tf.constant(0.0, tf.float64), tf.equal(length, 0)
            low, high = tf.where(empty, zero, low), tf.where(empty, zero, high)
        total = tf.reduce_sum(flat, axis=1)
        squares = tf.reduce_sum(tf.square(flat), axis=1)
        stats = tf.stack([low, high, total, squares], axis=1)
    if size is not None and size <= SKETCH_SIZE:
        # Small variables are their own sketch: exact, no hashing.
        sketch = tf.pad(flat, [[0, 0], [0, SKETCH_SIZE - size]])
    else:
        rows = (length + SKETCH_WIDTH - 1) // SKETCH_WIDTH
        signs = _sketch_signs(projection, matrix.device, size, rows)
        padded = tf.pad(flat, [[0, 0], [0, rows * SKETCH_WIDTH - length]])
        grid = tf.reshape(padded, [count, -1, SKETCH_WIDTH])
        sketch = tf.reduce_sum(grid * signs, axis=1)
        sketch = tf.pad(sketch, [[0, 0], [0, SKETCH_SIZE - SKETCH_WIDTH]])
    return tf.concat([stats, sketch], axis=1)


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
