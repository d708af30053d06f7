"""The toy family read side: `ToySeries` from the samples."""

import dataclasses

import numpy as np

from toy_family import schema


@dataclasses.dataclass
class ToySeries:
    """Counts per logged step and replica.

    Attributes:
      run: the run name.
      replicas: replica ids (the inputs family's when it has as many, else 0..R-1).
      steps: int64 [S]; counts: int64 [S, R].
    """

    run: str
    replicas: list
    steps: np.ndarray
    counts: np.ndarray


def from_samples(run, samples, notes, needed):
    """The run's `ToySeries`, or None without toy samples (`needed`: `{"inputs": ...}`)."""
    points = [(s, v) for s, v in samples.get(schema.TAG_TOY_COUNTS, []) if np.ndim(v) == 1]
    if not points:
        return None
    counts = np.stack([v for _, v in points]).astype(np.int64)
    replicas = needed["inputs"].replicas
    if len(replicas) != counts.shape[1]:
        replicas = list(range(counts.shape[1]))
    steps = np.array([s for s, _ in points], np.int64)
    return ToySeries(run=run, replicas=replicas, steps=steps, counts=counts)


def merge(job, member_runs, workers, notes):
    """A job's counts: every worker's at the steps all of them logged, on the global replica
    axis in worker order (`member_runs`: the workers' `RunData`; `workers`: the job's worker
    dicts with their global replica ids, from the job's identity, which a worker that observed
    no inputs has too), or None when some worker has no toy series (noted)."""
    series = [member.toy for member in member_runs]
    if not series or any(s is None for s in series):
        if any(s is not None for s in series):
            notes.append("Some worker recorded no toy counts: the job has none.")
        return None
    steps = series[0].steps
    for other in series[1:]:
        steps = np.intersect1d(steps, other.steps)
    counts = np.concatenate([s.counts[np.searchsorted(s.steps, steps)] for s in series], axis=1)
    replicas = [replica for worker in workers for replica in worker["replicas"]]
    return ToySeries(run=job, replicas=replicas, steps=steps, counts=counts)
