"""Presentation of the examples family: `/data` and the report's examples block.

The route body (JSON documented in `http_api.md`), the family's blocks of `tb-replica report`
(JSON and text). Pure Python and numpy, no TensorFlow.
"""

import numpy as np

from tb_replica_plugin.core import args
from tb_replica_plugin.core.downsample import cut_to_blocks, hex64_lists, pick
from tb_replica_plugin.families.examples import rules

ARGS = {"max_points": args.parse_max_points, "matrix_side": args.parse_matrix_side}


def data_body(series, max_points=None, matrix_side=None):
    """The `/data` response body (documented in `http_api.md`) for a `read.DataSeries`.

    Args:
      series: the series.
      max_points: most logged steps sent (evenly spaced; `duplicate_share` keeps each bucket's
        maximum); None sends every one. Totals and matrices always cover every logged step.
      matrix_side: with more replicas than this, `share` and `steps_shared` are sent as
        blocks with `pooled` (`cut_to_blocks`); None sends every pair.
    """
    share, steps_shared = rules.data_pair_shares(series)
    (share, steps_shared), pooled = cut_to_blocks([share, steps_shared], matrix_side)
    window_distinct = np.diagonal(series.window_shared, axis1=1, axis2=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        dup_share = np.where(
            window_distinct > 0, series.window_duplicated / np.maximum(window_distinct, 1), 0.0
        )
    picked = pick(series.steps.size, max_points)
    if picked.size < series.steps.size and picked.size:
        dup_share = np.maximum.reduceat(dup_share, picked, axis=0)
    else:
        dup_share = dup_share[picked]
    totals = series.window_shared.sum(axis=0).diagonal()
    last = series.steps.size - 1
    sketch = []
    if last >= 0:
        for row, distinct in zip(series.sketch[last], series.distinct[last], strict=True):
            sketch.append(hex64_lists(row[: min(int(distinct), row.size)]))
    return {
        "run": series.run,
        "replicas": series.replicas,
        "steps": series.steps[picked].tolist(),
        "window_steps": series.window_steps[picked].tolist(),
        "logged_steps": int(series.steps.size),
        "total_steps": int(series.window_steps.sum()),
        "sampled": bool(series.sampled),
        "downsampled": bool(picked.size < series.steps.size),
        "batch_size": series.batch_size[picked].tolist(),
        "distinct": series.distinct[picked].tolist(),
        "duplicate_share": dup_share.round(6).tolist(),
        "share": share.round(6).tolist(),
        "steps_shared": steps_shared.astype(np.int64).tolist(),
        "total_distinct": totals.tolist(),
        "total_duplicated": series.window_duplicated.sum(axis=0).tolist(),
        "last_sketch": sketch,
        "notes": series.notes,
        **pooled,
    }


def body(run, run_data, parsed):
    """The `/data` body of a run; a run without example series answers 200 with no data (the
    tab asks every run)."""
    series = run_data.data
    if series is None:
        empty = {"run": run, "replicas": [], "steps": [], "logged_steps": 0, "notes": []}
        empty["total_steps"] = 0
        return empty
    return data_body(series, parsed["max_points"], parsed["matrix_side"])


def report_json(run_data, thresholds):
    """`{"data": ...}` of a run in the JSON report (the `/data` body, every step; None if none)."""
    return {"data": data_body(run_data.data) if run_data.data else None}


def report_text(run_data, thresholds):
    """The examples line of a run in the text report."""
    return _data_text(run_data.data)


def _data_text(series):
    """The data block of the text report: examples shared by replica pairs over the run."""
    if series is None or series.steps.size == 0:
        return []
    share, steps_shared = rules.data_pair_shares(series)
    total = int(series.window_steps.sum())
    pairs = [
        f"{series.replicas[r]}–{series.replicas[q]}: {share[r, q]:.0%} at "
        f"{int(steps_shared[r, q])} steps"
        for r in range(series.num_replicas)
        for q in range(r + 1, series.num_replicas)
        if share[r, q] > 0
    ]
    kind = "sampled steps" if getattr(series, "sampled", False) else "steps"
    head = f"  examples ({total} {kind}): shared at the same step by replica pair: "
    return [head + ("; ".join(pairs) if pairs else "none")]
