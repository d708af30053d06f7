"""Presentation of the gradients family: `/gradients` and the report's gradients block.

The route body (JSON documented in `http_api.md`), the family's blocks of `tb-replica report`
(JSON and text). Pure Python and numpy, no TensorFlow.
"""

import io

import numpy as np
from tensorboard import errors

from tb_replica_plugin.core import args
from tb_replica_plugin.core.downsample import (
    bucket_max,
    float32_list,
    nanmedian,
    pool_replicas,
)
from tb_replica_plugin.core.json_stream import FloatRows
from tb_replica_plugin.families.gradients import read, rules, schema

ARGS = {
    "max_points": args.parse_max_points,
    "step": args.parse_step,
    "batch_step": args.parse_optional_int("batch_step"),
    "batch_replica": args.parse_optional_int("batch_replica"),
    "replica_blocks": args.parse_replica_blocks,
}


def _nonfinite_event(step, counts):
    """One `gradients/nonfinite` event as JSON: its step and each row (`schema.NONFINITE_ROWS`)
    per replica."""
    event = {"step": int(step)}
    for row, name in enumerate(schema.NONFINITE_ROWS):
        event[name] = counts[row].tolist()
    return event


def gradients_body(series, max_points, step=None, replica_blocks=None):
    """The `/gradients` response body for a `read.GradientsSeries` (see `http_api.md`).

    Args:
      series: the run's `GradientsSeries`.
      max_points: most buckets on the step axis (norms and ratios: max of the bucket).
      step: the step of the layer × replica matrix: the last logged step at or before it (the
        first logged step if none). None: the logged step with the largest ratio to the median
        (the likeliest outlier), else the last logged step.
      replica_blocks: with more replicas than this, the per-replica series and the layer
        matrix are sent as this many blocks of replicas, each the largest value of its
        replicas (ratios taken before), with `pooled`.

    Returns:
      The JSON-ready dict.
    """
    steps, norms, loss = series.steps, series.global_norm, series.loss
    ratio = full_ratio = rules.global_ratio(series)
    count = int(steps.size)
    if count > max_points:
        bucket = -(-count // max_points)
        starts = np.arange(0, count, bucket)
        steps, loss = steps[starts], loss[starts]
        norms, ratio = bucket_max(norms, starts), bucket_max(ratio, starts)
    layer_index = None
    if series.steps.size:
        if step is not None:
            layer_index = max(0, int(np.searchsorted(series.steps, step, side="right")) - 1)
        else:
            finite = np.where(np.isfinite(full_ratio), full_ratio, 0.0)
            peak = finite.max(axis=1) if finite.size else finite
            layer_index = int(np.argmax(peak)) if peak.size and peak.max() > 1.0 else count - 1
    (norms, ratio, loss), pooled = pool_replicas([norms, ratio, loss], replica_blocks)
    if layer_index is None:
        layer_step, layer_norms, layer_ratio = None, [], []
    else:
        matrix = series.variable_norms[layer_index]
        layer_step = int(series.steps[layer_index])
        layers, _ = pool_replicas([matrix, rules.ratio_to_median(matrix)], replica_blocks)
        layer_norms = float32_list(layers[0])
        layer_ratio = float32_list(np.float32(layers[1]))
    return {
        "run": series.run,
        "replicas": series.replicas,
        "variables": series.variables,
        "shapes": series.shapes,
        "has_loss": series.has_loss,
        "scaling": series.scaling,
        "steps": steps.tolist(),
        "global_norm": float32_list(norms),
        "ratio": float32_list(np.float32(ratio)),
        "loss": float32_list(loss),
        "downsampled": count > max_points,
        "layer_step": layer_step,
        "layer_norms": layer_norms,
        "layer_ratio": layer_ratio,
        "nonfinite": [
            _nonfinite_event(event_step, counts)
            for event_step, counts in zip(series.nonfinite_steps, series.nonfinite, strict=True)
        ],
        "batches": [captured.to_json() for captured in series.batches],
        **pooled,
    }


def body(run, run_data, parsed):
    """The `/gradients` body of a run, with the run's notes.

    Raises:
      errors.NotFoundError: if the run recorded no gradients (404).
    """
    if run_data.gradients is None:
        raise errors.NotFoundError(f"no gradient data for run {run!r}")
    if parsed.get("batch_step") is not None or parsed.get("batch_replica") is not None:
        return batch_download(
            run, run_data.gradients, parsed["batch_step"], parsed["batch_replica"]
        )
    result = gradients_body(
        run_data.gradients, parsed["max_points"], parsed["step"], parsed["replica_blocks"]
    )
    result["notes"] = run_data.notes
    return result


def batch_download(run, series, step, replica):
    """A captured culprit batch as a `.npz` download (`/gradients?batch_step=S&batch_replica=R`).

    Raises:
      errors.InvalidArgumentError: if only one of the two arguments is given (400).
      errors.NotFoundError: if no batch was captured there (404, naming the captured ones).
    """
    if step is None or replica is None:
        raise errors.InvalidArgumentError("batch_step and batch_replica go together")
    try:
        captured = series.batch(step, replica)
    except KeyError as error:
        raise errors.NotFoundError(error.args[0]) from None
    buffer = io.BytesIO()
    np.savez(buffer, **captured.arrays)
    name = "".join(c if c.isalnum() else "_" for c in run).strip("_") or "run"
    return args.Download(
        buffer.getvalue(), f"{name}_step{step}_replica{replica}.npz", "application/octet-stream"
    )


def recorded_steps(run_data):
    """The logged and the NaN/Inf steps (for `/runs` first_step/last_step)."""
    series = run_data.gradients
    return [] if series is None else [series.steps, series.nonfinite_steps]


def report_json(run_data, thresholds):
    """`{"gradients": ...}` of a run in the JSON report (None without gradients)."""
    return {"gradients": gradients_json(run_data.gradients)}


def report_text(run_data, thresholds):
    """The gradients lines of a run in the text report."""
    return gradients_text(run_data.gradients)


def gradients_json(series):
    """The `gradients` block of a run in `tb-replica report --json` (None without gradients)."""
    if series is None:
        return None
    return {
        "variables": series.variables,
        "shapes": series.shapes,
        "has_loss": series.has_loss,
        "scaling": series.scaling,
        "steps": series.steps.tolist(),
        # [steps, replicas (, variables)]: written a step at a time by `tb-replica report`.
        "global_norm": FloatRows(series.global_norm),
        "ratio_to_median": FloatRows(np.float32(rules.global_ratio(series))),
        "loss": FloatRows(series.loss),
        "variable_norms": FloatRows(series.variable_norms),
        "nonfinite": [
            _nonfinite_event(step, counts)
            for step, counts in zip(series.nonfinite_steps, series.nonfinite, strict=True)
        ],
        "batches": [captured.to_json() for captured in series.batches],
    }


def _fmt(value):
    # Three significant digits: what the report has always printed (an unused 4-digit variant
    # was shadowed by a later definition of the same name in report.py).
    return "—" if value is None else f"{value:.3g}"


def gradients_text(series, max_events=20):
    """The lines of the gradients block of `tb-replica report` (text)."""
    if series is None:
        return []
    lines = []
    steps = (
        f"{series.steps.size} logged step(s) {int(series.steps[0])}–{int(series.steps[-1])}"
        if series.steps.size
        else "no logged steps"
    )
    what = read.scaling_text(series.scaling)
    lines.append(f"  gradients ({what}), {steps}, {len(series.variables)} variable(s):")
    if series.steps.size:
        ratio = rules.global_ratio(series)
        with np.errstate(all="ignore"):
            for index, replica in enumerate(series.replicas):
                norms = series.global_norm[:, index]
                finite = ratio[:, index][np.isfinite(ratio[:, index])]
                peak = finite.max() if finite.size else float("nan")
                loss = series.loss[-1, index]
                loss_text = f", last loss {_fmt(loss)}" if series.has_loss else ""
                lines.append(
                    f"    replica {replica}: median norm {_fmt(nanmedian(norms))}, last "
                    f"{_fmt(norms[-1])}, max ratio to median {_fmt(peak)}{loss_text}"
                )
    if series.nonfinite_steps.size:
        lines.append("  NaN/Inf (step: replica grad NaN/Inf, loss NaN/Inf):")
        for step, counts in list(zip(series.nonfinite_steps, series.nonfinite, strict=True))[
            :max_events
        ]:
            parts = [
                f"replica {replica} {counts[schema.GRAD_NAN, i]}/{counts[schema.GRAD_INF, i]}, "
                f"{counts[schema.LOSS_NAN, i]}/{counts[schema.LOSS_INF, i]}"
                for i, replica in enumerate(series.replicas)
                if counts[:, i].sum()
            ]
            lines.append(f"    step {int(step)}: " + "; ".join(parts))
        if series.nonfinite_steps.size > max_events:
            lines.append(f"    … {series.nonfinite_steps.size - max_events} more (see --json)")
    for captured in series.batches:
        bad = "; ".join(
            f"{name} examples {rows}" for name, rows in captured.nonfinite_examples.items()
        )
        lines.append(
            f"  captured batch: step {captured.step}, replica {captured.replica}"
            + (f" (non-finite: {bad})" if bad else "")
            + f" — tb-replica export-batch LOGDIR --run {series.run} --step {captured.step} "
            f"--replica {captured.replica} out.npz"
        )
    return lines
