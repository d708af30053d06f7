"""Gradients family: each replica's local (pre all-reduce) gradient norms, loss and NaN/Inf counts.

`replica_stats` runs on one replica's device, in replica context (or under `tf.device` of that
replica in cross-replica context), on the gradients that replica computed. It reduces them to a
few scalars per variable, so only `V + 2` floats and 4 ints per replica ever leave the device:

- the sum of squares of every variable's gradient (`sq`, float32 [V]), from which the per-variable
  norms and the global norm (`sqrt(sum(sq))`) follow;
- the loss (float32 scalar);
- NaN/Inf counts (int32 [4]: NaN in gradients, Inf in gradients, loss NaN, loss Inf).

The counts are cheap to skip: the global squared norm is finite exactly when no gradient holds a
NaN or an Inf (or the squares overflow float32, beyond ~1.8e19 per element), so each replica
only computes that flag (with the loss check); the probe computes the exact counts of every
replica inside one `tf.cond` on the flags. A step without NaN/Inf costs the V reductions (one
`l2_loss` each) and one scalar `is_finite` per replica.
"""

import hashlib
import json

import tensorflow as tf

# Rows of the int32 [4, R] non-finite counts.
NONFINITE_ROWS = ("grad_nan", "grad_inf", "loss_nan", "loss_inf")


def variable_name(variable, index):
    """A readable name for a variable: Keras 3 `path`, else `name` without ":0"."""
    name = getattr(variable, "path", None) or getattr(variable, "name", None) or f"var_{index}"
    name = str(name)
    return name[:-2] if name.endswith(":0") else name


def variable_names(variables):
    """Names of `variables`, made unique with a `#i` suffix where two share a name."""
    names = []
    seen = {}
    for index, variable in enumerate(variables):
        name = variable_name(variable, index)
        if name in seen:
            seen[name] += 1
            name = f"{name}#{seen[name]}"
        else:
            seen[name] = 0
        names.append(name)
    return names


def variable_shape(variable):
    try:
        return [int(d) if d is not None else -1 for d in variable.shape]
    except (TypeError, ValueError, AttributeError):
        return []


def pair_gradients(grads, variables):
    """Keeps the `(gradient, variable)` pairs whose gradient is not None.

    Args:
      grads: gradients (tensors, `tf.IndexedSlices` or None), one per variable.
      variables: the variables.

    Returns:
      `(grads, variables)` lists without the None gradients.

    Raises:
      ValueError: if the two lists differ in length.
    """
    grads = list(grads)
    variables = list(variables)
    if len(grads) != len(variables):
        raise ValueError(f"got {len(grads)} gradients for {len(variables)} variables")
    kept = [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None]
    return [g for g, _ in kept], [v for _, v in kept]


def _dense_values(grad):
    """The values whose squares sum to the squared norm of `grad` (IndexedSlices combined)."""
    if isinstance(grad, tf.IndexedSlices):
        # Rows repeated in the indices add up in the dense gradient: combine them first.
        unique, position = tf.unique(grad.indices)
        return tf.math.unsorted_segment_sum(grad.values, position, tf.size(unique))
    return grad


def _as_float32(value):
    value = tf.convert_to_tensor(value)
    return value if value.dtype == tf.float32 else tf.cast(value, tf.float32)


def replica_stats(grads, loss=None, scale=1.0, loss_scale=None):
    """The every-step stats of one replica's gradients, computed where they are (no copy).

    Args:
      grads: this replica's gradients (tensors or `tf.IndexedSlices`, no None).
      loss: this replica's loss (scalar tensor), or None when unknown.
      scale: factor the recorded gradients are divided by (float or scalar tensor), e.g. the
        loss scale of a `LossScaleOptimizer`.
      loss_scale: factor the recorded loss is divided by (default: `scale`).

    Returns:
      A tuple `(sq, loss, healthy, values)`: float32 [V] sums of squares of each gradient divided
      by `scale**2`, the float32 loss divided by `loss_scale` (NaN when `loss` is None), a bool
      scalar (the squared global norm and the loss are finite), and the float32 dense gradient
      values (`IndexedSlices` combined) that `nonfinite_counts` counts in when `healthy` is
      False.
    """
    values = [_as_float32(_dense_values(g)) for g in grads]
    inverse = 1.0 / _as_float32(scale)
    if values:
        # One op per variable: l2_loss(v) = sum(v * v) / 2, the same sum (halving is exact).
        sq = tf.stack([tf.nn.l2_loss(v) for v in values]) * (2.0 * tf.square(inverse))
    else:
        sq = tf.zeros([0], tf.float32)
    if loss is None:
        loss_value = tf.constant(float("nan"), tf.float32)
        healthy = tf.math.is_finite(tf.reduce_sum(sq))
    else:
        loss_divisor = _as_float32(scale if loss_scale is None else loss_scale)
        loss_value = tf.reshape(_as_float32(loss), [-1])[0] / loss_divisor
        healthy = tf.math.is_finite(tf.reduce_sum(sq) + loss_value)
    return sq, loss_value, healthy, values


def nonfinite_counts(values, loss_value, has_loss):
    """int32 [4] exact NaN/Inf counts of one replica (rows `NONFINITE_ROWS`).

    Only computed (by the probe, under a `tf.cond`) at a step where some replica's `healthy`
    flag is False: a finite sum of squares means no gradient element is NaN or Inf.

    Args:
      values: the replica's float32 gradient values (from `replica_stats`).
      loss_value: its float32 loss (from `replica_stats`).
      has_loss: whether a loss was given (else the loss rows are 0).
    """

    def count(predicate):
        if not values:
            return tf.constant(0, tf.int32)
        return tf.add_n([tf.math.count_nonzero(predicate(v), dtype=tf.int32) for v in values])

    if has_loss:
        loss_nan = tf.cast(tf.math.is_nan(loss_value), tf.int32)
        loss_inf = tf.cast(tf.math.is_inf(loss_value), tf.int32)
    else:
        loss_nan = loss_inf = tf.constant(0, tf.int32)
    return tf.stack([count(tf.math.is_nan), count(tf.math.is_inf), loss_nan, loss_inf])


def raw_rows(per_replica_sq, per_replica_loss):
    """float32 `[1 + V, R]`: the loss row, then the sums of squares (cross-replica context).

    What the probe keeps at every step for a host-side write (two ops); `dense_rows` turns it
    into the written rows.
    """
    return tf.concat(
        [tf.expand_dims(tf.stack(per_replica_loss), 0), tf.stack(per_replica_sq, axis=1)], 0
    )


def dense_rows(raw):
    """The dense `[2 + V, R]` tensor of `gradients/norms` from `raw_rows`.

    Args:
      raw: float32 [1 + V, R] from `raw_rows`.

    Returns:
      float32 [2 + V, R]: global norm, loss, then the norm of each variable's gradient.
    """
    sq = raw[1:]  # [V, R]
    global_norm = tf.sqrt(tf.reduce_sum(sq, axis=0, keepdims=True))
    return tf.concat([global_norm, raw[:1], tf.sqrt(sq)], axis=0)


def variables_document(names, shapes, static_fields):
    """The JSON text of a `gradients/variables` event and its int64 fingerprint."""
    document = dict(static_fields, variables=list(names), shapes=[list(s) for s in shapes])
    text = json.dumps(document, sort_keys=True)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=7).digest()
    return text, int.from_bytes(digest, "little")
