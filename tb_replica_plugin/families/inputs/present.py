"""Presentation of the inputs family: `/inputs`, batch sizes and shape changes in the report.

The route body (JSON documented in `http_api.md`), the family's blocks of `tb-replica report`
(JSON and text). Pure Python and numpy, no TensorFlow.
"""

import numpy as np

from tb_replica_plugin.core import args
from tb_replica_plugin.core.downsample import pool_replicas
from tb_replica_plugin.families.inputs import read

ARGS = {"max_points": args.parse_max_points, "replica_blocks": args.parse_replica_blocks}


def downsample_inputs(series, max_points, replica_blocks=None):
    """The `/inputs` response body for a series, cut to at most `max_points` step buckets.

    Args:
      series: a `read.InputsSeries`.
      max_points: most buckets on the step axis.
      replica_blocks: with more replicas than this, the batch sizes are sent as this many
        blocks of replicas (`batch_size_max`: the largest of a block's replicas; `batch_size`
        and `batch_size_min`: the smallest), with `pooled`; `imbalance` is taken before.

    Returns:
      The JSON-ready dict documented in `http_api.md` (`steps`, `batch_size`, ...).
    """
    steps, sizes = series.steps, series.batch_size
    count = int(steps.size)
    if count > max_points:
        bucket = -(-count // max_points)
        starts = np.arange(0, count, bucket)
        lows = np.minimum.reduceat(sizes, starts, axis=0)
        highs = np.maximum.reduceat(sizes, starts, axis=0)
        steps, sizes = steps[starts], sizes[starts]
    else:
        lows = highs = sizes
    if sizes.size:
        high, low = sizes.max(axis=1), sizes.min(axis=1).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            imbalance = np.where(high == low, 1.0, high / low)
    else:
        imbalance = np.ones(steps.size)
    (sizes, lows, highs), pooled = pool_replicas(
        [sizes, lows, highs], replica_blocks, smallest=(0, 1)
    )
    return {
        "run": series.run,
        "replicas": series.replicas,
        "devices": series.devices,
        "source": series.source,
        "strategy": series.strategy,
        "steps": steps.tolist(),
        "batch_size": sizes.tolist(),
        "batch_size_min": lows.tolist(),
        "batch_size_max": highs.tolist(),
        "imbalance": imbalance.tolist(),
        "downsampled": count > max_points,
        "shape_events": [
            {"step": event["step"], "inputs": event["inputs"]} for event in series.shape_events
        ],
        "workers": series.workers,
        "notes": series.notes,
        **pooled,
    }


def body(run, run_data, parsed):
    """The `/inputs` body of a run (`downsample_inputs` of its inputs series).

    Args:
      run: the run name asked for.
      run_data: its `reader.RunData`.
      parsed: the parsed `ARGS` (`max_points`, `replica_blocks`).

    Returns:
      The JSON-ready dict.
    """
    return downsample_inputs(run_data.inputs, parsed["max_points"], parsed["replica_blocks"])


def listed(run_data):
    """`/runs` names the inputs family when it recorded any step."""
    return bool(run_data.inputs.steps.size)


def identity(run_data):
    """The run's replicas, devices, source and step axis as the inputs family saw them."""
    series = run_data.inputs
    return {
        "replicas": series.replicas,
        "devices": series.devices,
        "source": series.source,
        "steps": series.steps,
    }


def recorded_steps(run_data):
    """The steps of the inputs series (for `/runs` first_step/last_step)."""
    return [run_data.inputs.steps]


def report_json(run_data, thresholds):
    """The inputs keys of a run's entry in `tb-replica report --json`.

    Args:
      run_data: a `reader.RunData`.
      thresholds: unused.

    Returns:
      `{"replicas", "devices", "num_replicas", "first_step", "last_step", "steps", "batch_size",
      "shape_events"}` (the run's "source" is the report's, from every family: `read.overview`).
    """
    series = run_data.inputs
    return {
        "replicas": series.replicas,
        "devices": series.devices,
        "num_replicas": series.num_replicas,
        "first_step": int(series.steps[0]) if series.steps.size else None,
        "last_step": int(series.steps[-1]) if series.steps.size else None,
        "steps": series.steps.tolist(),
        "batch_size": series.batch_size.tolist(),
        "shape_events": [{"step": e["step"], "inputs": e["inputs"]} for e in series.shape_events],
    }


def report_text(run_data, thresholds):
    """The batch-size and shape changes of a run in the text report (at most 20 shown).

    Returns:
      A list of lines.
    """
    series = run_data.inputs
    lines = []
    if series.shape_events:
        unit = "worker" if series.strategy == "ParameterServerStrategy" else "replica"
        lines.append(f"  batch size per {unit} (step: sizes), at every change:")
    for event in series.shape_events[:20]:
        sizes = read.event_batch_sizes(event)
        lines.append(f"    step {event['step']}: {sizes}")
        for entry in event["inputs"]:
            shapes = "  ".join(
                f"{list(s)}:{d}" for s, d in zip(entry["shapes"], entry["dtypes"], strict=False)
            )
            flag = "  <-- mismatch" if entry["mismatch"] else ""
            lines.append(f"      {entry['name']}: {shapes}{flag}")
    if len(series.shape_events) > 20:
        lines.append(f"    … {len(series.shape_events) - 20} more changes (see --json)")
    return lines
