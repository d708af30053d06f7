"""The tab's reads: one incremental state per run or job, and answers cached per data version.

One way down: a route asks `RunStore` (this module) for what it shows; the store keeps one
`group.GroupState` per run or job (`reader.groups`), which reads what the group's runs appended
since its last look (`read.sources`: the run's event files when TensorBoard serves a log dir the
plugin can read, else TensorBoard's data provider) and merges a job's workers in its families'
mergers; the store then computes the route's answer from the state's series and keeps it in one
`read.cache.ByteLRU` keyed by the state's data version: findings and `/runs` entries
(`summaries`), family route bodies (`body`). A group is read from its start once (or again when
its data cannot be taken in place, `core.jobs.Irregular`); after that, new steps cost what they
add.

A *live* family (`Family.live`: status, whose heartbeats change a running job every few seconds
and whose findings depend on the time of the request) does not count in that version: its own
samples are kept apart by the state (`live_data`, per their own version) and its findings,
`/runs` fields and route body are computed from them at each request (`summaries`' `make_live`),
so a heartbeat never makes the tab recompute the rest of a run. No TensorFlow.
"""

import collections
import itertools
import os
import threading
import time

from tb_replica_plugin import analysis, group, reader, registry
from tb_replica_plugin.read import judge
from tb_replica_plugin.read.cache import ByteLRU, SingleFlight
from tb_replica_plugin.read.sources import FileSource, ProviderSource

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "LISTING_REUSE_SECONDS",
    "READ_ENV",
    "VIEWED_SECONDS",
    "WARM_BACKOFF",
    "RunStore",
    "downsample_from_hint",
    "source_for",
]

# The cache's budget: findings, `/runs` entries and route bodies of the tab.
DEFAULT_CACHE_BYTES = 512 * 1024 * 1024
# A run or job whose view the tab asked less than this many seconds ago gets its view's answers
# computed ahead at each new version, settled or not (`RunStore.warm`): an open tab on a live job.
VIEWED_SECONDS = 120.0
# A run's answers computed ahead (`RunStore.warm`) wait this many times what that took before
# they are computed ahead again (its state is still read on at every look).
WARM_BACKOFF = 10
# A listing started less than this many seconds ago answers later requests too: the tab asks
# 8 routes within about a second when it opens a run (listing a 256-worker job costs about
# 0.1 s of CPU each time), and TensorBoard reloads its data every few seconds anyway.
LISTING_REUSE_SECONDS = 1.0
# Set to "provider" to read through TensorBoard's data provider even when the log dir is
# readable (each read then answers every sample again: per-step filtering, see read.sources).
READ_ENV = "TB_REPLICA_READ"


def downsample_from_hint(hint):
    """Samples per tag to ask of the provider for a `--samples_per_plugin replicas=N` hint.

    Args:
      hint: the plugin's entry of `TBContext.sampling_hints` (None when not given).

    Returns:
      `hint` when positive, else `reader.ALL_SAMPLES` (0 or no hint: every sample it kept).

    Example:
      >>> downsample_from_hint(0) == reader.ALL_SAMPLES
      True
    """
    return int(hint) if hint else reader.ALL_SAMPLES


def source_for(provider, logdir=None, downsample=reader.ALL_SAMPLES, flags=None):
    """Where the store reads samples: the log dir's event files when it can, else the provider.

    Args:
      provider: a TensorBoard `DataProvider` (the runs it lists are the runs read).
      logdir: TensorBoard's `--logdir` (`TBContext.logdir`), or None.
      downsample: samples per tag asked of the provider (`downsample_from_hint`).
      flags: TensorBoard's flags: with `--grpc_data_provider` the data is not under `logdir`.

    Returns:
      A `read.sources.FileSource` (falling back to the provider for a run it cannot find)
      when `logdir` is given, TensorBoard reads no remote data server, and `TB_REPLICA_READ`
      is not "provider"; else a `read.sources.ProviderSource`.
    """
    through = ProviderSource(provider, downsample)
    remote = bool(getattr(flags, "grpc_data_provider", ""))
    if not logdir or remote or os.environ.get(READ_ENV, "") == "provider":
        return through
    return FileSource(logdir, fallback=through)


class RunStore:
    """The states of a data provider's runs and jobs, and the routes' answers cached.

    Attributes:
      cache: the `ByteLRU` holding findings, `/runs` entries and route bodies.
      listing_reuse_s: how long (seconds) a listing of the provider's runs answers later
        requests (`list_runs`; 0: each request lists).
      computed: `collections.Counter` of computations by kind (`"read"`: a run or job read from
        its start, `"refresh"`: a look that found new data, `"live"`: a look that found new
        samples of the live families, `"summary"`: findings and `/runs` entries computed,
        `"body"`: a route body built, `"warm"`: a run or job computed ahead).

    Example:
      >>> store = RunStore(provider)
      >>> entry = lambda run_data, findings: {"replicas": run_data.inputs.replicas}
      >>> summary = store.summaries(ctx, "", entry, run="balanced/replicas")
      >>> summary["balanced/replicas"]["findings"]  # `analysis.Finding`s of a clean run
      []
      >>> store.run_data(ctx, "", "balanced/replicas").inputs.steps
      array([0, 1])
    """

    def __init__(
        self,
        provider,
        max_bytes=DEFAULT_CACHE_BYTES,
        downsample=reader.ALL_SAMPLES,
        run_view=None,
        listing_reuse_s=LISTING_REUSE_SECONDS,
        clock=time.monotonic,
        source=None,
    ):
        """Args:
        provider: a TensorBoard `DataProvider` (its listing names the runs).
        max_bytes: the cache budget.
        downsample: samples per tag asked of the provider (see `downsample_from_hint`).
        run_view: optional `fn(run, run_data) -> [(family, args, make_body)]`, the bodies a
          run's view asks for (see `body`): `warm` builds them for a settled version.
        listing_reuse_s: a listing started less than this many seconds ago answers
          `list_runs` (0: every request lists).
        clock: monotonic seconds (`time.monotonic`), for `listing_reuse_s`.
        source: where samples are read (`source_for`); default: the provider.
        """
        self._provider = provider
        self._source = source or ProviderSource(provider, downsample)
        self._run_view = run_view
        self.listing_reuse_s = listing_reuse_s
        self._clock = clock
        self.cache = ByteLRU(max_bytes)
        self._listing = SingleFlight()
        self._recent_listing = {}  # experiment id -> (monotonic start, listing)
        self._states = {}  # (experiment id, group) -> GroupState
        self._versions = itertools.count(1)
        self.computed = collections.Counter()
        self._viewed = {}  # (experiment id, run) -> `clock()` when a route body was last asked
        self._lock = threading.Lock()

    def list_runs(self, ctx, experiment_id):
        """`reader.list_runs`: the provider's metadata of this plugin's runs.

        A request gets the listing of the same experiment started less than
        `listing_reuse_s` ago, or under way in another request's thread; else it lists.
        """
        with self._lock:
            recent = self._recent_listing.get(experiment_id)
        if recent is not None and self._clock() - recent[0] < self.listing_reuse_s:
            return recent[1]

        def listing():
            started = self._clock()
            runs = reader.list_runs(self._provider, ctx, experiment_id)
            with self._lock:  # keeps the listings still young enough to answer, this one too
                self._recent_listing = {
                    key: value
                    for key, value in self._recent_listing.items()
                    if started - value[0] < self.listing_reuse_s
                }
                self._recent_listing[experiment_id] = (started, runs)
            return runs

        return self._listing.run(experiment_id, listing)

    def _count(self, kind, count=1):
        with self._lock:
            self.computed[kind] += count

    def state(self, ctx, experiment_id, name, runs=None):
        """The `GroupState` of run or job `name`, having read what its runs appended.

        A run of a job (`<job>/worker_1`) asked by its own name has a state of its own.

        Raises:
          errors.NotFoundError: if `name` is neither a run nor a job of this plugin.
        """
        if runs is None:
            runs = self.list_runs(ctx, experiment_id)
        members = reader.group_runs(runs, name)
        if not members:
            raise reader.run_not_found(name)
        key = (experiment_id, name)
        with self._lock:
            state = self._states.get(key)
            if state is None or state.runs != group.worker_order(members):
                state = group.GroupState(name, members, self._source, experiment_id, shared=True)
                self._states[key] = state
        reads, data, live = state.full_reads, state.data_version, state.live_version
        state.refresh(ctx, runs)
        self._count("read", state.full_reads - reads)
        self._count("refresh", state.full_reads == reads and state.data_version != data)
        self._count("live", state.live_version != live)
        return state

    def forget(self):
        """Drops every state and cached answer: the next requests read as a new TensorBoard's
        (benchmarks of a first load)."""
        with self._lock:
            self._states = {}
        self.cache.clear()

    @staticmethod
    def version(state, live=False):
        """The data version of a state (of its live families' samples with `live`): a
        hashable value that changes with its new data."""
        return (state.uid, state.live_version if live else state.data_version)

    def run_data(self, ctx, experiment_id, run, runs=None):
        """The `RunData` of one run or job, of the families that are not live.

        Returns:
          A `reader.RunData` (shared with other requests and with the state: do not modify).

        Raises:
          errors.NotFoundError: if `run` is neither a run nor a job of this plugin.
        """
        found = self.state(ctx, experiment_id, run, runs).data().get(run)
        if found is None:
            raise reader.run_not_found(run)
        return found

    def live_data(self, ctx, experiment_id, name, runs=None):
        """`{name: RunData}` of one group holding the live families only (`{}` without any).

        Raises:
          errors.NotFoundError: if `name` is neither a run nor a job of this plugin.
        """
        return self.state(ctx, experiment_id, name, runs).live()

    def body(self, ctx, experiment_id, run, family, args, make_body, state=None, asked=True):
        """A family route's JSON body for `run` and its arguments, cached per data version.

        Args:
          ctx, experiment_id: the request's context and experiment.
          run: a run or job name.
          family: the family's name.
          args: the route's parsed arguments, `{name: value}` (hashable values).
          make_body: `fn(run_data)`, the route's answer from the run's data (the plugin gives
            its JSON body, encoded).
          state: the run's `GroupState` when already refreshed, else None.
          asked: the tab asked it (False: computed ahead); `warm` keeps the view of a run
            asked less than `VIEWED_SECONDS` ago computed at each of its new versions.

        Returns:
          What `make_body` returned (shared with other requests: do not modify it).

        Raises:
          errors.NotFoundError: if `run` is neither a run nor a job of this plugin.
        """
        state = state or self.state(ctx, experiment_id, run)
        key = ("body", experiment_id, run, family, tuple(sorted(args.items())))
        if asked:
            with self._lock:
                self._viewed[(experiment_id, run)] = self._clock()

        def compute():
            self._count("body")
            found = state.data().get(run)
            if found is None:
                raise reader.run_not_found(run)
            return make_body(found)

        return self.cache.get_or_compute((*key, self.version(state)), compute, slot=key)

    def _summaries(self, experiment_id, state, make_entry):
        """`{name: {"entry", "findings"}}` of one group's state, cached per data version."""

        def compute():
            self._count("summary")
            result = {}
            for name, run_data in state.data().items():
                findings = judge.find_run(run_data, live=False)
                result[name] = {"entry": make_entry(run_data, findings), "findings": findings}
            return result

        key = ("summary", experiment_id, state.name)
        return self.cache.get_or_compute((*key, self.version(state)), compute, slot=key)

    def warm(self, ctx, experiment_id, make_entry, seen, warmed, clock=time.monotonic, errors=None):
        """Reads on every run and job, and computes ahead the findings and `/runs` entry of each
        whose data changed; for a version that settled (the same at two looks), or of a run or
        job whose view the tab asked less than `VIEWED_SECONDS` ago (an open tab on a job that
        is still training), also its live families' read and its run view's bodies (`run_view`).

        Each version is computed once; a run or job is computed ahead again only `WARM_BACKOFF`
        times as long after its last computation ahead as that took (its state is still read on
        at each look, so a request computes its newest data from what was read).

        Args:
          ctx, experiment_id: the context and experiment.
          make_entry: as for `summaries`.
          seen: `{group: version}` returned by the previous call (`{}` at first).
          warmed: `{group: ((version, views built), monotonic time before which a new version
            waits)}` of what was computed ahead; updated.
          clock: `fn() -> seconds`, the time (tests give their own).
          errors: a list getting `(group, exception)` of each run or job whose computation
            raised (the others are computed all the same; that version is not tried again,
            a request for it raises the error to the tab).

        Returns:
          `{group: version}` of the runs and jobs listed now: pass it to the next call.

        Example:
          >>> seen, warmed = {}, {}
          >>> seen = store.warm(ctx, "", runs_entry, seen, warmed)  # reads and computes
          >>> seen = store.warm(ctx, "", runs_entry, seen, warmed)  # their run views, settled
        """
        runs = self.list_runs(ctx, experiment_id)
        current = {}
        for name in reader.groups(runs):
            try:
                state = self.state(ctx, experiment_id, name, runs)
            except Exception as error:  # noqa: BLE001 - the others are read all the same
                if errors is not None:
                    errors.append((name, error))
                continue
            version = current[name] = self.version(state)
            views = seen.get(name) == version or self._viewed_lately(experiment_id, name)
            (done, done_views), wait_until = warmed.get(name, ((None, False), float("-inf")))
            start = clock()
            if done == version and (done_views or not views):
                continue
            if done != version and start < wait_until:
                continue  # a new version, too soon after the last computed ahead
            self._count("warm")
            try:
                self._summaries(experiment_id, state, make_entry)
                if views:
                    state.live()
                    self._build_views(ctx, experiment_id, state)
            except Exception as error:  # noqa: BLE001 - the others are computed all the same
                if errors is not None:
                    errors.append((name, error))
            if done != version:
                wait_until = start + WARM_BACKOFF * (clock() - start)
            warmed[name] = ((version, views), wait_until)
        return current

    def _viewed_lately(self, experiment_id, name):
        """Whether the tab asked a route body of run or job `name` less than `VIEWED_SECONDS`
        ago."""
        with self._lock:
            asked = self._viewed.get((experiment_id, name))
        return asked is not None and self._clock() - asked < VIEWED_SECONDS

    def _build_views(self, ctx, experiment_id, state):
        """The run view's bodies of each run of a state (`run_view`), from its data."""
        if self._run_view is None:
            return
        for name, run_data in state.data().items():
            for family, args, make_body in self._run_view(name, run_data):
                try:
                    self.body(ctx, experiment_id, name, family, args, make_body, state, False)
                except Exception:  # noqa: BLE001, S112 - the route gives it when asked
                    continue

    def summaries(self, ctx, experiment_id, make_entry, run=None, make_live=None):
        """The findings and `/runs` entry of every run and job, or of `run` only.

        Args:
          ctx, experiment_id: the context and experiment.
          make_entry: `fn(run_data, findings) -> dict`, the `/runs` entry of one run.
          run: a run or job name, or None for all.
          make_live: `fn(live_run_data) -> (fields, findings)`: the live families' `/runs`
            fields and findings of one run, computed at each call from its `live_data`; added
            to its cached entry and findings (None: none).

        Returns:
          `{name: {"entry": dict, "findings": [Finding]}}` sorted by name (shared: do not
          modify).

        Raises:
          errors.NotFoundError: if `run` is given and is neither a run nor a job.
        """
        runs = self.list_runs(ctx, experiment_id)
        if run is not None:
            if not reader.group_runs(runs, run):
                raise reader.run_not_found(run)
            names = [run]
        else:
            names = reader.groups(runs)
        result = {}
        for name in names:
            state = self.state(ctx, experiment_id, name, runs)
            found = self._summaries(experiment_id, state, make_entry)
            if make_live is not None:
                live = state.live()
                found = {n: _with_live(s, live.get(n), make_live) for n, s in found.items()}
            result.update(found)
        if run is not None:
            if run not in result:
                raise reader.run_not_found(run)
            return {run: result[run]}
        return {name: result[name] for name in sorted(result)}


def _with_live(summary, live_run_data, make_live):
    """A run's cached summary with its live fields, families, notes and findings added (a new
    dict)."""
    if live_run_data is None:
        return summary
    fields, findings = make_live(live_run_data)
    entry = {**summary["entry"], **fields}
    counts = dict(entry.get("findings") or {})
    for finding in findings:
        counts[finding.severity] = counts.get(finding.severity, 0) + 1
    entry["findings"] = counts
    listed = set(entry.get("families", []))
    listed |= {
        f.attribute
        for f in registry.families()
        if f.live and live_run_data.series.get(f.attribute) is not None
    }
    entry["families"] = [f.attribute for f in registry.families() if f.attribute in listed]
    notes = list(entry.get("notes", []))
    entry["notes"] = notes + [note for note in live_run_data.notes if note not in notes]
    return {"entry": entry, "findings": analysis.sort_findings(summary["findings"] + findings)}
