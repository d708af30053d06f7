"""Multi-worker jobs: which runs are workers of one job, and helpers of the family mergers.

Imports no TensorFlow.
"""

import re

# `<job>/<task_type>_<task_index>`: the run a worker's probe writes (`ReplicaProbe.run_dir`).
WORKER_RUN = re.compile(r"^(?:(?P<job>.+)/)?(?P<task_type>chief|worker)_(?P<task_index>\d+)$")


ROOT_JOB = "."


def job_of_run(run):
    """The job name of a worker's run (`"mw/replicas"` for `"mw/replicas/worker_1"`), else None.

    Whether it is one is confirmed by its data (the worker fields of its shapes events).
    """
    match = WORKER_RUN.match(run)
    if match is None:
        return None
    return match.group("job") or ROOT_JOB


def candidate_jobs(run_names):
    """`{job: [worker runs]}` for runs named like a worker's run, grouped by job name."""
    jobs = {}
    for run in run_names:
        job = job_of_run(run)
        if job is not None:
            jobs.setdefault(job, []).append(run)
    return jobs


def worker_name(worker):
    """`"worker_1"`: the name of a worker from its `InputsSeries.worker` fields."""
    return f"{worker['task_type']}_{worker['task_index']}"


def members_with(family, member_runs, workers, notes, what, how):
    """The workers' series of one family, or None (with a note when only some have it).

    Args:
      family: the `RunData` attribute of the family.
      member_runs: the workers' `RunData`, in worker order.
      workers: the job's per-worker grouping (same order).
      notes: the job's notes list (appended to).
      what, how: what is missing and how to get it, for the note.

    Returns:
      The list of the workers' series, or None when some or all have none.
    """
    series = [getattr(m, family, None) for m in member_runs]
    if all(s is None for s in series):
        return None
    if any(s is None for s in series):
        missing = [w["name"] for w, s in zip(workers, series, strict=True) if s is None]
        notes.append(
            f"Workers {', '.join(missing)} recorded no {what}: the job view has none "
            f"({how}); each worker's own run still shows its own."
        )
        return None
    return series


def common_steps(series, notes, what):
    """Steps every worker logged (sorted list); a note when some logged steps the others did not."""
    steps = sorted(set.intersection(*(set(s.steps.tolist()) for s in series)))
    if any(s.steps.size != len(steps) for s in series):
        notes.append(
            f"{what}: the job view shows the {len(steps)} step(s) every worker logged; some "
            "workers logged steps the others did not."
        )
    return steps
