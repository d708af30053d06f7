"""Reads this plugin's series through a TensorBoard data provider into numpy arrays.

Used by the plugin routes (TensorBoard's provider: Python loader or RustBoard), by
`tb-replica report` and by `tb_replica_plugin.load` (a local provider over a log dir that keeps
every sample). The core read path only: one `read_tensors` call per run, then every registered
family's `Family.read` in registry (dependency) order; a multi-worker job is merged by every
family's `Family.merge`. The series dataclasses and their parsing live in the families
(`tb_replica_plugin/families/<name>/read.py`). Imports no TensorFlow.
"""

import fnmatch
import functools

import numpy as np

from tb_replica_plugin import metadata, registry
from tb_replica_plugin.core.jobs import (
    ROOT_JOB,
    WORKER_RUN,
    candidate_jobs,
    job_of_run,
    worker_name,
)

__all__ = [
    "ALL_SAMPLES",
    "ROOT_JOB",
    "WORKER_RUN",
    "RunData",
    "run_not_found",
    "candidate_jobs",
    "family_tags",
    "group_runs",
    "groups",
    "job_of_run",
    "list_runs",
    "local_provider",
    "merge_job",
    "read_inputs",
    "read_log_dir",
    "read_run",
    "read_group",
    "read_member",
    "list_and_read",
    "read_members_in_turn",
    "read_runs",
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
    when the run has no inputs tags). Each attribute is also a property of the class, generated
    from the registry (`run_data.inputs` is `run_data.series["inputs"]`), so no family is named
    here.

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

    def __init__(self, run, samples=None, notes=None, workers=None, worker_runs=None, **series):
        """Args:
          run, samples, notes, workers, worker_runs: see the class attributes.
          **series: family series by attribute, e.g. `inputs=...`, `data=...`; the registered
            families not given are None.

        Raises:
          TypeError: if a keyword is not the attribute of a registered family.
        """
        attributes = _series_properties()
        unknown = sorted(set(series) - set(attributes))
        if unknown:
            raise TypeError(f"RunData got unknown families {unknown}; registered: {attributes}")
        self.run = run
        self.series = {a: series.get(a) for a in attributes}
        self.samples = {} if samples is None else samples
        self.notes = [] if notes is None else notes
        self.workers = [] if workers is None else workers
        self.worker_runs = {} if worker_runs is None else worker_runs

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
_installed = set()  # family attributes with a property on RunData


def _series_property(attribute):
    def get(run_data):
        if attribute not in run_data.series:  # a family no longer registered
            raise AttributeError(f"RunData has no family {attribute!r}")
        return run_data.series[attribute]

    def put(run_data, value):
        run_data.series[attribute] = value

    return property(get, put, doc=f"`series[{attribute!r}]`: that family's series, or None.")


def _series_properties():
    """The registered families' attributes, each given its property on `RunData` (once).

    Raises:
      ValueError: if a family's attribute is one of RunData's own names.
    """
    attributes = [f.attribute for f in registry.families()]
    for attribute in attributes:
        if attribute not in _installed:
            if attribute in _OWN:
                raise ValueError(f"family attribute {attribute!r} is a RunData name")
            setattr(RunData, attribute, _series_property(attribute))
            _installed.add(attribute)
    return attributes


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


def _readable_tags(tags_of_run, notes):
    """Tags whose metadata this version can read; the others get a note."""
    readable = []
    for tag, series in tags_of_run.items():
        try:
            content = metadata.parse_plugin_content(series.plugin_content)
        except metadata.UnsupportedSchemaError as error:
            notes.append(f"Series {tag!r} skipped: {error}")
            continue
        if registry.tag_kind(tag) == content.get("kind"):
            readable.append(tag)
    return readable


def read_run(
    provider, ctx, experiment_id, run, tags_of_run=None, families=None, downsample=ALL_SAMPLES
):
    """Reads the families of one run with a single `read_tensors` call.

    Families are built in registry order; each gets the series of the families it `needs`.
    Only the tags of `families` are asked of the provider (`RunTagFilter`).

    Args:
      provider: a TensorBoard `DataProvider`.
      ctx: the `RequestContext`.
      experiment_id: the experiment id.
      run: the run name.
      tags_of_run: `{tag: TensorTimeSeries}` of the run if already listed.
      families: names of the families to read (`with_needs` adds what they need), or None for
        every registered family; the others are None in the `RunData`.
      downsample: at most this many samples per tag (`ALL_SAMPLES`: every sample kept).

    Returns:
      A `RunData`.

    Example:
      >>> read_run(provider, ctx, "", "balanced/replicas", families=["variables"]).inputs
      None

    Raises:
      errors.NotFoundError: if the run has no data of this plugin.
    """
    from tensorboard.data import provider as provider_lib

    if tags_of_run is None:
        tags_of_run = list_runs(provider, ctx, experiment_id).get(run)
    if not tags_of_run:
        raise run_not_found(run)
    notes = []
    wanted = None if families is None else family_tags(families)
    if wanted is not None:
        tags_of_run = {tag: ts for tag, ts in tags_of_run.items() if _matches(tag, wanted)}
    readable = _readable_tags(tags_of_run, notes)
    data = {}
    if readable:
        data = provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=metadata.PLUGIN_NAME,
            downsample=downsample,
            run_tag_filter=provider_lib.RunTagFilter(runs=[run], tags=readable),
        ).get(run, {})
    samples = {
        tag: sorted(
            ((int(d.step), np.asarray(d.numpy)) for d in data.get(tag, [])), key=lambda p: p[0]
        )
        for tag in readable
    }
    return build_run(run, samples, notes, families)


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


def family_tags(names):
    """The tags of the families `names` and of the families they need (a set).

    A family whose tags depend on what was written (watch: `watch/<name>/stats`) gives a tag
    pattern (`watch/*/stats`); `_matches` tells whether a written tag is among them.
    """
    needed = with_needs(names)
    return {tag for f in registry.families() if f.name in needed for tag in f.tags}


def _matches(tag, wanted):
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


def read_inputs(provider, ctx, experiment_id, run, tags_of_run=None):
    """Reads the inputs family of one run (`read_run(...).inputs`).

    Raises:
      errors.NotFoundError: if the run has no data of this plugin.
    """
    return read_run(provider, ctx, experiment_id, run, tags_of_run).inputs


def worker_identity(member):
    """`{"worker", "replicas", "devices"}` of a worker's run of a multi-worker job, from the first
    family (registry order) whose series tells it (`Family.worker_of`), else None."""
    for family in registry.families():
        if family.worker_of is not None:
            identity = family.worker_of(member.series.get(family.attribute))
            if identity is not None:
                return identity
    return None


def merge_job(job, member_runs, families=None):
    """One `RunData` for the runs of the workers of one job (see `RunData`).

    Args:
      job: the job name.
      member_runs: the `RunData` of its workers' runs, each a worker (`worker_identity`).
      families: names of the families to merge (they and their needs must have been read), or
        None for every registered family.

    Returns:
      The job's `RunData`, replica axis in global replica order: each family merged by its
      `Family.merge`, in registry order (families not asked for are None).
    """
    identities = {id(m): worker_identity(m) for m in member_runs}
    members = sorted(member_runs, key=lambda m: (identities[id(m)]["worker"]["worker"], m.run))
    infos = [identities[id(m)]["worker"] for m in members]
    notes = []
    workers = []
    for member, info in zip(members, infos, strict=True):
        identity = identities[id(member)]
        workers.append(
            {
                "run": member.run,
                "name": worker_name(info),
                "task_type": info["task_type"],
                "task_index": info["task_index"],
                "worker": info["worker"],
                "replicas": list(identity["replicas"]),
                "devices": list(identity["devices"]),
            }
        )
        notes.extend(f"{worker_name(info)}: {note}" for note in member.notes)
    expected = max(info["num_workers"] for info in infos)
    if len(members) < expected:
        seen = {info["worker"] for info in infos}
        missing = sorted(set(range(expected)) - seen)
        notes.append(
            f"Only {len(members)} of the job's {expected} workers wrote data (workers "
            f"{missing} are missing): give every worker the same log dir or copy their runs in."
        )
    if len({info["job"] for info in infos}) > 1:
        notes.append(
            "These worker runs come from jobs with different cluster specs (the log dir was "
            "reused); write each job to its own log dir."
        )
    data = RunData(
        run=job, samples={}, notes=notes, workers=workers, worker_runs={m.run: m for m in members}
    )
    wanted = None if families is None else with_needs(families)
    for family in registry.families():
        if wanted is None or family.name in wanted:
            merged = family.merge(job, members, workers, notes) if family.merge else None
            data.series[family.attribute] = merged
    return data


def read_runs(
    provider,
    ctx,
    experiment_id,
    run=None,
    runs=None,
    families=None,
    downsample=ALL_SAMPLES,
    read_members=None,
    keep=None,
    read_alone=None,
):
    """Reads runs and multi-worker jobs: `{name: RunData}`, the workers of a job as one entry.

    Runs named `<job>/<task_type>_<index>` whose data says they are workers of one job are read
    and merged into one `RunData` named `<job>` (they are not listed on their own).

    Args:
      provider, ctx, experiment_id, families, downsample: as for `read_run`.
      run: a run or job name to read alone (a worker's own run can be read by its name too).
      runs: `list_runs(...)` if already listed.
      read_members: reads the runs of a candidate job, as `read_members_in_turn` does (which is
        the default); `read_log_dir` passes one that reads them in parallel processes.
      keep: without `run`, reads only the runs and jobs for which `keep(name, runs_of_name)`
        is true (`runs_of_name`: `group_runs(runs, name)`); default: all.
      read_alone: without `run`, reads the runs outside jobs, all at once before the jobs (a
        function like `read_members`, reading each with `read_run`); default: each in turn.

    Returns:
      `{name: RunData}` sorted by name.

    Raises:
      errors.NotFoundError: if `run` is neither a run nor a job with data of this plugin.
    """
    if runs is None:
        runs = list_runs(provider, ctx, experiment_id)
    jobs = job_groups(runs)
    read = functools.partial(
        read_group,
        provider,
        ctx,
        experiment_id,
        runs=runs,
        families=families,
        downsample=downsample,
        read_members=read_members,
    )
    if run is not None:
        if run in runs:
            return read(run)
        if run in jobs:
            result = read(run)
            if run in result:
                return result
        raise run_not_found(run)
    names = [
        name
        for name in groups(runs)
        if keep is None or keep(name, [name] if name in runs else jobs[name])
    ]
    result = {}
    if read_alone is not None:
        alone = {name: runs[name] for name in names if name in runs}
        read_data = read_alone(provider, ctx, experiment_id, alone, families, downsample)
        result.update(zip(alone, read_data, strict=True))
    for name in names:
        if name not in result:
            result.update(read(name))
    return {name: result[name] for name in sorted(result)}


def job_groups(runs):
    """`{job: [worker runs]}` of the runs that may be the workers of a job (`candidate_jobs`)."""
    return {job: members for job, members in candidate_jobs(runs).items() if job not in runs}


def groups(runs):
    """The names read one by one by `read_group`: runs outside any job, then candidate jobs."""
    jobs = job_groups(runs)
    in_jobs = {name for members in jobs.values() for name in members}
    return [name for name in runs if name not in in_jobs] + list(jobs)


def group_runs(runs, name):
    """The runs whose data `read_group(..., name, ...)` reads (for their data version)."""
    if name in runs:
        return [name]
    return job_groups(runs).get(name, [])


def read_group(
    provider,
    ctx,
    experiment_id,
    name,
    runs,
    families=None,
    downsample=ALL_SAMPLES,
    read_members=None,
):
    """Reads one run, or the worker runs of one candidate job (merged when they are workers).

    Args:
      provider, ctx, experiment_id, families, downsample: as for `read_run`.
      name: a run of `runs`, or a job of `job_groups(runs)`.
      runs: `list_runs(...)`.
      read_members: as for `read_runs` (default: `read_members_in_turn`).

    Returns:
      `{name: RunData}`: the run, the merged job, or (workers of no job) each worker run.

    Raises:
      errors.NotFoundError: if `name` is neither.
    """
    if name in runs:
        return {
            name: read_run(provider, ctx, experiment_id, name, runs[name], families, downsample)
        }
    members_of = job_groups(runs).get(name)
    if not members_of:
        raise run_not_found(name)
    # Whether they are the workers of one job comes from a family that can tell (`worker_of`):
    # the inputs family (shapes events) unless one of those asked for can.
    read_families = None if families is None else with_needs(families)
    if read_families is not None and not any(
        registry.family(name).worker_of for name in read_families
    ):
        read_families = with_needs([*families, "inputs"])
    member_tags = {member_run: runs[member_run] for member_run in members_of}
    members = (read_members or read_members_in_turn)(
        provider, ctx, experiment_id, member_tags, read_families, downsample
    )
    if all(worker_identity(m) is not None for m in members):
        return {name: merge_job(name, members, read_families)}
    return {m.run: m for m in members}


def read_members_in_turn(provider, ctx, experiment_id, member_tags, families, downsample):
    """The `RunData` of a candidate job's runs (`read_member` of each, one after another).

    Args:
      provider, ctx, experiment_id, families, downsample: as for `read_run`.
      member_tags: `{run: {tag: TensorTimeSeries}}` of the runs, in order.

    Returns:
      Their `RunData`, in the same order.
    """
    return [
        read_member(provider, ctx, experiment_id, run, tags, families, downsample)
        for run, tags in member_tags.items()
    ]


def read_member(provider, ctx, experiment_id, run, tags_of_run, families, downsample):
    """`read_run` of a candidate job's run; a worker's keeps only the samples a merge reads.

    Its series are built by then: the rest of its samples would only take memory until the
    merge (about 5 GB for a job of 256 workers).
    """
    member = read_run(provider, ctx, experiment_id, run, tags_of_run, families, downsample)
    if worker_identity(member) is not None:
        merge_tags = {tag for family in registry.families() for tag in family.merge_tags}
        member.samples = {tag: v for tag, v in member.samples.items() if tag in merge_tags}
    return member


def local_provider(logdir):
    """A data provider over a log dir that keeps every sample of this plugin.

    Args:
      logdir: the log directory (runs are its sub-directories holding event files).

    Returns:
      `(provider, ctx, experiment_id)` ready for `list_runs` / `read_run`: a
      `core.event_files.EventFilesProvider`, which reads each run's files when it is read
      instead of holding the whole log dir as TensorBoard's multiplexer does.
    """
    from tensorboard import context

    from tb_replica_plugin.core.event_files import EventFilesProvider

    return EventFilesProvider(logdir), context.RequestContext(), ""


def read_log_dir(logdir, run_pattern=None, processes=1):
    """Reads every run of this plugin under a log dir, keeping every sample.

    Each run's event files are read once (`list_and_read`: the listing and the samples in one
    pass), then the workers of each multi-worker job are merged here.

    Args:
      logdir: the log directory.
      run_pattern: optional shell-style pattern (`fnmatch`) the run names must match: only
        the runs and jobs that match (or one of whose runs matches) are read.
      processes: how many processes read the event files: with more than 1, a pool of new
        processes (`core.processes.reading_pool`) reads the runs in parallel and this process
        merges the jobs. From a script, call it under `if __name__ == "__main__":` then (the
        new processes import the main module).

    Returns:
      A dict `{run: RunData}` sorted by run name; the workers of a multi-worker job are one
      entry named after the job (see `read_runs`).

    Example:
      >>> runs = read_log_dir("logs", processes=2)
      >>> runs["job"].inputs.batch_size.shape  # [steps, replicas of every worker]
      (1000, 2048)
    """
    provider, ctx, experiment_id = local_provider(logdir)
    names = provider.run_names()
    jobs = candidate_jobs(names)

    def matches(name, runs_of_name):  # a job is read when its name or one of its runs matches
        return any(fnmatch.fnmatchcase(n, run_pattern) for n in (name, *runs_of_name))

    def may_be_read(name):  # by `matches`, whichever runs turn out to have data
        job = job_of_run(name)
        return matches(name, []) or (job is not None and matches(job, jobs.get(job, [])))

    wanted = [name for name in names if run_pattern is None or may_be_read(name)]
    # A run named like a job's worker is read as one (`read_member`) unless the job is a run.
    as_member = [job_of_run(name) not in (None, *names) for name in wanted]
    views = [provider.for_run_read_once(name, metadata.PLUGIN_NAME) for name in wanted]
    count = len(wanted)
    arguments = (views, [ctx] * count, [experiment_id] * count, wanted, as_member)
    if processes > 1 and count > 1:
        from tb_replica_plugin.core.processes import reading_pool

        with reading_pool(min(processes, count)) as pool:
            listed_and_read = list(pool.map(list_and_read, *arguments))
    else:
        from tb_replica_plugin.core.processes import use_deferred_event_reader

        use_deferred_event_reader()
        listed_and_read = list(map(list_and_read, *arguments))
    runs = {name: tags for name, (tags, _) in zip(wanted, listed_and_read, strict=True) if tags}
    read = {name: data for name, (_, data) in zip(wanted, listed_and_read, strict=True)}

    def already_read(provider, ctx, experiment_id, member_tags, families, downsample):
        return [read[name] for name in member_tags]

    keep = None if run_pattern is None else matches
    runs = read_runs(
        provider,
        ctx,
        experiment_id,
        runs={name: runs[name] for name in sorted(runs)},
        read_members=already_read,
        keep=keep,
        read_alone=already_read,
    )
    return {
        name: data
        for name, data in runs.items()
        if run_pattern is None or fnmatch.fnmatchcase(name, run_pattern)
    }


def list_and_read(provider, ctx, experiment_id, run, as_member):
    """`(tags, RunData)` of a run: its listing (as `list_runs` gives it) and its data, read as
    `read_member` (`as_member`) or `read_run` does; `({}, None)` for a run without this plugin's
    data. With a provider of `EventFilesProvider.for_run_read_once`, the files are read once."""
    tags = list_runs(provider, ctx, experiment_id).get(run)
    if not tags:
        return {}, None
    read = read_member if as_member else read_run
    return tags, read(provider, ctx, experiment_id, run, tags, None, ALL_SAMPLES)
