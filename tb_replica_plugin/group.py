"""A run, or the worker runs of one job, read incrementally: `GroupState`.

The one read path of the plugin's routes, of `tb-replica report` and of `load`: a state per
*group* (a run, or the runs `<job>/worker_<i>` of one job, `reader.groups`) reads each of its runs
through a tail of a source (`read.sources`) and keeps what its series need:

- a run: its samples, from which `build_run` makes its series at each new data version;
- a job: its families merged over workers in the job's arrays (each family's `Family.merger`,
  one worker at a time: the job is held, not its workers), and per worker what re-reading its
  last steps needs (`Member.context`). New data of a worker is read as what it appended: its
  context and the new samples are parsed (`build_run`) and merged from the worker's last step
  on. Data that cannot be taken so (a layout that changed, a step written out of order, a parse
  that gives a note) makes the state read the group again from its start (`jobs.Irregular`);
- either: the live families' samples (`Family.live`: status), read apart (`live`).

The first read of a job may come from elsewhere: a pool of processes (`first_reads`, the
report's), or for the tab's large jobs a helper process reading beside this one (`shared=True`,
`shared_read`).

No TensorFlow.
"""

import contextlib
import fnmatch
import itertools
import threading

from tb_replica_plugin import reader, registry
from tb_replica_plugin.core import columns
from tb_replica_plugin.core.jobs import Irregular, worker_name
from tb_replica_plugin.member_read import (  # noqa: F401 - named here too
    CONTEXT_STEPS,
    MemberRead,
    classic_tags,
    context_start,
    kept_context,
    read_member,
    read_run_files,
    registry_names,
    trimmed,
)
from tb_replica_plugin.read import event_files

_UIDS = itertools.count(1)  # one per GroupState: its versions are unique across states

__all__ = [
    "GroupState",
    "Member",
    "MemberRead",
    "first_reads",
    "merge_job",
    "merge_members",
    "read_log_dir",
    "read_member",
    "read_run_files",
    "worker_order",
]


class Member:
    """One run of a group and what the group keeps of it.

    Attributes:
      run: the run; tail: its source tail.
      slot: its place among the job's workers in the order they were first read (jobs).
      identity: its worker identity (jobs).
      notes: the notes of its first read (a job's, prefixed by its worker's name).
      samples: a run's every non-live sample, `{tag: [(step, value)]}` in order of writing.
      context: a job worker's samples at the last `CONTEXT_STEPS` steps of each tag.
      last_step: the last step of its non-live samples (None before any).
      live: its live families' samples, `{tag: [(step, value)]}`.
      classic: its samples of the families merged by a `Family.merge` function (they read
        every worker at once) and of their `merge_tags`.
    """

    def __init__(self, run, tail):
        self.run = run
        self.tail = tail
        self.slot = None
        self.identity = None
        self.notes = []
        self.samples = {}
        self.built = None  # a run's `RunData` of its first read, while no sample came since
        self.unreadable = frozenset()
        self.context = {}
        self.last_step = None
        self.live = {}
        self.classic = {}
        self.needed = {}  # series of the families the classic ones need, from its last parse


class _NotAJob(Exception):  # noqa: N818 - a condition: read the group's runs one by one
    pass


class GroupState:
    """One group read incrementally (see the module docstring).

    Attributes:
      name: the group: a run, or a job of `reader.job_groups`.
      runs: its runs (a job's worker runs, sorted by worker index).
      mode: "run", "job" or "runs" (a candidate job whose runs are not all its workers: each
        read as a run).
      data_version, live_version: counters that change with new data of the families that are
        not live, and of the live ones.
      values_read: summary values read by its tails so far.
      uid: unique to this state (a version is `(uid, data_version)`).
      full_reads: reads of the group from its start (1, more after `jobs.Irregular`).
      looks: refreshes that looked at the runs (requests that came together share one).

    Example:
      >>> state = GroupState("job", ["job/worker_0", "job/worker_1"], FileSource("logs"), "")
      >>> state.refresh()
      >>> state.data()["job"].inputs.batch_size.shape
      (1000, 16)
    """

    def __init__(self, name, runs, source, experiment_id, job=None, shared=False):
        """Args:
        name: the group name.
        runs: its runs.
        source: a `read.sources` source (its `tail(experiment_id, run)`).
        experiment_id: the experiment id.
        job: whether it is a candidate job (default: `name` is not among `runs`).
        shared: a large job's first read is shared with a helper process (`shared_read`;
          the tab's reads: TensorBoard serves from one process).
        """
        self.name = name
        self._shared = shared
        self.runs = worker_order(runs)
        self._source = source
        self._experiment_id = experiment_id
        self._job = name not in runs if job is None else job
        self._lock = threading.Lock()
        self.looks = 0  # refreshes started
        self._looked = 0  # the last one finished
        self.uid = next(_UIDS)
        self.full_reads = 0
        self.data_version = 0
        self.live_version = 0
        self._cache = {}
        self._reset("job" if self._job else "run")

    def _reset(self, mode):
        self.mode = mode
        tail = self._source.tail
        self.members = [Member(run, tail(self._experiment_id, run)) for run in self.runs]
        self.mergers = {}
        self._read = False
        self.data_version += 1
        self.live_version += 1
        self._cache = {}

    @property
    def values_read(self):
        return sum(member.tail.values_read for member in self.members)

    def refresh(self, ctx=None, listing=None, first_reads=None):
        """Reads what the group's runs appended since the last refresh.

        Args:
          ctx: the `RequestContext` (for a provider's tails).
          listing: `{run: {tag: TensorTimeSeries}}` (`reader.list_runs`), for a provider's
            tails (None: they list).
          first_reads: for the first refresh, an iterable of each run's `MemberRead` in the
            order of `runs` (read elsewhere: `group.read_log_dir`'s processes); None: read here.

        A refresh that started after this call and has finished read whatever was appended
        before it: the call returns without looking again (the tab's requests of one view come
        together, and each looked at every worker of a job in turn: 6 x 40 ms at 256 workers).
        """
        after = self.looks  # an int read whole: refreshes numbered above it start later
        with self._lock, event_files.reading_in_bulk():
            if self._looked > after:
                return
            self.looks += 1
            try:
                self._refresh(ctx, listing, first_reads)
            except _NotAJob:
                self._reset("runs")
                self._refresh(ctx, listing, None)
            except Irregular:
                self._reset(self.mode)
                self._refresh(ctx, listing, None)
            self._looked = self.looks  # a look that raised is not shared: the next look again

    def _refresh(self, ctx, listing, first_reads):
        first = not self._read
        changed = live = False
        with self._first_reads(first, first_reads) as reads:
            for member in self.members:
                if reads is not None:
                    got = next(reads)
                else:
                    tail_read = member.tail.read(ctx, (listing or {}).get(member.run))
                    if tail_read.reset or (not first and tail_read.files > 1):
                        raise Irregular(f"{member.run}: read again")
                    if not first and not tail_read.samples:
                        continue  # nothing appended (a tag's first value brings its metadata)
                    context = member.context if self.mode == "job" and not first else None
                    got = read_member(member.run, tail_read, context, first)
                live = self._take_live(member, got) or live
                changed = self._take(member, got, first) or changed
        self._read = True
        self.full_reads += first
        self.data_version += changed or first
        self.live_version += live or first

    @contextlib.contextmanager
    def _first_reads(self, first, given):
        """The members' first reads when read elsewhere (None: each is read here): `given`,
        or a large job's shared with a helper process (`shared_read`)."""
        if not first:
            yield None
        elif given is not None:
            yield iter(given)
        elif self.mode == "job" and self._shared:
            from tb_replica_plugin import shared_read

            with shared_read.first_reads(self.members) as reads:
                yield reads
        else:
            yield None

    @staticmethod
    def _take_live(member, got):
        for tag, points in got.live.items():
            member.live.setdefault(tag, []).extend(points)
        return bool(got.live)

    def _take(self, member, got, first):
        """Takes one run's read into the group; whether its data (not live) changed."""
        if not first and got.unreadable != member.unreadable:
            raise Irregular(f"{member.run}: a tag this version cannot read")
        member.unreadable = got.unreadable
        if self.mode != "job":
            member.notes = got.schema_notes
            for tag, points in got.samples.items():
                member.samples.setdefault(tag, []).extend(points)
            if first and got.data is not None:  # its series as parsed (the state's first)
                got.data.notes[:0] = got.schema_notes
                member.built = got.data
            elif got.new:
                member.built = None
            return bool(got.new)
        if first:
            return self._first_job_read(member, got)
        return self._job_read(member, got)

    def _first_job_read(self, member, got):
        if got.identity is None:
            raise _NotAJob(member.run)
        member.identity, member.notes = got.identity, got.schema_notes + got.notes
        member.slot = sum(m.slot is not None for m in self.members)
        if got.data is not None:
            self._merge(member, got, None)
        return True

    def _job_read(self, member, got):
        """A worker's new data, parsed with its context, merged from its last step on."""
        if not got.new:
            return False
        if got.notes:
            raise Irregular(f"{member.run}: {got.notes[0]}")
        if member.last_step is not None and got.first_new < member.last_step:
            raise Irregular(f"{member.run}: step {got.first_new} after {member.last_step}")
        self._merge(member, got, member.last_step)
        return True

    def _merge(self, member, got, since):
        """Adds a worker's parsed data to every family's merge; keeps its context."""
        for family in registry.families():
            if family.live:
                continue
            if family.merger is not None:
                merger = self.mergers.get(family.name)
                if merger is None:
                    merger = self.mergers[family.name] = family.merger(self._expected_workers())
                merger.add(member.slot, got.data, since)
            elif family.merge is not None:
                _keep_classic(member, family, got, since)
        steps = [columns.steps_of(points) for points in got.samples.values() if len(points)]
        member.last_step = max(int(s.max()) for s in steps) if steps else member.last_step
        member.context = kept_context(got.samples)

    def _expected_workers(self):
        infos = [m.identity["worker"] for m in self.members if m.identity]
        return max([len(self.members), *(int(i.get("num_workers", 0)) for i in infos)])

    # ------------------------------------------------------------------- answers

    def data(self, include_live=False):
        """`{name: RunData}` of the families that are not live (with `include_live`, all):
        the run, the merged job, or each run of a candidate job that is not one.

        Kept per data version (and live version, with `include_live`).
        """
        with self._lock:
            key = ("data", self.data_version, include_live and self.live_version)
            if key not in self._cache:
                self._cache = {k: v for k, v in self._cache.items() if k[0] != "data"}
                with event_files.reading_in_bulk():
                    self._cache[key] = self._build(include_live)
            return self._cache[key]

    def live(self):
        """`{name: RunData}` holding the live families only (kept per live version)."""
        with self._lock:
            key = ("live", self.live_version)
            if key not in self._cache:
                self._cache = {k: v for k, v in self._cache.items() if k[0] != "live"}
                self._cache[key] = self._build_live()
            return self._cache[key]

    def _build(self, include_live):
        if self.mode == "job":
            found = {self.name: self._job_data()}
        else:
            found = {m.run: self._run_data(m) for m in self.members if m.samples or m.live}
        if include_live:
            for name, live in self._build_live().items():
                if name in found:
                    _with_live(found[name], live)
        return found

    @staticmethod
    def _run_data(member):
        if member.built is not None:
            return member.built
        notes = list(member.notes)
        samples = {tag: sorted(p, key=lambda x: x[0]) for tag, p in member.samples.items()}
        return reader.build_run(member.run, samples, notes, registry_names(live=False))

    def _ordered(self):
        """The job's members in worker order (worker index, then run name)."""
        members = [m for m in self.members if m.identity is not None]
        return sorted(members, key=lambda m: (m.identity["worker"]["worker"], m.run))

    def _workers(self, members):
        workers = []
        for member in members:
            info = member.identity["worker"]
            workers.append(
                {
                    "run": member.run,
                    "name": worker_name(info),
                    "task_type": info["task_type"],
                    "task_index": info["task_index"],
                    "worker": info["worker"],
                    "replicas": list(member.identity["replicas"]),
                    "devices": list(member.identity["devices"]),
                }
            )
        return workers

    def _job_data(self):
        members = self._ordered()
        workers = self._workers(members)
        notes = job_notes(members, workers)
        order = [m.slot for m in members]
        series = {}
        for family in registry.families():
            if family.live:
                continue
            if family.merger is not None:
                merger = self.mergers.get(family.name) or family.merger(self._expected_workers())
                series[family.attribute] = merger.result(self.name, order, workers, notes)
            elif family.merge is not None:
                stubs = [_classic_member(m, family) for m in members]
                series[family.attribute] = family.merge(self.name, stubs, workers, notes)
        return reader.RunData(self.name, notes=notes, workers=workers, **series)

    def _build_live(self):
        names = registry_names(live=True)
        built = {}
        for member in self.members:
            samples = {tag: sorted(p, key=lambda x: x[0]) for tag, p in member.live.items()}
            built[member.run] = reader.build_run(member.run, samples, [], names)
        if self.mode != "job":
            return {run: data for run, data in built.items() if self._has_live(data)}
        members = self._ordered()
        workers = self._workers(members)
        notes = [
            f"{worker['name']}: {note}"
            for member, worker in zip(members, workers, strict=True)
            for note in built[member.run].notes
        ]
        series = {}
        for family in registry.families():
            if family.live and family.merge is not None:
                runs = [built[m.run] for m in members]
                series[family.attribute] = family.merge(self.name, runs, workers, notes)
        if all(value is None for value in series.values()):
            return {}
        return {self.name: reader.RunData(self.name, notes=notes, workers=workers, **series)}

    @staticmethod
    def _has_live(run_data):
        live = [f.attribute for f in registry.families() if f.live]
        return any(run_data.series.get(attribute) is not None for attribute in live)


def job_notes(members, workers):
    """The notes a job starts with: each worker's own (prefixed), a missing worker, and workers
    of different cluster specs."""
    notes = []
    for member, worker in zip(members, workers, strict=True):
        notes.extend(f"{worker['name']}: {note}" for note in member.notes)
    infos = [m.identity["worker"] for m in members]
    expected = max(info["num_workers"] for info in infos) if infos else 0
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
    return notes


def worker_order(runs):
    """A job's runs sorted by task (chief first, then worker index), others by name."""

    def key(run):
        from tb_replica_plugin.core.jobs import WORKER_RUN

        match = WORKER_RUN.match(run)
        if match is None:
            return (2, 0, run)
        return (match.group("task_type") != "chief", int(match.group("task_index")), run)

    return sorted(runs, key=key)


def _keep_classic(member, family, got, since):
    """Keeps a worker's samples of a family merged by a whole-job `Family.merge` function."""
    tags = classic_tags(family)
    for tag in list(member.classic):
        if tag in tags and since is not None:
            member.classic[tag] = [p for p in member.classic[tag] if p[0] < since]
    for tag, points in got.samples.items():
        if tag in tags or reader.tag_matches(tag, family.tags):
            kept = [p for p in points if since is None or p[0] >= since]
            member.classic.setdefault(tag, []).extend(kept)
    for name in family.needs:
        need = registry.family(name)
        member.needed[name] = got.data.series.get(need.attribute)


def _classic_member(member, family):
    """A worker's `RunData` for a whole-job `Family.merge`: its samples of that family, its
    series built from them (notes of that build dropped: its first read had them)."""
    samples = {tag: sorted(p, key=lambda x: x[0]) for tag, p in member.classic.items()}
    series = family.read(member.run, samples, [], dict(member.needed))
    return reader.RunData(member.run, samples=samples, **{family.attribute: series})


def _with_live(run_data, live):
    """Adds the live families' series and notes of `live` to `run_data`."""
    for family in registry.families():
        if family.live:
            run_data.series[family.attribute] = live.series.get(family.attribute)
    run_data.notes.extend(note for note in live.notes if note not in run_data.notes)


@contextlib.contextmanager
def first_reads(logdir, runs, processes):
    """The first reads of `runs` (in that order) for `GroupState.refresh(first_reads=...)`.

    Yields:
      None with `processes` <= 1 (each state reads its runs itself), else an iterator of
      their `MemberRead`s, read and parsed by a pool of new processes
      (`read.processes.reading_pool`), each keeping of its samples only the context and the
      whole-job families' (`trimmed`).
    """
    from tb_replica_plugin.read import processes as processes_lib

    if processes <= 1 or len(runs) <= 1:
        processes_lib.use_deferred_event_reader()
        yield None
        return
    with processes_lib.reading_pool(min(processes, len(runs))) as pool:
        yield pool.map(read_run_files, [logdir] * len(runs), runs)


def merge_members(job, member_runs):
    """The job's `RunData` from its workers' `RunData` (whole, any order): each added to the
    families' merges in worker order (`group.merge_job`).

    Raises:
      ValueError: if a run is not a worker of a job (`reader.worker_identity` is None).
    """
    identities = {id(m): reader.worker_identity(m) for m in member_runs}
    if any(identity is None for identity in identities.values()):
        raise ValueError("every run of a job must be a worker (its shapes or start events)")
    members = sorted(member_runs, key=lambda m: (identities[id(m)]["worker"]["worker"], m.run))
    state = GroupState(job, [m.run for m in members], _NoSource(), "", job=True)
    reads = [
        MemberRead(m.run, m, {}, dict(m.samples), list(m.notes), identities[id(m)], new=1)
        for m in members
    ]
    state.runs = [m.run for m in members]
    state.members = [Member(run, None) for run in state.runs]
    state.refresh(first_reads=reads)
    return state.data()[job]


class _NoSource:
    """The source of a state fed only first reads (`merge_members`)."""

    def tail(self, experiment_id, run):
        return None


def merge_job(job, member_runs):
    """One `RunData` for the runs of the workers of one job, merged one worker at a time.

    Args:
      job: the job name.
      member_runs: the `RunData` of its workers' runs (any order), each a worker
        (`worker_identity`).

    Returns:
      The job's `RunData`, replica axis in global replica order: each family merged by its
      `Family.merger` (or its whole-job `Family.merge`), in registry order.

    Example:
      >>> [w["name"] for w in merge_job("j", [worker_2, worker_0]).workers]
      ['worker_0', 'worker_2']
    """
    return merge_members(job, member_runs)


def read_log_dir(logdir, run_pattern=None, processes=1):
    """Reads every run of this plugin under a log dir, keeping every sample.

    Each run's event files are read once; the workers of each multi-worker job are merged one
    at a time as they are read (`GroupState`), so a job is held merged, not worker by
    worker. A worker's own run is read on its own when `run_pattern` names it.

    Args:
      logdir: the log directory.
      run_pattern: optional shell-style pattern (`fnmatch`) of the runs and jobs to read: a
        job is read when its name or one of its runs matches, a worker's own run (not merged)
        when the pattern names it and not its job.
      processes: how many processes read the event files: with more than 1, a pool of new
        processes (`read.processes.reading_pool`) reads and parses the runs in parallel and this
        process merges the jobs. From a script, call it under `if __name__ == "__main__":` then
        (the new processes import the main module).

    Returns:
      A dict `{run: RunData}` sorted by run name, with the live families (status) too; the
      workers of a multi-worker job are one entry named after the job.

    Example:
      >>> runs = read_log_dir("logs", processes=2)
      >>> runs["job"].inputs.batch_size.shape  # [steps, replicas of every worker]
      (1000, 2048)
    """
    from tb_replica_plugin.read.event_files import EventFilesProvider
    from tb_replica_plugin.read.sources import FileSource

    names = EventFilesProvider(logdir).run_names()
    chosen = {name: worker_order(runs) for name, runs in _chosen_groups(names, run_pattern).items()}
    source = FileSource(logdir)
    found = {}
    every_run = [run for runs in chosen.values() for run in runs]
    with first_reads(logdir, every_run, processes) as reads:
        for name, runs in chosen.items():
            state = GroupState(name, runs, source, "", job=name not in runs)
            state.refresh(first_reads=None if reads is None else itertools.islice(reads, len(runs)))
            found.update(state.data(include_live=True))
    return {
        name: found[name]
        for name in sorted(found)
        if run_pattern is None or fnmatch.fnmatchcase(name, run_pattern)
    }


def _chosen_groups(names, run_pattern):
    """`{group: runs}` to read, in order: every run outside a job and every candidate job, or
    those `run_pattern` names (a worker's run on its own when the pattern names it, not its
    job)."""
    jobs = {job: runs for job, runs in reader.candidate_jobs(names).items() if job not in names}
    in_jobs = {run for runs in jobs.values() for run in runs}

    def named(name):
        return run_pattern is None or fnmatch.fnmatchcase(name, run_pattern)

    chosen = {name: [name] for name in sorted(names) if name not in in_jobs and named(name)}
    for job, runs in jobs.items():
        if named(job):
            chosen[job] = runs
        else:
            chosen.update({run: [run] for run in runs if named(run)})
    return chosen
