"""Findings of the examples family (RunData attribute `data`):

- `duplicate_examples` (warning): replicas were fed the same examples at the same step, for more
  than `Thresholds.max_duplicate_share` of their examples (an input pipeline that is not sharded).

Pure Python and numpy.
"""

import numpy as np

from tb_replica_plugin.analysis import (
    Finding,
    Thresholds,
    replica_list_text,
)

FINDING_KINDS = {
    "duplicate_examples": {
        "severity": "warning",
        "thresholds": ("max_duplicate_share",),
        "summary": (
            "Replicas were fed the same examples at the same step (an input pipeline that is not "
            "sharded)."
        ),
    },
}


def data_pair_shares(series):
    """Per pair of replicas, over the whole run: shared examples / the smaller replica's count.

    Returns:
      `(share [R, R] float, steps_shared [R, R] int)`: the share of examples fed to both
      replicas at the same step (relative to the replica with fewer distinct examples), and the
      number of steps where they shared any. Diagonals: 1.0 and the number of steps.
    """
    shared = series.window_shared.sum(axis=0).astype(np.float64)
    distinct = np.diagonal(shared).copy()
    smaller = np.minimum(distinct[:, None], distinct[None, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(smaller > 0, shared / np.where(smaller > 0, smaller, 1), 0.0)
    return share, series.steps_shared.sum(axis=0)


def find_data(series, thresholds=Thresholds()):
    """Findings of the data family for one run.

    Replica pairs whose shared share exceeds `thresholds.max_duplicate_share` are grouped into
    connected sets; one `duplicate_examples` finding per set.

    Args:
      series: a `read.DataSeries`.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding`.

    Example:
      >>> [f.replicas for f in find_data(series)]   # unsharded pipeline, 4 replicas
      [[0, 1, 2, 3]]
    """
    num = series.num_replicas
    if series.steps.size == 0 or num < 2:
        return []
    share, steps_shared = data_pair_shares(series)
    groups = _duplicate_groups(share, num, thresholds.max_duplicate_share)
    return [_duplicate_finding(series, share, steps_shared, pairs, thresholds) for pairs in groups]


def _root(parent, r):
    """The root of replica position `r` in the union-find forest `parent`."""
    while parent[r] != r:
        r = parent[r]
    return r


def _duplicate_groups(share, num, max_share):
    """The pairs of replicas that shared more than `max_share`, in connected sets.

    Args:
      share: `data_pair_shares`'s `[R, R]` shares; num: the number of replicas.
      max_share: the share a pair must exceed.

    Returns:
      One list of `(r, q)` position pairs (r < q) per connected set, by the set's root.
    """
    parent = list(range(num))
    flagged = []
    for r in range(num):
        for q in range(r + 1, num):
            if share[r, q] > max_share:
                flagged.append((r, q))
                parent[_root(parent, q)] = _root(parent, r)
    roots = sorted({_root(parent, r) for pair in flagged for r in pair})
    return [[(r, q) for r, q in flagged if _root(parent, r) == root] for root in roots]


# The end of a `duplicate_examples` message: what to change.
SHARDING_ADVICE = (
    ": the input pipeline is not sharded, so the effective batch is "
    "smaller than it looks. In distribute_datasets_from_function, use the "
    "input_context: dataset.shard(input_context.num_input_pipelines, "
    "input_context.input_pipeline_id) and "
    "input_context.get_per_replica_batch_size(global_batch)."
)


def _duplicate_finding(series, share, steps_shared, pairs, thresholds):
    """The `duplicate_examples` finding of one connected set of replicas.

    Args:
      series: the run's `read.DataSeries`.
      share, steps_shared: `data_pair_shares(series)`.
      pairs: the set's `(r, q)` position pairs (`_duplicate_groups`).
      thresholds: the `Thresholds` applied.

    Returns:
      A `Finding`.
    """
    members = sorted({r for pair in pairs for r in pair})
    with_shared = np.zeros(series.steps.size, bool)
    for r, q in pairs:
        with_shared |= series.steps_shared[:, r, q] > 0
    logged = np.flatnonzero(with_shared)
    starts = series.window_starts()
    count = int(max(steps_shared[r, q] for r, q in pairs))
    distinct = series.window_shared.sum(axis=0).diagonal()[members].sum()
    duplicated = series.window_duplicated.sum(axis=0)[members].sum()
    value = float(duplicated / distinct) if distinct else 0.0
    return Finding(
        kind="duplicate_examples",
        severity="warning",
        run=series.run,
        first_step=int(starts[logged[0]]),
        last_step=int(series.steps[logged[-1]]),
        count=count,
        replicas=[series.replicas[r] for r in members],
        name=None,
        value=round(value, 6),
        threshold=thresholds.max_duplicate_share,
        message=_duplicate_head(series, share, pairs, members, count, value) + SHARDING_ADVICE,
        view="data",
    )


def _duplicate_head(series, share, pairs, members, count, value):
    """The first part of a `duplicate_examples` message: which replicas, how often, how much.

    Args:
      series: the run's `read.DataSeries`; share: `data_pair_shares`'s shares.
      pairs, members: the set's position pairs and positions.
      count: the most steps a pair of them shared examples at.
      value: the share of their examples also on another replica.

    Returns:
      The text (the caller adds the advice).
    """
    ids = [series.replicas[r] for r in members]
    total_steps = int(series.window_steps.sum())
    # With examples_every > 1 only sampled steps were compared: say so.
    kind = "sampled steps" if series.sampled else "steps"
    complete = len(pairs) == len(members) * (len(members) - 1) // 2 and all(
        share[r, q] >= 0.999 for r, q in pairs
    )
    when = f"at {count} of {total_steps} {kind}" if count < total_steps else f"at every {kind[:-1]}"
    if complete:
        return (
            f"Replicas {replica_list_text(ids)} were fed the same examples at the same step "
            f"({when}; {value:.0%} of their examples are also on another replica)"
        )
    detail = ", ".join(
        f"{series.replicas[r]}–{series.replicas[q]}: {share[r, q]:.0%}" for r, q in pairs
    )
    return (
        f"Replicas {replica_list_text(ids)} shared examples at the same step ({when}; "
        f"shared share per pair {detail})"
    )


# Under ParameterServerStrategy (replica r is worker r): what to change instead.
PSS_ADVICE = (
    ": under ParameterServerStrategy each worker runs its own input pipeline, so each step's "
    "update is applied once per worker with the same examples. Shard every worker's pipeline in "
    "dataset_fn by its worker, e.g. dataset.shard(NUM_WORKERS, "
    "tf.distribute.coordinator.experimental_get_current_worker_index()) (input_pipeline_id is "
    "a Python 0 when the function is traced), or shuffle with a seed per worker."
)


def find(run_data, thresholds=Thresholds()):
    """Findings of the examples family of a `reader.RunData` (none without its series)."""
    if run_data.data is None:
        return []
    findings = find_data(run_data.data, thresholds)
    inputs = run_data.inputs
    if inputs is None or inputs.strategy != "ParameterServerStrategy":
        return findings
    for finding in findings:  # the workers' words (replica r is worker r)
        head = finding.message[: -len(SHARDING_ADVICE)]
        head = "Workers" + head[len("Replicas") :].replace("another replica", "another worker")
        finding.message = head + PSS_ADVICE
    return findings
