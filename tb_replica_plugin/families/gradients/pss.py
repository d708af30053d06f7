"""Gradients family under `ParameterServerStrategy`: each worker's local gradients, per step.

In the scheduled step (`ReplicaProbe.schedule`), `observe_gradients` puts in the step's record,
on the worker, before the update reaches the parameter servers: one sum of squares per variable's
gradient and the loss (float64, bit-cast into the record's int64 words), and the exact NaN/Inf
counts of the gradients and the loss, computed only where a sum or the loss is not finite (a
`tf.cond`: a clean step pays one reduction per gradient). On the coordinator, step k of every
worker (replica r: worker r) is written in the family's tags and layouts: `gradients/variables`
once per variable list, `gradients/nonfinite` at every step where a worker's counts are not all
zero, `gradients/norms` at logged steps and of the last step at each window write.
"""

import functools
import json

import numpy as np
import tensorflow as tf

from tb_replica_plugin.core import distribute
from tb_replica_plugin.families.gradients import schema


def observe(probe, grads, variables, loss, scale, names_of, shape_of, loss_scale=None):
    """In the scheduled step: puts this worker's gradient health in its record.

    Args:
      probe: the `ReplicaProbe` (capturing a scheduled step).
      grads: the worker's gradients (tensors, `tf.IndexedSlices`, None: skipped).
      variables: the variables, in the same order.
      loss: the worker's loss (scalar) or None.
      scale: the gradients are divided by this (float or scalar tensor).
      names_of, shape_of: the family's `variable_names` and `variable_shape`.
      loss_scale: the loss is divided by this (None: `scale`).
    """
    try:
        _observe(probe, grads, variables, loss, scale, names_of, shape_of, loss_scale)
    except Exception as error:  # noqa: BLE001 - must never break training
        probe.warn_failed("gradients", error)


def _observe(probe, grads, variables, loss, scale, names_of, shape_of, loss_scale):
    local = functools.partial(distribute.worker_local, probe.strategy)
    pairs = [(local(g), v) for g, v in zip(grads, variables, strict=True) if g is not None]
    if not pairs:
        probe.warn_once("no_gradients", "tb_replica_plugin: observe_gradients got no gradients.")
        return
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g, _ in pairs]
    loss_scale = tf.cast(scale if loss_scale is None else loss_scale, tf.float64)
    scale = tf.cast(scale, tf.float64)
    sq = tf.stack([tf.cast(2.0 * tf.nn.l2_loss(v), tf.float64) for v in values]) / scale**2
    has_loss = loss is not None
    if has_loss:
        loss = tf.reshape(tf.cast(local(loss), tf.float64), [1]) / loss_scale
    else:
        loss = tf.constant([np.nan], tf.float64)
    finite = tf.reduce_all(tf.math.is_finite(sq))
    if has_loss:
        finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(loss)))

    def counts():
        flat = tf.concat([tf.reshape(v, [-1]) for v in values], axis=0)
        found = [tf.math.is_nan(flat), tf.math.is_inf(flat)]
        if has_loss:
            found += [tf.math.is_nan(loss), tf.math.is_inf(loss)]
        count = [tf.reduce_sum(tf.cast(f, tf.int64)) for f in found]
        return tf.stack(count + [tf.constant(0, tf.int64)] * (4 - len(count)))

    faults = tf.cond(finite, lambda: tf.zeros([4], tf.int64), counts)
    variables = [v for _, v in pairs]
    meta = (tuple(names_of(variables)), tuple(tuple(shape_of(v)) for v in variables), has_loss)
    tensors = {
        "sq": tf.bitcast(sq, tf.int64),
        "loss": tf.bitcast(loss, tf.int64),
        "faults": faults,
    }
    probe.pss_capture("gradients", meta, tensors)


def deliver(recorder, per_worker, step):
    """On the coordinator: step `step` of every worker's gradients, written as one step of the
    run (numpy; each write one eager summary op).

    Args:
      recorder: the gradients family's `Recorder` (its `pss_document`: the last variables
        document written).
      per_worker: per worker, `(meta, {"sq", "loss", "faults"})` (int64 arrays).
      step: the step (each worker's `step`-th).

    Raises:
      ValueError: if the workers observed different variables at this step.
    """
    probe = recorder.probe
    metas = [meta for meta, _ in per_worker]
    if any(meta != metas[0] for meta in metas):
        raise ValueError("the workers observed gradients of different variables at one step")
    names, shapes, has_loss = metas[0]
    document = json.dumps(
        {
            **probe.static,
            "variables": list(names),
            "shapes": [list(s) for s in shapes],
            "loss": has_loss,
            "scaling": "as_given",
            "loss_scaled": False,
        },
        sort_keys=True,
    )
    if document != getattr(recorder, "pss_document", None):
        probe.write_now(
            schema.TAG_GRAD_VARIABLES,
            lambda: tf.constant(document),
            step,
            schema.KIND_GRAD_VARIABLES,
        )
        recorder.pss_document = document
    faults = np.stack([values["faults"] for _, values in per_worker], axis=1)  # [4, R]
    if faults.any():
        value = faults.astype(np.int32)
        probe.write_now(
            schema.TAG_GRAD_NONFINITE, lambda: tf.constant(value), step, schema.KIND_GRAD_NONFINITE
        )
    recorder.pss_last = (step, per_worker)
    if probe.update_freq is not None and step % probe.update_freq == 0:
        write_last(recorder)


def write_last(recorder):
    """Writes the norms and loss of the last step delivered, unless written: at logged steps,
    and at each window write (epoch ends, `flush`, `close`)."""
    last = getattr(recorder, "pss_last", None)
    if last is None:
        return
    recorder.pss_last = None
    step, per_worker = last
    sq = np.stack([values["sq"].view(np.float64) for _, values in per_worker], axis=1)
    loss = np.concatenate([values["loss"].view(np.float64) for _, values in per_worker])
    rows = np.concatenate([np.sqrt(sq.sum(axis=0))[None], loss[None], np.sqrt(sq)])
    norms = rows.astype(np.float32)
    recorder.probe.write_now(
        schema.TAG_GRAD_NORMS, lambda: tf.constant(norms), step, schema.KIND_GRAD_NORMS
    )
