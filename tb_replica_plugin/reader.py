"""Reads this plugin's series into numpy arrays: one run's, or a job's merged over its workers.

Used by the plugin routes (through `store.RunStore`), by `tb-replica report` and by
`tb_replica_plugin.load` (`read_log_dir`). The read path: a source gives each run's new samples
(`read.sources`: the run's event files read on, or TensorBoard's data provider), a
`group.GroupState` keeps each run or job (a job's families merged one worker at a time,
`Family.merger`), and every registered family's `Family.read` turns samples into its series
(`build_run`, in registry order). The series dataclasses and their parsing and merging live in
the families (`tb_replica_plugin/families/<name>/read.py`). Imports no TensorFlow.
"""

import fnmatch

from tb_replica_plugin import metadata, registry
from tb_replica_plugin.core.jobs import (
    ROOT_JOB,
    WORKER_RUN,
    candidate_jobs,
    job_of_run,
)

__all__ = [
    "ALL_SAMPLES",
    "ROOT_JOB",
    "WORKER_RUN",
    "RunData",
    "build_run",
    "candidate_jobs",
    "group_runs",
    "groups",
    "is_live_tag",
    "job_groups",
    "job_of_run",
    "list_runs",
    "local_provider",
    "readable_tags",
    "run_not_found",
    "tag_matches",
    "with_needs",
    "worker_identity",
]

# More samples than any run writes: read_tensors must return every sample it kept.
ALL_SAMPLES = 10_000_000


def run_not_found(run):
    """The error a read of an unknown run raises: TensorBoard's `errors.NotFoundError` (404).

    Example:
      >>> str(run_not_found("nope"))
      "Not found: no replica data for run 'nope'"
    """
    from tensorboard import errors

    return errors.NotFoundError(f"no replica data for run {run!r}")


class RunData:
    """Every family of one run, as read from its event files or the data provider.

    A plain object: `series` holds each registered family's series by its `Family.attribute`
    (`inputs`, `step_time`, `gradients`, `rng`, `data` for examples, `variables`, ...), None
    when the run has none of its tags (`inputs` is always an `InputsSeries`, with empty arrays
    when the run has no inputs tags). A family's series is also read as an attribute
    (`run_data.inputs` is `run_data.series["inputs"]`, `__getattr__`), so no family is named
    here; an attribute no registered family had when the run was read raises AttributeError.

    A multi-worker job (the runs `<job>/worker_<i>` written by the workers of one
    `MultiWorkerMirroredStrategy` job) is one `RunData` named `<job>`: its families are merged
    over workers on global replica ids (every family's merge), and `workers` groups the replica
    axis by worker. A worker's own run is read by its own name.

    Attributes:
      run: the run (or job) name.
      series: `{attribute: series or None}` of every registered family.
      notes: plain-language problems met while reading (shared by every family).
      workers: for a job, one dict per worker in replica order (see `InputsSeries.workers`);
        empty for a single-worker run.
      worker_runs: for a job, `{run: RunData}` of its workers' runs (their series; of their raw
        samples only those a merge reads, `Family.merge_tags`, are kept).
      samples: raw samples per tag, `{tag: [(step, numpy value), ...]}` sorted by step, of a
        worker's run while its job is merged (the tags a merge reads, `Family.merge_tags`);
        empty otherwise.

    Example:
      >>> data = RunData("run", inputs=series)
      >>> data.inputs is data.series["inputs"], data.gradients
      (True, None)
    """

    run: str
    series: dict
    samples: dict
    notes: list
    workers: list
    worker_runs: dict

    def __init__(self, run, samples=None, notes=None, workers=None, worker_runs=None, **series):
        """Args:
          run, samples, notes, workers, worker_runs: see the class attributes.
          **series: family series by attribute, e.g. `inputs=...`, `data=...`; the registered
            families not given are None.

        Raises:
          TypeError: if a keyword is not the attribute of a registered family.
          ValueError: if a registered family's attribute is one of RunData's own names.
        """
        attributes = [f.attribute for f in registry.families()]
        own = sorted(set(attributes) & _OWN)
        if own:
            raise ValueError(f"family attributes {own} are RunData names")
        unknown = sorted(set(series) - set(attributes))
        if unknown:
            raise TypeError(f"RunData got unknown families {unknown}; registered: {attributes}")
        self.run = run
        self.series = {a: series.get(a) for a in attributes}
        self.samples = {} if samples is None else samples
        self.notes = [] if notes is None else notes
        self.workers = [] if workers is None else workers
        self.worker_runs = {} if worker_runs is None else worker_runs

    def __getattr__(self, name):
        """A family's series by its attribute (only names that are not RunData's own come here).

        Raises:
          AttributeError: if no family with that attribute was registered when it was read.
        """
        series = self.__dict__.get("series")
        if series is None or name.startswith("__") or name not in series:
            raise AttributeError(f"RunData has no family {name!r}")
        return series[name]

    def __repr__(self):
        present = [a for a, s in self.series.items() if s is not None]
        return f"RunData(run={self.run!r}, families={present}, workers={len(self.workers)})"

    @property
    def is_job(self):
        return bool(self.workers)

    def without_worker_runs(self):
        """This run, sharing its series, without `worker_runs` (what the tab's views read).

        Returns:
          `self` when it has no `worker_runs`, else a new `RunData`.
        """
        if not self.worker_runs:
            return self
        return RunData(self.run, self.samples, self.notes, self.workers, None, **self.series)


# RunData's own attributes: a family attribute must not take one of these names.
_OWN = frozenset({"run", "series", "samples", "notes", "workers", "worker_runs", "is_job"})


def list_runs(provider, ctx, experiment_id):
    """Runs with data of this plugin.

    Args:
      provider: a TensorBoard `DataProvider`.
      ctx: the `RequestContext`.
      experiment_id: the experiment id ("" for a local log dir).

    Returns:
      A dict `{run: {tag: TensorTimeSeries}}`, runs sorted by name.
    """
    mapping = provider.list_tensors(
        ctx, experiment_id=experiment_id, plugin_name=metadata.PLUGIN_NAME
    )
    return {run: mapping[run] for run in sorted(mapping)}


def readable_tags(contents, notes):
    """The tags whose metadata this version can read; the others get a note.

    Args:
      contents: `{tag: plugin content bytes}` of a run's tags (their metadata).
      notes: the run's notes (appended to).

    Returns:
      A frozenset of tags: those of a registered family's kind and a schema version this
      version reads.

    Example:
      >>> readable_tags({"inputs/shapes": b'{"kind": "shapes", "version": 1}'}, [])
      frozenset({'inputs/shapes'})
    """
    readable = set()
    for tag, content in contents.items():
        try:
            parsed = metadata.parse_plugin_content(content)
        except metadata.UnsupportedSchemaError as error:
            notes.append(f"Series {tag!r} skipped: {error}")
            continue
        if registry.tag_kind(tag) == parsed.get("kind"):
            readable.add(tag)
    return frozenset(readable)


def is_live_tag(tag):
    """Whether `tag` is written by a live family (`Family.live`: status)."""
    family = registry.family_of_tag(tag)
    return family is not None and family.live


def with_needs(names):
    """The family names `names` and every family they need, transitively (a frozenset).

    Raises:
      KeyError: if a name is not a registered family.
    """
    result = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in result:
            result.add(name)
            todo.extend(registry.family(name).needs)
    return frozenset(result)


def tag_matches(tag, wanted):
    """Whether the written `tag` is one of `wanted` (exact tags and `fnmatch` patterns)."""
    return tag in wanted or any(
        "*" in pattern and fnmatch.fnmatchcase(tag, pattern) for pattern in wanted
    )


def build_run(run, samples, notes=None, families=None):
    """A `RunData` from decoded samples (pure: no data provider needed).

    Args:
      run: the run name.
      samples: `{tag: [(step, numpy value)]}` sorted by step.
      notes: notes met so far (the run's notes list; every family appends to it).
      families: names of the families to build (and those they need), or None for all.

    Returns:
      A `RunData` with the series of those families (None for families without data and for
      families not asked for).
    """
    notes = [] if notes is None else notes
    run_data = RunData(run=run, samples=samples, notes=notes)
    wanted = None if families is None else with_needs(families)
    by_name = {}
    for family in registry.families():
        if wanted is not None and family.name not in wanted:
            continue
        needed = {name: by_name[name] for name in family.needs}
        series = family.read(run, samples, notes, needed)
        by_name[family.name] = series
        run_data.series[family.attribute] = series
    return run_data


def worker_identity(member):
    """`{"worker", "replicas", "devices"}` of a worker's run of a multi-worker job, from the first
    family (registry order) whose series tells it (`Family.worker_of`), else None."""
    for family in registry.families():
        if family.worker_of is not None:
            identity = family.worker_of(member.series.get(family.attribute))
            if identity is not None:
                return identity
    return None


def job_groups(runs):
    """`{job: [worker runs]}` of the runs that may be the workers of a job (`candidate_jobs`)."""
    return {job: members for job, members in candidate_jobs(runs).items() if job not in runs}


def groups(runs):
    """The groups read one by one: runs outside any job, then candidate jobs."""
    jobs = job_groups(runs)
    in_jobs = {name for members in jobs.values() for name in members}
    return [name for name in runs if name not in in_jobs] + list(jobs)


def group_runs(runs, name):
    """The runs whose data the group `name` reads (for their data version)."""
    if name in runs:
        return [name]
    return job_groups(runs).get(name, [])


def local_provider(logdir):
    """A data provider over a log dir that keeps every sample of this plugin.

    Args:
      logdir: the log directory (runs are its sub-directories holding event files).

    Returns:
      `(provider, ctx, experiment_id)` ready for `list_runs`: a
      `read.event_files.EventFilesProvider`, which reads each run's files when it is read
      instead of holding the whole log dir as TensorBoard's multiplexer does.
    """
    from tensorboard import context

    from tb_replica_plugin.read.event_files import EventFilesProvider

    return EventFilesProvider(logdir), context.RequestContext(), ""
