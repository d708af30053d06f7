"""Gradients family, on one replica's device: what its local gradients (before the all-reduce)
are reduced to before anything leaves the device.

`replica_values` runs in replica context (or under `tf.device` of that replica in cross-replica
context) on the gradients that replica computed: one `l2_loss` per variable gives the sum of
squares of each variable's gradient (`sq`, float32 [V]), from which the per-variable norms and the
global norm follow; with the loss, those `V + 1` floats go into the step's one transfer
(`core.transfer`). They also decide the NaN/Inf check: their sum is finite exactly when no
gradient element and not the loss is NaN or Inf (or the squares overflow float32, beyond ~1.8e19
per element), so the exact counts (`nonfinite_counts`, int [4]: rows `schema.NONFINITE_ROWS`) are
taken only in the replica's fault branch, on its device, where that sum is not finite: its
gradients never leave it. A clean step costs the V reductions.
"""

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tb_replica_plugin.families.gradients import schema


def _dense_values(grad):
    """The values whose squares sum to the squared norm of `grad` (IndexedSlices combined)."""
    if isinstance(grad, tf.IndexedSlices):
        # Rows repeated in the indices add up in the dense gradient: combine them first.
        unique, position = tf.unique(grad.indices)
        return tf.math.unsorted_segment_sum(grad.values, position, tf.size(unique))
    return grad


def as_float32(value):
    value = tf.convert_to_tensor(value)
    return value if value.dtype == tf.float32 else tf.cast(value, tf.float32)


def is_number(value):
    """Whether `value` is a Python or numpy number (a factor known when tracing)."""
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


def float32_factor(value):
    """A float32 factor: a number stays a numpy float32 constant (no op to trace or run at every
    step); anything else (e.g. a dynamic loss scale) becomes a float32 tensor."""
    if is_number(value):
        return np.float32(value)
    return as_float32(value)


def squared_factor(scale):
    """`2 / scale**2` in float32, what a sum of `l2_loss` values is multiplied by: the float32
    ops' result, a constant for a number (`float32_factor`)."""
    inverse = np.float32(1.0) / float32_factor(scale)
    return np.float32(2.0) * (inverse * inverse)


class ReplicaGradients(NamedTuple):
    """One replica's gradients, reduced on its device (`replica_values`).

    Attributes:
      sq: float32 scalars, one per variable: its gradient's `l2_loss` (half its sum of
        squares), before any scaling: the host scales them (`HostScaling`).
      loss: float32 scalar: the replica's loss before any scaling; zero when none was given.
      scales: float32 scalars the host reads the scaling from: `[scale]` when the gradients'
        scale is a tensor, then `[loss scale]` when the loss's is (else empty).
      values: the float32 dense gradient values (`IndexedSlices` combined), which
        `nonfinite_counts` counts in at a faulty step.
    """

    sq: list
    loss: tf.Tensor
    scales: list
    values: list


class HostScaling(NamedTuple):
    """How the host scales the packed values: `scale` and `loss_scale`, each a number (known
    when tracing) or None (a tensor, packed after the loss: `ReplicaGradients.scales`); and
    `loss_factor`, a float32 constant the packed loss is multiplied by first (None: none), where
    the step computed the loss as a product by that constant (`constant_factor`)."""

    scale: object
    loss_scale: object
    loss_factor: object = None

    @property
    def packed(self):
        """How many scales are packed after the sums of squares and the loss."""
        return int(self.scale is None) + int(self.loss_scale is None)


def host_scaling(scale, loss_scale=None, loss_factor=None):
    """The `HostScaling` of these divisors (`replica_values`) and the loss's constant factor
    (`constant_factor`, or None)."""
    loss_scale = scale if loss_scale is None else loss_scale
    return HostScaling(
        float(scale) if is_number(scale) else None,
        float(loss_scale) if is_number(loss_scale) else None,
        None if loss_factor is None else np.float32(loss_factor),
    )


def constant_factor(loss):
    """`(value, factor)` of a float32 scalar loss computed in the step's graph as `value *
    factor`, `factor` a constant in (0, 1] (Keras divides each replica's loss by the replica
    count so): the host multiplies the packed `value` by `factor` in float32 (`scaled_rows`),
    the product the device would have computed, bit for bit. The step needs that product for
    nothing else (Grappler folds it with Keras's own unscaling for its loss metric), so taking
    `value` spares each replica its multiplications. Its finiteness is the product's (the
    factor is finite, nonzero and at most 1). Anything else: `(loss, None)`.

    Args:
      loss: the captured loss (a tensor or a `PerReplica` value), or None.

    Returns:
      `(value, factor)`: a tensor and a numpy float32, or `(loss, None)`.
    """
    if not isinstance(loss, tf.Tensor) or tf.executing_eagerly():
        return loss, None
    op = loss.op
    if op.type != "Mul" or loss.dtype != tf.float32 or loss.shape.rank != 0:
        return loss, None
    for index in (1, 0):
        constant = op.inputs[index]
        if constant.op.type != "Const" or constant.shape.rank != 0:
            continue
        factor = np.float32(tf.get_static_value(constant))
        value = op.inputs[1 - index]
        if 0 < factor <= 1 and value.dtype == tf.float32 and value.shape.rank == 0:
            return value, factor
    return loss, None


def replica_values(grads, loss=None, scale=1.0, loss_scale=None, combine=True):
    """The every-step values of one replica's gradients, computed where they are (no copy).

    One `l2_loss` per variable: nothing else runs on the replica's device at a clean step. The
    scaling (`2 / scale**2` for the sums of squares, `1 / loss_scale` for the loss) is the
    host's (`scaled_rows`), in the same float32 arithmetic.

    Args:
      grads: this replica's gradients (tensors or `tf.IndexedSlices`, no None).
      loss: this replica's loss (scalar tensor), or None when unknown.
      scale: factor the recorded gradients are divided by (number or scalar tensor), e.g. the
        loss scale of a `LossScaleOptimizer` (a tensor is packed for the host).
      loss_scale: factor the recorded loss is divided by (default: `scale`).
      combine: combine the repeated rows of `tf.IndexedSlices` (their norm needs it; whether
        they hold a NaN or an Inf does not: the plain step's check takes the rows as given).

    Returns:
      A `ReplicaGradients`.
    """
    values = [
        as_float32(_dense_values(g) if combine or not isinstance(g, tf.IndexedSlices) else g.values)
        for g in grads
    ]
    # One op per variable: l2_loss(v) = sum(v * v) / 2, the same sum (halving is exact).
    sq = [tf.nn.l2_loss(v) for v in values]
    loss_scale = scale if loss_scale is None else loss_scale
    scales = [as_float32(s) for s in (scale, loss_scale) if not is_number(s)]
    if loss is None:
        return ReplicaGradients(sq, tf.zeros([], tf.float32), scales, values)
    loss_value = as_float32(loss)
    if loss_value.shape.rank != 0:
        loss_value = tf.reshape(loss_value, [-1])[0]
    return ReplicaGradients(sq, loss_value, scales, values)


def packed_floats(gradients, has_loss):
    """float32 scalars: what one replica sends (`sq`, its loss when one was given, `scales`)."""
    return [*gradients.sq, *([gradients.loss] if has_loss else []), *gradients.scales]


def scaled_rows(floats, count, has_loss, scaling):
    """float32 `(sq [R, V], loss [R])` from the packed values as the device's float32 ops would
    have scaled them: `l2_loss * (2 / scale**2)`, `loss / loss_scale` (NaN without a loss).

    Args:
      floats: float64 [R, V (+ 1) (+ packed scales)], as packed.
      count: V.
      has_loss: whether the loss follows the sums of squares.
      scaling: the `HostScaling`.
    """
    values = tf.cast(floats, tf.float32)  # exact: they were float32
    column = count + int(has_loss)
    if scaling.scale is None:
        scale = values[:, column : column + 1]
        column += 1
    else:
        scale = float32_factor(scaling.scale)
    sq = values[:, :count] * squared_factor(scale)
    if not has_loss:
        return sq, tf.fill(tf.shape(values)[:1], tf.constant(float("nan"), tf.float32))
    divisor = (
        values[:, column] if scaling.loss_scale is None else float32_factor(scaling.loss_scale)
    )
    loss = values[:, count]
    if scaling.loss_factor is not None:
        loss = loss * scaling.loss_factor  # the step's own product (`constant_factor`)
    return sq, loss / divisor


def stop_flag(gradients, has_loss, loss_only, batch_leaves=()):
    """float32 1.0 when a replica has a fault that stops the job (`Recorder.sync_faults`), else 0.

    An empty batch's NaN/Inf loss with finite gradients does not stop the job, as the device
    fault record leaves it out (`device_faults`): the inputs family's `empty_shard` is its cause.

    Args:
      gradients: the replica's `ReplicaGradients`.
      has_loss: whether a loss was given.
      loss_only: under a loss-scale optimizer (with a loss) only a NaN/Inf loss stops: its
        gradient overflows are expected. Otherwise any NaN/Inf in gradients or loss.
      batch_leaves: the replica's batch leaves (tensors), if known: the first one with a batch
        dimension tells an empty batch.

    Example:
      >>> values = replica_values([tf.zeros([2])], tf.constant(float("nan")))
      >>> stop_flag(values, True, False, [tf.zeros([0, 3])]).numpy()
      0.0
    """
    grads_bad = tf.logical_not(tf.math.is_finite(tf.add_n(gradients.sq)))
    if not has_loss:
        return tf.cast(grads_bad, tf.float32)
    loss_bad = tf.logical_not(tf.math.is_finite(gradients.loss))
    sized = [leaf for leaf in batch_leaves if leaf.shape.rank != 0][:1]
    if sized:
        loss_bad = tf.logical_and(loss_bad, tf.shape(sized[0], out_type=tf.int64)[0] > 0)
    bad = loss_bad if loss_only else tf.logical_or(grads_bad, loss_bad)
    return tf.cast(bad, tf.float32)


def nonfinite_counts(values, loss_value, has_loss):
    """int32 [4] exact NaN/Inf counts of one replica (rows `schema.NONFINITE_ROWS`).

    Only computed at a step where the replica's sums of squares or loss are not finite (its
    fault branch): a finite sum of squares means no gradient element is NaN or Inf.

    Args:
      values: the replica's float32 gradient values (`ReplicaGradients.values`).
      loss_value: its float32 loss (divided by a tensor loss scale or not: NaN and Inf either
        way).
      has_loss: whether a loss was given (else the loss rows are 0).

    Example:
      >>> nonfinite_counts([tf.constant([float("nan"), 1.0])], tf.constant(float("inf")), True)
      <tf.Tensor: shape=(4,), dtype=int32, numpy=array([1, 0, 0, 1], dtype=int32)>
    """
    counts = [tf.zeros([], tf.int32)] * len(schema.NONFINITE_ROWS)
    if values:
        # One vector of every gradient element (one shape constant for every reshape), then both
        # counts from one reduction: the branch runs only at a faulty step, but it is traced with
        # every step function, so it is kept to a few ops.
        flat_shape = tf.constant([-1])
        flat = tf.concat([tf.reshape(v, flat_shape) for v in values], axis=0)
        kinds = tf.stack([tf.math.is_nan(flat), tf.math.is_inf(flat)])
        counts[schema.GRAD_NAN], counts[schema.GRAD_INF] = tf.unstack(
            tf.reduce_sum(tf.cast(kinds, tf.int32), axis=1)
        )
    if has_loss:
        counts[schema.LOSS_NAN] = tf.cast(tf.math.is_nan(loss_value), tf.int32)
        counts[schema.LOSS_INF] = tf.cast(tf.math.is_inf(loss_value), tf.int32)
    return tf.stack(counts)
