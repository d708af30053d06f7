"""Findings of the rng family:

- `identical_rng_streams` (warning): two or more replicas draw the same random numbers from one
  generator with a mirrored state (equal stream fingerprints) at
  `Thresholds.min_identical_rng_steps` logged steps or more, e.g. Keras 3 Dropout under
  MirroredStrategy. Generators with one unmirrored state are skipped: replicas share it and their
  draws are serialised.
- `rng_desync` (warning): a generator whose state is one mirrored variable holds a different state
  on some replicas (the replicas advanced it differently).

Pure Python and numpy.
"""

import collections

import numpy as np

from tb_replica_plugin.analysis import (
    Finding,
    Thresholds,
    fmt_steps,
    names_text,
    replica_list_text,
    sort_findings,
)

FINDING_KINDS = {
    "identical_rng_streams": {
        "severity": "warning",
        "thresholds": ("min_identical_rng_steps",),
        "summary": (
            "Replicas draw the same random numbers from one generator with a mirrored state."
        ),
    },
    "rng_desync": {
        "severity": "warning",
        "thresholds": (),
        "summary": (
            "A generator whose state is one mirrored variable holds a different state on some "
            "replicas."
        ),
    },
}


_CAUSE_TEXT = {
    "dropout": (
        "Keras 3 Dropout draws its mask statelessly from a SeedGenerator whose state is one "
        "mirrored variable, so every replica applies the same mask to its examples. If the "
        "noise should be independent per replica, draw the mask from a tf.random.Generator "
        "created under strategy.scope() (one stream per replica) or fold the replica id "
        "into the seed (tf.random.experimental.stateless_fold_in)."
    ),
    "seed_generator": (
        "a Keras SeedGenerator draws statelessly from its (mirrored) state, so every "
        "replica gets the same numbers; fold the replica id into the seed "
        "(tf.random.experimental.stateless_fold_in) if they should differ."
    ),
    "unscoped_generator": (
        "create the tf.random.Generator under strategy.scope() (TensorFlow then folds the "
        "replica id into its key) instead of giving each replica an identically seeded copy."
    ),
}


def group_message(kind, cause, items):
    """The message of a group of findings of one kind and cause (see `analysis.group_findings`).

    Args:
      kind: the findings' kind.
      cause: their `cause`.
      items: the findings (at least 2).

    Returns:
      One message naming how many and which, with the cause and the fix.
    """
    who = replica_list_text(sorted({r for f in items for r in f.replicas}))
    steps = sorted({f.first_step for f in items})
    if kind == "rng_desync":
        return (
            f"{len(items)} generators ({names_text([f.name for f in items])}) desynchronised on "
            f"replicas {who} from {fmt_steps(steps[:1])}: " + items[0].message.split(": ", 1)[-1]
        )
    if cause == "dropout":  # a layer's only generator is named after the layer
        head = f"Replicas {who} draw identical dropout masks in {len(items)} Dropout layers"
    else:
        head = f"Replicas {who} draw identical random numbers from {len(items)} generators"
    names = names_text([f.name for f in items])
    return f"{head} ({names}), from {fmt_steps(steps[:1])}: {_CAUSE_TEXT[cause]}"


def stream_groups(values):
    """Group id per replica: the index of the first replica holding an equal value.

    Args:
      values: array [R] (or [R, W]: rows are compared).

    Returns:
      A list of R ints; replicas with equal values share the id. E.g. `[0, 0, 2, 0]`.
    """
    values = np.asarray(values)
    if values.shape[0] == 0:
        return []
    # One sort of the rows, not a comparison of every pair (2,048 replicas in a large job).
    _, first, inverse = np.unique(
        values.reshape(values.shape[0], -1), axis=0, return_index=True, return_inverse=True
    )
    return first[inverse.reshape(-1)].tolist()


def steps_alike(values):
    """bool [S]: the steps at which every replica holds the same value (two replicas or more).

    Args:
      values: int64 [S, R].
    """
    if values.shape[1] < 2:
        return np.zeros(values.shape[0], dtype=bool)
    return (values == values[:, :1]).all(axis=1)


def step_kinds(values):
    """`(alike, split)`, bool [S] each: the steps at which every replica holds the same value
    (`steps_alike`), and those at which some replicas do and others not.

    Args:
      values: int64 [S, R].

    Example:
      >>> [a.tolist() for a in step_kinds(np.array([[5, 5, 5], [5, 6, 5], [1, 2, 3]]))]
      [[True, False, False], [False, True, False]]
    """
    alike = steps_alike(values)
    split = np.zeros_like(alike)
    others = np.flatnonzero(~alike) if values.shape[1] > 1 else []
    if len(others):
        ordered = np.sort(values[others], axis=1)  # one sort per step
        split[others] = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
    return alike, split


def steps_with_equal_values(values):
    """bool [S]: whether two replicas hold equal values at each step.

    Args:
      values: int64 [S, R].
    """
    alike, split = step_kinds(values)
    return alike | split


def shared_values(values):
    """bool [S, R]: at each step, whether replica r's value equals another replica's.

    Args:
      values: int64 [S, R], e.g. one generator's stream fingerprints.

    Example:
      >>> shared_values(np.array([[5, 6, 5], [1, 2, 3]])).tolist()
      [[True, False, True], [False, False, False]]
    """
    shared = np.zeros(values.shape, dtype=bool)
    alike, split = step_kinds(values)
    shared[alike] = True
    # Only the steps where some but not all replicas share a value (rare) are looked at replica
    # by replica.
    for s in np.flatnonzero(split):
        _, inverse, counts = np.unique(values[s], return_inverse=True, return_counts=True)
        shared[s] = counts[inverse.reshape(-1)] > 1
    return shared


def _rng_identical(series, index, generator, thresholds):
    if not generator.get("mirrored"):
        # One unmirrored state shared by every replica (a generator created outside
        # strategy.scope()): TensorFlow serialises the replicas' draws, which take successive
        # parts of one stream, so equal fingerprints of the state before the step mean nothing.
        return None
    shared = shared_values(series.fingerprint[:, index])
    steps = series.steps[shared.any(axis=1)].astype(int).tolist()
    replicas = {series.replicas[r] for r in np.flatnonzero(shared.any(axis=0))}
    if not steps or len(steps) < thresholds.min_identical_rng_steps:
        return None
    who = replica_list_text(replicas)
    total = int(series.steps.size)
    when = f"at all {total} logged steps" if len(steps) == total else f"at {fmt_steps(steps)}"
    name = generator["name"]
    layer_class = generator.get("layer_class") or ""
    if generator["kind"] == "keras.SeedGenerator" and "Dropout" in layer_class:
        key = "dropout"
        head = f"Replicas {who} draw identical dropout masks in layer `{generator['layer']}`"
    elif generator["kind"] == "keras.SeedGenerator":
        key = "seed_generator"
        owner = f"layer `{generator['layer']}`" if generator.get("layer") else f"`{name}`"
        head = f"Replicas {who} draw identical random numbers from the SeedGenerator of {owner}"
    else:
        key = "unscoped_generator"
        head = f"Replicas {who} draw identical random numbers from generator `{name}`"
    return Finding(
        kind="identical_rng_streams",
        severity="warning",
        run=series.run,
        first_step=steps[0],
        last_step=steps[-1],
        count=len(steps),
        replicas=sorted(replicas),
        name=name,
        value=round(len(steps) / total, 6),
        threshold=thresholds.min_identical_rng_steps,
        message=f"{head} ({when}): {_CAUSE_TEXT[key]}",
        view="rng",
        cause=key,
    )


def _rng_desync(series, index, generator):
    if not generator.get("mirrored"):
        return None
    steps, odd = [], set()
    states = series.state[:, index]
    # Only the steps where some replica's state differs from replica 0's are grouped.
    for s in np.flatnonzero((states != states[:, :1]).any(axis=(1, 2))):
        groups = stream_groups(states[s])
        majority = collections.Counter(groups).most_common(1)[0][0]
        differ = [series.replicas[r] for r, g in enumerate(groups) if g != majority]
        if differ:
            steps.append(int(series.steps[s]))
            odd.update(differ)
    if not steps:
        return None
    plural = "s" if len(odd) > 1 else ""
    return Finding(
        kind="rng_desync",
        severity="warning",
        run=series.run,
        first_step=steps[0],
        last_step=steps[-1],
        count=len(steps),
        replicas=sorted(odd),
        name=generator["name"],
        value=len(steps),
        threshold=None,
        message=(
            f"Generator `{generator['name']}` desynchronised on replica{plural} "
            f"{replica_list_text(odd)} from {fmt_steps(steps[:1])} ({len(steps)} logged "
            "step(s)): its state is one mirrored variable, yet it differs from the other "
            "replicas', so some replicas drew more numbers (a draw inside a replica-dependent "
            "tf.cond or a data-dependent loop). Checkpoints save one replica's state, so the "
            "run cannot be resumed exactly; draw the same amount on every replica."
        ),
        view="rng",
        cause="desync",
    )


def find_rng(series, thresholds=Thresholds()):
    """Findings of the rng family for one run.

    Args:
      series: a `read.RngSeries`.
      thresholds: the `Thresholds` to apply.

    Returns:
      A list of `Finding`, most severe first.

    Example:
      >>> [f.message[:44] for f in find_rng(series)]   # Keras Dropout, 4 replicas
      ['Replicas 0–3 draw identical dropout masks i']
    """
    findings = []
    for index, generator in enumerate(series.generators):
        for finding in (
            _rng_identical(series, index, generator, thresholds),
            _rng_desync(series, index, generator),
        ):
            if finding is not None:
                findings.append(finding)
    return sort_findings(findings)


def find(run_data, thresholds=Thresholds()):
    """Findings of the rng family of a `reader.RunData` (none without rng series)."""
    if run_data.rng is None:
        return []
    return find_rng(run_data.rng, thresholds)
