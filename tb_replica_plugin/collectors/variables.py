"""Variables family: where every copy of a variable lives, and a small fingerprint of each copy.

Each copy of a variable is fingerprinted on the device that holds it; only the fingerprint
(a few dozen numbers, whatever the variable's size) leaves that device. A fingerprint is:

- `hash`: a 64-bit hash of the copy's raw bits, computed on its device with integer ops that
  every device has (`tf.fingerprint` would do, but it has a CPU kernel only, so on a GPU it
  would copy the whole variable to the host). The bits are read as unsigned words u_j of 32
  bits (8- and 16-bit types: one word per element; row-major, little-endian) and
  `hash = sum_j mix(u_j + (j + 1) * G) mod 2^64` (as int64), with `mix` the splitmix64
  finalizer (a bijection of 64-bit integers) and G = 0x9E3779B97F4A7C15. A difference in a
  single word always changes it (exactly one term changes); other differences go unnoticed
  with a chance of about 2^-64. So one ulp or a -0.0 against a +0.0 changes it.
- `stats`: float64 `(min, max, sum, sum of squares)` of the copy's elements.
- `sketch`: float64 `[K]` CountSketch (a sparse Johnson–Lindenstrauss random projection) of the
  copy's elements cast to float64: element `i` of the flattened copy is added, with sign
  `s(i)`, to bucket `b(i)`, where `h(i) = mix((i + 1) * G XOR S)` (S = `SKETCH_SEED`),
  `b(i)` = the top log2(K) bits of `h(i)` and `s(i) = +1` if `h(i)` is even, else -1. Every
  process, worker and device type computes the same projection (integer arithmetic modulo
  2^64). A variable of at most K elements is copied into its sketch unchanged (`b(i) = i`,
  `s(i) = 1`), so its sketch is exact.

Because the projection is linear and the same for every copy, `sketch(a) - sketch(b)` is the
sketch of `a - b`, and `||sketch(a) - sketch(b)||` estimates `||a - b||` without moving either
copy: unbiased for the squared norm, with a relative standard deviation of the squared norm of
about sqrt(2 / K) (about 1 / sqrt(2K) for the norm: 9 % with K = 64). See README "Weight drift".

`exact=True` adds the true element-wise difference: every copy is sent to replica 0's device and
compared there (traffic: the whole variable per replica), giving the true max-abs and L2 norm of
`copy_r - copy_0`.

Everything here runs in cross-replica context (or eagerly) on the per-device component variables.
"""

import json

import numpy as np
import tensorflow as tf

SKETCH_SIZE = 64  # a power of two: buckets are the top bits of a 64-bit hash
STAT_COLUMNS = ("min", "max", "sum", "sum_sq")
# Layout version of the fingerprint (hash, stats, sketch): bump when any of it changes, so
# fingerprints of different versions are never compared.
FINGERPRINT_VERSION = 1
# splitmix64: the golden-ratio increment and the two multipliers of its finalizer.
GOLDEN = 0x9E3779B97F4A7C15
MIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
MIX_SHIFTS = (30, 27, 31)
SKETCH_SEED = 0x5EED_D21F_7A11_0001  # XORed into the index hash of the sketch
SKETCH_BITS = 6  # K = 2^6


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
        "hash": "sum of splitmix64(u_j + (j + 1) * golden) over the 32-bit words u_j",
        "golden": GOLDEN,
        "mix_multipliers": list(MIX_MULTIPLIERS),
        "mix_shifts": list(MIX_SHIFTS),
        "stats": list(STAT_COLUMNS),
        "sketch_size": SKETCH_SIZE,
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


def bucket_and_sign(size):
    """Bucket and sign of each element index of a flattened variable of `size` elements.

    Args:
      size: int64 scalar tensor or int (more than SKETCH_SIZE).

    Returns:
      `(bucket int32 [size], sign float64 [size])`.
    """
    hashed = mix64(tf.bitwise.bitwise_xor(_index_terms(size), _u64(SKETCH_SEED)))
    bucket = tf.cast(tf.bitwise.right_shift(hashed, _u64(64 - SKETCH_BITS)), tf.int32)
    odd = tf.cast(tf.bitwise.bitwise_and(hashed, _u64(1)), tf.float64)
    return bucket, 1.0 - 2.0 * odd


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


def bitwise_hash(value, dtype, cache=None):
    """64-bit hash of a tensor's raw bits, computed where `value` lives (int64 scalar).

    Args:
      value: the tensor.
      dtype: its `tf.DType`. Strings fall back to `tf.fingerprint` (a CPU kernel).
      cache: optional dict shared by the copies hashed in one graph (index terms per device and
        word count).

    Returns:
      An int64 scalar tensor: the sum, modulo 2^64, of `mix64(u_j + (j + 1) * GOLDEN)`.
    """
    if dtype == tf.string:
        digest = tf.fingerprint(tf.reshape(value, [1, -1]))
        return tf.reshape(tf.bitcast(digest, tf.int64), [])
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


def copy_fingerprint(value, dtype, projection=None):
    """Hash, stats and sketch of one copy; call under `tf.device(copy.device)`.

    Args:
      value: the copy's value (a tensor).
      dtype: its `tf.DType`.
      projection: optional cache `{key: (bucket, sign)}` shared by the copies fingerprinted on
        one device in one graph, so each variable size is hashed once per device.

    Returns:
      `(hash int64 scalar, stats_and_sketch float64 [4 + SKETCH_SIZE])`.
    """
    hash64 = bitwise_hash(value, dtype, projection)
    if not _is_numeric(dtype):
        return hash64, tf.fill([len(STAT_COLUMNS) + SKETCH_SIZE], tf.constant(np.nan, tf.float64))
    flat = tf.cast(tf.reshape(value, [-1]), tf.float64)
    static_size = flat.shape[0]
    size = tf.size(flat, out_type=tf.int64)
    zero = tf.constant(0.0, tf.float64)
    if static_size is not None and static_size > 0:
        low, high = tf.reduce_min(flat), tf.reduce_max(flat)
    else:
        empty = tf.equal(size, 0)
        low = tf.where(empty, zero, tf.reduce_min(flat))
        high = tf.where(empty, zero, tf.reduce_max(flat))
    stats = tf.stack([low, high, tf.reduce_sum(flat), tf.reduce_sum(tf.square(flat))])
    if static_size is not None and static_size <= SKETCH_SIZE:
        # Small variables are their own sketch (b(i) = i, s(i) = 1): exact, no hashing.
        sketch = tf.pad(flat, [[0, SKETCH_SIZE - static_size]])
    else:
        key = (value.device, static_size)
        if projection is None or key not in projection:
            pair = bucket_and_sign(size)
            if projection is not None:
                projection[key] = pair
        bucket, sign = pair if projection is None else projection[key]
        sketch = tf.math.unsorted_segment_sum(flat * sign, bucket, SKETCH_SIZE)
    return hash64, tf.concat([stats, sketch], axis=0)


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
        hashes, fingerprints, exacts = [], [], []
        projection = {}
        for entry in entries:
            row_hash = [missing_hash] * num_replicas
            row_fp = [missing_fp] * num_replicas
            values = {}
            for copy, column in zip(entry.copies, entry.columns, strict=True):
                if column < 0 or column in values:
                    continue
                with tf.device(copy.device):
                    value = _read(copy)
                    values[column] = (copy, value)
                    row_hash[column], row_fp[column] = copy_fingerprint(
                        value, entry.dtype, projection
                    )
            hashes.append(tf.stack(row_hash))
            fingerprints.append(tf.stack(row_fp))
            if exact:
                row = [missing_exact] * num_replicas
                if 0 in values:
                    reference_copy, reference = values[0]
                    with tf.device(reference_copy.device):
                        for column, (_, value) in values.items():
                            # Copies the whole of copy r to replica 0's device.
                            row[column] = exact_difference(value, reference, entry.dtype)
                exacts.append(tf.stack(row))
        self.hash = _stack_or_empty(hashes, [0, num_replicas], tf.int64)
        self.fingerprint = _stack_or_empty(fingerprints, [0, num_replicas, width], tf.float64)
        self.exact = _stack_or_empty(exacts, [0, num_replicas, 2], tf.float64) if exact else None


def _stack_or_empty(rows, empty_shape, dtype):
    return tf.stack(rows) if rows else tf.zeros(empty_shape, dtype)
