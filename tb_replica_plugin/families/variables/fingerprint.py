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
standard deviation of up to 141 % for the squared norm). See README "Weight drift".

Bit-identical copies have identical stats and sketch, so `VariablesStats` hashes every copy
first and, under a `tf.cond` on "every copy's hash equals replica 0's", summarizes replica 0's
copy only and writes its summary for every replica (the normal case: one summary per variable
instead of one per copy); otherwise every copy is summarized on its own device.

`exact=True` adds the true element-wise difference: every copy is sent to replica 0's device and
compared there (traffic: the whole variable per replica), giving the true max-abs and L2 norm of
`copy_r - copy_0`.

Everything here runs in cross-replica context (or eagerly) on the per-device component variables.
"""

import json

import numpy as np
import tensorflow as tf

SKETCH_SIZE = 64  # written width; also the largest variable copied exactly into its sketch
SKETCH_WIDTH = 61  # buckets of the structured sketch (a prime); buckets 61..63 stay 0
STAT_COLUMNS = ("min", "max", "sum", "sum_sq")
# Version of the fingerprint (hash, stats, sketch): bump when any of it changes, so fingerprints
# of different versions are never compared (reader.merge_variables checks it across workers).
# 1: mix64 hash everywhere, 64-bucket CountSketch hashing every element index.
# 2: farmhash64 on CPU / mix64 elsewhere (per copy in the placement document), 61-bucket
#    row-signed sketch, min/max in the copy's type.
FINGERPRINT_VERSION = 2
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
    if isinstance(tf_variable, tf.distribute.DistributedValues):
        return list(tf_variable.values)
    return [tf_variable]


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


def _is_numeric(dtype):
    return dtype.is_floating or dtype.is_integer or dtype.is_bool


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
    """Stats and sketch of one copy (no hash); call under `tf.device(copy.device)`.

    Args:
      value: the copy's value (a tensor).
      dtype: its `tf.DType`.
      projection: optional cache of sketch signs per device and static size (see
        `copy_fingerprint`).

    Returns:
      float64 `[4 + SKETCH_SIZE]`: min, max, sum, sum of squares, then the sketch (all NaN for
      non-numeric types).
    """
    if not _is_numeric(dtype):
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
    """Hash, stats and sketch of one copy; call under `tf.device(copy.device)`.

    Args:
      value: the copy's value (a tensor).
      dtype: its `tf.DType`.
      projection: optional cache shared by the copies fingerprinted on one device in one graph
        (sketch signs per row count, hash index terms per word count).
      algorithm: the hash algorithm, `hash_algorithm(device, dtype)` of the copy's device.

    Returns:
      `(hash int64 scalar, stats_and_sketch float64 [4 + SKETCH_SIZE])`.
    """
    return copy_hash(value, dtype, algorithm, projection), copy_summary(value, dtype, projection)


def exact_difference(value, reference, dtype):
    """True `(max |value - reference|, ||value - reference||_2)` in float64 (on the caller's
    device, normally replica 0's)."""
    if not _is_numeric(dtype):
        return tf.constant([np.nan, np.nan], tf.float64)
    diff = tf.reshape(tf.cast(value, tf.float64) - tf.cast(reference, tf.float64), [-1])
    empty = tf.equal(tf.size(diff), 0)
    max_abs = tf.where(empty, tf.constant(0.0, tf.float64), tf.reduce_max(tf.abs(diff)))
    return tf.stack([max_abs, tf.sqrt(tf.reduce_sum(tf.square(diff)))])


def _read(copy):
    return tf.convert_to_tensor(copy.read_value() if hasattr(copy, "read_value") else copy)


class VariablesStats:
    """The variables family for one logged step, in cross-replica context.

    Args:
      entries: `VariableEntry` list (the V axis).
      num_replicas: R, the number of local replica devices (the R axis).
      exact: also compute the exact element-wise difference from replica 0.

    Attributes:
      hash: int64 [V, R] (0 where replica r's device holds no copy).
      fingerprint: float64 [V, R, 4 + K] (NaN where replica r's device holds no copy).
      exact: float64 [V, R, 2] `(max_abs, l2)` of copy r minus copy 0, or None.
    """

    def __init__(self, entries, num_replicas, exact=False):
        width = len(STAT_COLUMNS) + SKETCH_SIZE
        missing_fp = tf.fill([width], tf.constant(np.nan, tf.float64))
        missing_hash = tf.constant(0, tf.int64)
        missing_exact = tf.constant([np.nan, np.nan], tf.float64)
        hashes, items, exacts = [], [], []
        projection = {}
        for entry in entries:
            row_hash = [missing_hash] * num_replicas
            values = {}
            for copy, column, algorithm in zip(
                entry.copies, entry.columns, entry.hashes, strict=True
            ):
                if column < 0 or column in values:
                    continue
                with tf.device(copy.device):
                    value = _read(copy)
                    values[column] = (copy, value, algorithm)
                    row_hash[column] = copy_hash(value, entry.dtype, algorithm, projection)
            items.append((entry, values, row_hash))
            hashes.append(tf.stack(row_hash))
            if exact:
                row = [missing_exact] * num_replicas
                if 0 in values:
                    reference_copy, reference, _ = values[0]
                    with tf.device(reference_copy.device):
                        for column, (_, value, _) in values.items():
                            # Copies the whole of copy r to replica 0's device.
                            row[column] = exact_difference(value, reference, entry.dtype)
                exacts.append(tf.stack(row))
        summaries = _summaries(items, projection)
        fingerprints = [
            tf.stack([summaries.get((index, r), missing_fp) for r in range(num_replicas)])
            for index in range(len(items))
        ]
        self.hash = _stack_or_empty(hashes, [0, num_replicas], tf.int64)
        self.fingerprint = _stack_or_empty(fingerprints, [0, num_replicas, width], tf.float64)
        self.exact = _stack_or_empty(exacts, [0, num_replicas, 2], tf.float64) if exact else None


def _shortcut(entry, values):
    """True when the copies of one variable can share replica 0's summary when their hashes
    agree: numeric, replica 0 present, at least two copies, all hashed by one algorithm."""
    return (
        0 in values
        and len(values) > 1
        and _is_numeric(entry.dtype)
        and all(v[2] == values[0][2] for v in values.values())
    )


def _summaries(items, projection):
    """Stats and sketch of each present copy, `{(variable index, column): float64 [4 + K]}`.

    Args:
      items: `[(entry, values, hashes)]`, `values` `{column: (copy, value, algorithm)}`,
        `hashes` the int64 hash tensors by column.
      projection: the sketch-sign and hash cache of the graph.

    Copies that can share (see `_shortcut`) are summarized under `tf.cond`s on their hashes:
    replica 0's copy is always summarized, on its device; if every copy's hash equals replica
    0's (bit-identical copies, the normal case) its summary is used for every column (identical
    bits give identical stats and sketch, so what is written does not change); otherwise each
    other copy is summarized on its own device. One `tf.cond` covers the whole check when every
    variable agrees, one per variable otherwise. Only the int64 hashes cross devices to decide.
    """
    summaries = {}
    shared = []  # (index, columns, summary of replica 0, same, values)
    for index, (entry, values, hashes) in enumerate(items):
        if not _shortcut(entry, values):
            for column, (copy, value, _) in values.items():
                with tf.device(copy.device):
                    summaries[index, column] = copy_summary(value, entry.dtype, projection)
            continue
        copy0, value0, _ = values[0]
        with tf.device(copy0.device):
            summary0 = copy_summary(value0, entry.dtype, projection)
        columns = sorted(c for c in values if c != 0)
        same = tf.reduce_all(tf.stack([tf.equal(hashes[c], hashes[0]) for c in columns]))
        summaries[index, 0] = summary0
        shared.append((index, entry, columns, summary0, same, values))
    if not shared:
        return summaries

    def copies_of(entry, columns, summary0, values):
        def agree():
            return tf.tile(summary0[None, :], [len(columns), 1])

        def differ():
            # A copy of the cache: signs made inside a branch must stay in it.
            cache = dict(projection)
            rows = []
            for column in columns:
                copy, value, _ = values[column]
                with tf.device(copy.device):
                    rows.append(copy_summary(value, entry.dtype, cache))
            return tf.stack(rows)

        return agree, differ

    branches = [
        copies_of(entry, columns, s0, values) for _, entry, columns, s0, _, values in shared
    ]
    all_same = tf.reduce_all(tf.stack([item[4] for item in shared]))
    others = tf.cond(
        all_same,
        lambda: [agree() for agree, _ in branches],
        lambda: [
            tf.cond(item[4], agree, differ)
            for item, (agree, differ) in zip(shared, branches, strict=True)
        ],
    )
    for (index, _, columns, _, _, _), rows in zip(shared, others, strict=True):
        for column, row in zip(columns, tf.unstack(rows), strict=True):
            summaries[index, column] = row
    return summaries


def _stack_or_empty(rows, empty_shape, dtype):
    return tf.stack(rows) if rows else tf.zeros(empty_shape, dtype)
