"""Presentation of the watch family: `/watch`, and its blocks of `tb-replica report`.

Pure Python and numpy, no TensorFlow. The route's JSON is documented in `http_api.md`.
"""

import math

import numpy as np

from tb_replica_plugin.core import args
from tb_replica_plugin.families.watch import rules, schema

ARGS = {"max_points": args.parse_max_points}


def _number(value):
    """A float for JSON: None for NaN/Inf, an int for whole numbers."""
    value = float(value)
    if not math.isfinite(value):
        return None
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def _points(points, max_points):
    """`{"steps", "values"}`: `values[s][leaf][stat][replica]`, the last `max_points` points."""
    kept = points[-max_points:]
    return {
        "steps": [step for step, _ in kept],
        "values": [
            [[[_number(v) for v in row] for row in leaf] for leaf in array] for _, array in kept
        ],
        "dropped": len(points) - len(kept),
    }


def value_json(value, max_points):
    """One watched value as JSON (see `http_api.md`, `/watch`)."""
    return {
        "name": value.name,
        "leaves": value.leaves,
        "shape_events": value.shape_events,
        "stats": _points(value.stats, max_points),
        "nonfinite": _points(value.nonfinite, max_points),
    }


def body(run, run_data, parsed):
    """The `/watch` body of a run.

    Args:
      run: the run name asked for.
      run_data: its `reader.RunData`.
      parsed: the parsed `ARGS` (`max_points`: most steps of stats kept, the latest).

    Returns:
      `{"run", "replicas", "devices", "stat_rows", "values": [...]}` (empty `values` when the
      run watched nothing).
    """
    series = run_data.watch
    if series is None:
        return {"run": run, "replicas": [], "devices": [], "stat_rows": [], "values": []}
    return {
        "run": run,
        "replicas": series.replicas,
        "devices": series.devices,
        "stat_rows": list(schema.STAT_ROWS),
        "values": [value_json(v, parsed["max_points"]) for v in series.values.values()],
    }


def identity(run_data):
    """The run's replicas, devices and source as the watch family saw them (None without it);
    a run that only watched values gets its replicas from here."""
    series = run_data.watch
    if series is None:
        return None
    return {
        "replicas": series.replicas,
        "devices": series.devices,
        "source": series.source,
        "steps": np.array(series.steps(), np.int64),
    }


def recorded_steps(run_data):
    """The steps of every watched value (for `/runs` first_step/last_step)."""
    series = run_data.watch
    return [] if series is None else [np.array(series.steps(), np.int64)]


def _last_stats(value):
    """`{leaf: {stat: [per replica]}}` at the latest stats step, and that step (or None)."""
    if not value.stats:
        return None, {}
    step, array = value.stats[-1]
    names = value.leaves_at(step)
    result = {}
    for index in range(array.shape[0]):
        name = names[index] if index < len(names) else f"leaf {index}"
        result[name] = {
            stat: [_number(v) for v in array[index, row]]
            for row, stat in enumerate(schema.STAT_ROWS)
        }
    return step, result


def report_json(run_data, thresholds):
    """The `watch` key of a run's entry in `tb-replica report --json`.

    Returns:
      `{"watch": None}` when the run watched nothing, else `{"watch": {name: {"shape_events",
      "last_stats_step", "last_stats", "nonfinite_steps"}}}`.
    """
    series = run_data.watch
    if series is None:
        return {"watch": None}
    result = {}
    for name, value in series.values.items():
        step, last = _last_stats(value)
        result[name] = {
            "shape_events": value.shape_events,
            "last_stats_step": step,
            "last_stats": last,
            "nonfinite_steps": [s for s, _ in value.nonfinite],
        }
    return {"watch": result}


def report_text(run_data, thresholds):
    """The watched values of a run in the text report (local shapes at every change, at most
    10 changes per value, and the latest stats).

    Returns:
      A list of lines.
    """
    series = run_data.watch
    if series is None:
        return []
    lines = ["  watched values (local shape per replica, at every change):"]
    for name, value in series.values.items():
        lines.append(f"    {name}:")
        for event in value.shape_events[:10]:
            for leaf in event["leaves"]:
                shapes = "  ".join(
                    f"{rules.fmt_shape(s)}:{d}"
                    for s, d in zip(leaf["shapes"], leaf["dtypes"], strict=False)
                )
                flag = "  <-- gather(axis=0) fails" if leaf["mismatch"] else ""
                lines.append(f"      step {event['step']} {leaf['name']}: {shapes}{flag}")
        if len(value.shape_events) > 10:
            lines.append(f"      … {len(value.shape_events) - 10} more changes (see --json)")
        step, last = _last_stats(value)
        for leaf, stats in last.items():
            summary = ", ".join(
                f"{stat} {stats[stat]}" for stat in ("min", "max", "mean", "nan", "inf")
            )
            lines.append(f"      stats at step {step}, {leaf} per replica: {summary}")
    return lines
