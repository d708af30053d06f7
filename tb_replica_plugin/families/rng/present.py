"""Presentation of the rng family: `/rng` and the report's random-generator block.

The route body (JSON documented in `http_api.md`), the family's blocks of `tb-replica report`
(JSON and text). Pure Python and numpy, no TensorFlow.
"""

import numpy as np

from tb_replica_plugin.core import args
from tb_replica_plugin.core.downsample import cut_to_blocks, hex64_lists, pick, pool_uniform
from tb_replica_plugin.families.rng import rules

ARGS = {"max_points": args.parse_max_points, "matrix_side": args.parse_matrix_side}
# The tab's rng view draws the stream and state groups of the last logged step only (its match
# matrices cover every step whatever `max_points`): it asks the first and the last
# (`plugin.run_view_query`; frontend/src/sections.js: RNG_STEPS).
RUN_VIEW_ARGS = {"max_points": "2"}


def rng_body(series, max_points=None, matrix_side=None):
    """The `/rng` response body (documented in `http_api.md`) for a `read.RngSeries`.

    Fingerprints and states are 64-bit: they are sent as hex strings (JavaScript numbers hold
    53 bits), and per step as stream groups (replicas with equal streams share a group id).

    Args:
      series: the series.
      max_points: most logged steps sent (evenly spaced); None sends every one. The match
        matrices always cover every logged step.
      matrix_side: with more replicas than this, each `match` is sent as blocks with `pooled`
        (`cut_to_blocks`); None sends every pair.
    """
    picked = pick(series.steps.size, max_points)
    generators = []
    for index, generator in enumerate(series.generators):
        fingerprint = series.fingerprint[:, index]
        state = series.state[:, index, :, : generator["state_size"]]
        last = series.steps.size - 1
        match, pooled = _match_matrix(fingerprint, matrix_side)
        generators.append(
            {
                **generator,
                **pooled,
                "match": match.round(6).tolist(),
                "stream_groups": [rules.stream_groups(fingerprint[s]) for s in picked],
                "state_groups": [rules.stream_groups(state[s]) for s in picked],
                "last_fingerprint": hex64_lists(fingerprint[last]) if last >= 0 else [],
                "last_state": hex64_lists(state[last]) if last >= 0 else [],
            }
        )
    return {
        "run": series.run,
        "replicas": series.replicas,
        "devices": series.devices,
        "steps": series.steps[picked].tolist(),
        "logged_steps": int(series.steps.size),
        "downsampled": bool(picked.size < series.steps.size),
        "generators": generators,
        "notes": series.notes,
    }


def _match_matrix(fingerprint, side):
    """A generator's `match` matrix and its `cut_to_blocks` fields; in blocks without the
    R × R matrix when no step splits the replicas into groups (at each step all drew the same
    stream or all their own, as in a healthy run: every pair then matches at the same
    fraction; 0.1 s at 2,048 replicas)."""
    steps, replicas = fingerprint.shape
    if not steps:
        return np.zeros((0, 0)), {}
    kinds = rules.step_kinds(fingerprint)
    every, split = kinds
    if side is not None and replicas > side and not split.any():
        value = int(every.sum()) / steps
        pairs = replicas * (replicas - 1) // 2 if value > 0 else 0
        fields = {"pooled": {"side": side, "pairs_above_0": pairs}}
        return pool_uniform(replicas, side, value), fields
    (match,), pooled = cut_to_blocks([match_fraction(fingerprint, kinds)], side)
    return match, pooled


# Replica pairs × partitions compared at once by `match_fraction` (bounds its memory to ~64 MB).
MATCH_CELLS = 1 << 26


def match_fraction(fingerprint, kinds=None):
    """float64 [R, R]: the fraction of steps at which replicas a and b drew equal streams.

    A step where no two replicas draw the same stream (in a healthy run, every step) counts
    on the diagonal only, one where all draw the same stream in every pair. Of the others, when
    that is more than `MATCH_CELLS` comparisons, steps that split the replicas into the same
    groups are compared once: each step's replicas are labelled by the first replica drawing the
    same stream, and each distinct labelling counts as many times as steps have it.

    Args:
      fingerprint: int64 [S, R] (S >= 1), one generator's stream fingerprints.
      kinds: its `rules.step_kinds` when already known.

    Returns:
      The fractions; labellings compared in chunks of at most `MATCH_CELLS` pairs (2048
      replicas × 1,000 distinct labellings would be 4 GB at once).
    """
    steps, replicas = fingerprint.shape
    every, split = kinds if kinds is not None else rules.step_kinds(fingerprint)
    # A step where every replica draws its own stream matches each replica with itself only;
    # one where all draw the same matches every pair.
    equal = np.diag(np.full(replicas, steps - int((every | split).sum()), dtype=np.int64))
    equal += int(every.sum())
    labels = fingerprint[split]
    counts = np.ones(len(labels), dtype=np.int64)
    if len(labels) * replicas * replicas > MATCH_CELLS:  # worth finding the distinct labellings
        labels, counts = distinct_rows(first_equal_replica(labels))
    chunk = max(1, MATCH_CELLS // max(replicas * replicas, 1))
    for count in np.unique(counts):
        group = labels[counts == count]
        for start in range(0, len(group), chunk):
            part = group[start : start + chunk]
            equal += count * (part[:, :, None] == part[:, None, :]).sum(axis=0)
    return equal / steps


def distinct_rows(rows):
    """`(distinct rows, how many times each occurs)` of an int [S, R] array: what
    `np.unique(rows, axis=0, return_counts=True)` gives (in another order), sorting each row's
    bytes as one value (about 30 times faster at 1,000 × 2048)."""
    rows = np.ascontiguousarray(rows)
    as_bytes = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, counts = np.unique(as_bytes, return_index=True, return_counts=True)
    return rows[first], counts


def first_equal_replica(fingerprint):
    """int64 [S, R]: at each step, the first replica whose fingerprint equals replica r's."""
    replicas = fingerprint.shape[1]
    order = np.argsort(fingerprint, axis=1, kind="stable")  # equal values: replica order
    ordered = np.take_along_axis(fingerprint, order, axis=1)
    starts = np.ones(ordered.shape, dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    start_at = np.maximum.accumulate(np.where(starts, np.arange(replicas), 0), axis=1)
    labels = np.empty_like(order)
    np.put_along_axis(labels, order, np.take_along_axis(order, start_at, axis=1), axis=1)
    return labels


def body(run, run_data, parsed):
    """The `/rng` body of a run; a run without rng series answers 200 with no data (the tab
    asks every run)."""
    series = run_data.rng
    if series is None:
        empty = {"run": run, "replicas": [], "steps": [], "logged_steps": 0, "notes": []}
        empty["generators"] = []
        return empty
    return rng_body(series, parsed["max_points"], parsed["matrix_side"])


def report_json(run_data, thresholds):
    """`{"rng": ...}` of a run in the JSON report (the `/rng` body, every step; None if none)."""
    return {"rng": rng_body(run_data.rng) if run_data.rng else None}


def report_text(run_data, thresholds):
    """The random-generator lines of a run in the text report."""
    return _rng_text(run_data.rng)


def _rng_text(series):
    """The rng block of the text report: per generator, which replicas draw the same numbers."""
    if series is None or series.steps.size == 0:
        return []
    lines = [f"  random generators ({series.steps.size} logged steps):"]
    for index, generator in enumerate(series.generators):
        fingerprint = series.fingerprint[:, index]
        identical = int(rules.steps_with_equal_values(fingerprint).sum())
        groups = rules.stream_groups(fingerprint[-1])
        owner = f", layer {generator['layer_class']}" if generator.get("layer_class") else ""
        if not generator.get("mirrored"):
            lines.append(
                f"    {generator['name']} [{generator['kind']}{owner}]: one state shared by "
                "every replica (not mirrored), draws serialised; not compared"
            )
            continue
        lines.append(
            f"    {generator['name']} [{generator['kind']}{owner}]: replicas draw the same "
            f"numbers at {identical}/{series.steps.size} logged steps; last step stream "
            f"groups {groups}"
        )
    return lines
