"""Presentation of the variables family: `/variables` and the report's drift block.

The route body (JSON documented in `http_api.md`), the family's blocks of `tb-replica report`
(JSON and text). Pure Python and numpy, no TensorFlow.
"""

import numpy as np

from tb_replica_plugin import analysis
from tb_replica_plugin.core import args
from tb_replica_plugin.core.downsample import bucket_max, floats, nanmax, pool_replicas
from tb_replica_plugin.families.variables import ps_balance

DEFAULT_TOP = 5
TOP_RANGE = (1, 1000)
REPORT_TOP = 5  # most divergent variables with per-step series in the report


def variables_body(series, thresholds=None, top=DEFAULT_TOP, max_points=None, replica_blocks=None):
    """The `/variables` response body (and the report's `variables` block) for one run.

    Args:
      series: a `read.VariablesSeries`, or None (the run recorded no variables).
      thresholds: `analysis.Thresholds` (its `variable_drift_rel_l2` is returned as tolerance).
      top: how many of the most divergent variables get per-step, per-replica series.
      max_points: most buckets on the step axis (None: every logged step); a bucket keeps the
        largest value of each series over its steps.
      replica_blocks: with more replicas than this, the top variables' per-replica series
        are sent as this many blocks of replicas, each the largest value of its replicas
        (`core.downsample.pool_replicas`), with `pooled`.

    Returns:
      The JSON-ready dict documented in `http_api.md`.
    """
    thresholds = thresholds or analysis.Thresholds()
    tolerance = thresholds.variable_drift_rel_l2
    if series is None:
        return {
            "replicas": [],
            "devices": [],
            "steps": [],
            "exact_steps": [],
            "downsampled": False,
            "tolerance": tolerance,
            "variables": [],
            "top": [],
            "rotation": None,
            "parameter_servers": None,
            "notes": [],
        }
    ranked = _ranked(series)[:top]
    steps, rel, max_abs, downsampled = _bucketed(series, ranked, max_points)
    (rel, max_abs), pooled = pool_replicas([rel, max_abs], replica_blocks)
    return {
        "run": series.run,
        "replicas": series.replicas,
        "devices": series.devices,
        "steps": steps.tolist(),
        "exact_steps": series.steps[series.exact].tolist(),
        "downsampled": bool(downsampled),
        "tolerance": tolerance,
        "variables": [
            _variable_row(series, index, tolerance) for index in range(len(series.variables))
        ],
        "top": _top_rows(series, ranked, rel, max_abs),
        "rotation": rotation_body(series),
        "parameter_servers": ps_balance.balance(series),
        "notes": series.notes,
        **pooled,
    }


def _bucketed(series, shown, max_points):
    """The step axis and the per-step arrays the charts get: every logged step, or buckets.

    Args:
      series: a `read.VariablesSeries`.
      shown: the positions of the variables whose per-replica series are sent (only they are
        cut into buckets: the arrays are [S, V, R], thousands of replicas wide at job scale).
      max_points: most buckets on the step axis (None: every logged step).

    Returns:
      `(steps, rel_l2, max_abs, downsampled)`: each bucket's first step and the largest values
      over its steps when `downsampled`, else the series' own; the arrays [S, len(shown), R].
    """
    steps = series.steps
    rel, max_abs = series.rel_l2[:, shown, :], series.max_abs[:, shown, :]
    count = int(steps.size)
    downsampled = max_points is not None and count > max_points
    if downsampled:
        bucket = -(-count // max_points)
        starts = np.arange(0, count, bucket)
        rel, max_abs = bucket_max(rel, starts), bucket_max(max_abs, starts)
        steps = steps[starts]
    return steps, rel, max_abs, downsampled


def _variable_row(series, index, tolerance):
    """The `variables` row of the variable at `index`: its description and whole-run drift.

    Args:
      series: a `read.VariablesSeries`.
      index: the variable's position in `series.variables`.
      tolerance: the relative L2 above which a step counts as drift.

    Returns:
      The JSON-ready dict (see `http_api.md`).
    """
    variable = series.variables[index]
    per_variable = series.rel_l2[:, index, :]
    with np.errstate(invalid="ignore"):
        above = np.flatnonzero((per_variable > tolerance).any(axis=1))
    both = series.hash_comparable[index]  # copies of r and 0, hashed alike
    differ = ~series.identical[:, index, :] & both
    compared = int(both[1:].sum())
    return {
        **{k: variable.get(k) for k in ("name", "shape", "dtype", "trainable", "sync")},
        "devices": variable.get("devices", []),
        "mirrored": bool(variable.get("mirrored", True)),
        "present": series.present[index].tolist(),
        "max_rel_l2": floats(nanmax(per_variable)),
        "max_abs": floats(nanmax(series.max_abs[:, index, :])),
        "max_abs_exact": bool(series.exact.size and series.exact.all()),
        "compared_replicas": compared,
        "bit_identical": None if compared == 0 else not bool(differ.any()),
        "first_drift_step": int(series.steps[above[0]]) if above.size else None,
    }


def _ranked(series):
    """The positions of the variables (not on-read) by their whole-run largest relative L2,
    most divergent first (ties by position)."""
    candidates = [i for i, v in enumerate(series.variables) if v.get("sync") != "on_read"]
    score = {i: nanmax(series.rel_l2[:, i, :]) for i in candidates}
    return sorted(candidates, key=lambda i: (-(0.0 if np.isnan(score[i]) else float(score[i])), i))


def _top_rows(series, ranked, rel, max_abs):
    """The `top` rows: the most divergent variables with their per-step series.

    Args:
      series: a `read.VariablesSeries`.
      ranked: the positions of the variables shown, most divergent first (`_ranked`).
      rel, max_abs: their shown arrays (`_bucketed`, then pooled), `[S, len(ranked), R]`.

    Returns:
      The rows, in the order of `ranked`.
    """
    return [
        {
            "name": series.variables[i]["name"],
            "index": i,
            "max_rel_l2": floats(nanmax(rel[:, at, :], axis=1)),
            "rel_l2": floats(rel[:, at, :]),
            "max_abs": floats(max_abs[:, at, :]),
        }
        for at, i in enumerate(ranked)
    ]


def rotation_body(series):
    """`rotation` of the `/variables` body: None unless the checks read rotating slices.

    Returns:
      `{"period", "budget", "partial_steps", "partial_fraction"}`: P, the elements per replica
      of a check, the logged steps whose check read slices, and the smallest fraction of a
      variable one of them read.
    """
    if series.rotation is None:
        return None
    partial = (series.coverage < 1.0).any(axis=1)
    return {
        "period": series.rotation.get("period"),
        "budget": series.rotation.get("budget"),
        "partial_steps": int(partial.sum()),
        "partial_fraction": float(series.coverage.min()) if series.coverage.size else 1.0,
    }


def parse_top(raw):
    """Parses the `top` argument.

    Raises:
      errors.InvalidArgumentError: if it is not an integer in `TOP_RANGE`.
    """
    return args.parse_int("top", raw, DEFAULT_TOP, TOP_RANGE)


ARGS = {
    "max_points": args.parse_max_points,
    "top": parse_top,
    "replica_blocks": args.parse_replica_blocks,
}


def body(run, run_data, parsed):
    """The `/variables` body of a run (empty lists when it recorded no variables)."""
    result = variables_body(
        run_data.variables,
        top=parsed["top"],
        max_points=parsed["max_points"],
        replica_blocks=parsed["replica_blocks"],
    )
    result["run"] = run
    return result


def identity(run_data):
    """The replicas, devices and source the variables family saw (None without variables)."""
    series = run_data.variables
    if series is None:
        return None
    return {
        "replicas": series.replicas,
        "devices": series.devices,
        "source": series.source,
        "steps": series.steps,
    }


def recorded_steps(run_data):
    """The logged steps of the variables series (for `/runs` first_step/last_step)."""
    return [] if run_data.variables is None else [run_data.variables.steps]


def runs_fields(run_data):
    """`{"variables": count}`: how many variables the run's drift check covers, for `/runs`."""
    series = run_data.variables
    return {"variables": 0 if series is None else len(series.variables)}


def report_json(run_data, thresholds):
    """`{"variables": ...}` of a run in the JSON report (the `/variables` body, top 5)."""
    series = run_data.variables
    return {
        "variables": None if series is None else variables_body(series, thresholds, top=REPORT_TOP)
    }


def report_text(run_data, thresholds):
    """The weight-drift and placement lines of a run in the text report."""
    return _variables_text(run_data.variables, thresholds)


def _fmt(value):
    return "—" if value is None else f"{value:.3g}"


def _variables_text(series, thresholds, top=REPORT_TOP):
    """The weight-drift and placement block of one run in `to_text`."""
    if series is None:
        return []
    held = ps_balance.balance(series)
    if held is not None:  # ParameterServerStrategy: one copy per variable, on a ps
        return ps_balance.report_text(held)
    body = variables_body(series, thresholds, top=top)
    rows = body["variables"]
    steps = series.steps
    span = f"{int(steps[0])}–{int(steps[-1])} ({steps.size})" if steps.size else "none"
    mirrored = sum(1 for row in rows if row["mirrored"])
    exact = f", exact check at {len(body['exact_steps'])}" if body["exact_steps"] else ""
    lines = [
        f"  variables: {len(rows)} ({mirrored} mirrored on every replica), logged steps "
        f"{span}{exact}; drift of each copy from replica 0 (tolerance relative L2 "
        f"{thresholds.variable_drift_rel_l2:g}):"
    ]
    by_name = {row["name"]: row for row in rows}
    for entry in body["top"]:
        row = by_name[entry["name"]]
        if row["bit_identical"] is None:
            state = "not compared (no copy on another replica)"
        elif row["bit_identical"]:
            state = "bit-identical on every replica"
        else:
            bound = "" if row["max_abs_exact"] else "≥"
            first = row["first_drift_step"]
            state = (
                f"max rel L2 {_fmt(row['max_rel_l2'])}, max |diff| {bound}{_fmt(row['max_abs'])}"
                + (f", above tolerance from step {first}" if first is not None else "")
            )
        lines.append(f"    {entry['name']}: {state}")
    if len(rows) > len(body["top"]):
        lines.append(f"    … {len(rows) - len(body['top'])} more variables (see --json)")
    for row in rows:
        if not row["mirrored"]:
            lines.append(f"    not mirrored: {row['name']} on {', '.join(row['devices'])}")
    return lines
