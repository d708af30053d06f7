"""The tab's reads, cached per run (or job) and data version.

A route asks `RunStore` for what it shows: a family route's body (`body`, from one family's
series of one run: `run_data`), or the findings and `/runs` entries (`summaries`). Each asks
the data provider only for the tags it needs (`RunTagFilter`) with the plugin's sampling hint,
and keeps the result in one `core.cache.ByteLRU` keyed by the run's data version: per tag, the
largest step and wall time the provider lists (`list_tensors` metadata). A run is read again,
its findings computed again and its bodies built again only when that version changes (new
data) or the entry was evicted. Job merges are cached the same way (their version is their
workers'), without their workers' own series (`RunData.without_worker_runs`).

A *live* family (`Family.live`: status, whose heartbeats change a running job every few seconds
and whose findings depend on the time of the request) does not count in that version: its own
tags are read apart (`live_data`, cached per their own version) and its findings, `/runs`
fields and route body are computed from that read at each request (`summaries`' `make_live`),
so a heartbeat never makes the tab read or recompute the rest of a run. No TensorFlow.
"""

import collections
import threading
import time

from tb_replica_plugin import analysis, reader, registry
from tb_replica_plugin.core.cache import ByteLRU, SingleFlight

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "LISTING_REUSE_SECONDS",
    "WARM_BACKOFF",
    "RunStore",
    "downsample_from_hint",
]

# The cache's budget: runs, merged jobs, findings and `/runs` entries of the tab.
DEFAULT_CACHE_BYTES = 512 * 1024 * 1024
# A run computed ahead (`RunStore.warm`) waits this many times what that took before the next.
WARM_BACKOFF = 10
# A listing started less than this many seconds ago answers later requests too: the tab asks
# 8 routes within about a second when it opens a run (listing a 256-worker job costs about
# 0.1 s of CPU each time), and TensorBoard reloads its data every few seconds anyway.
LISTING_REUSE_SECONDS = 1.0


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


class RunStore:
    """Cached, scoped reads of one data provider for the plugin's routes.

    Attributes:
      cache: the `ByteLRU` holding `RunData`, findings and `/runs` entries.
      listing_reuse_s: how long (seconds) a listing of the provider's runs answers later
        requests (`list_runs`; 0: each request lists).
      computed: `collections.Counter` of computations by kind (`"read"`: a run or job read
        for a route, `"summary"`: a run or job read in full and its findings computed,
        `"view"`: a run view's bodies built from a full read too large to keep, `"warm"`: a
        settled run or job computed ahead by `warm`).

    Example:
      >>> store = RunStore(provider)
      >>> entry = lambda run_data, findings: {"replicas": run_data.inputs.replicas}
      >>> summary = store.summaries(ctx, "", entry, run="balanced/replicas")
      >>> summary["balanced/replicas"]["findings"]  # `analysis.Finding`s of a clean run
      []
      >>> store.run_data(ctx, "", "balanced/replicas", families=["inputs"]).inputs.steps
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
    ):
        """Args:
        provider: a TensorBoard `DataProvider`.
        max_bytes: the cache budget.
        downsample: samples per tag asked of the provider (see `downsample_from_hint`).
        run_view: optional `fn(run, run_data) -> [(family, args, make_body)]`, the bodies a
          run's view asks for (see `body`). When a run's full read is too large to keep (a
          large job), `summaries` builds them from it, so opening the run does not read it
          again.
        listing_reuse_s: a listing started less than this many seconds ago answers
          `list_runs` (0: every request lists).
        clock: monotonic seconds (`time.monotonic`), for `listing_reuse_s`.
        """
        self._provider = provider
        self._downsample = downsample
        self._run_view = run_view
        self.listing_reuse_s = listing_reuse_s
        self._clock = clock
        self.cache = ByteLRU(max_bytes)
        self._listing = SingleFlight()
        self._recent_listing = {}  # experiment id -> (monotonic start, listing)
        self.computed = collections.Counter()
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

    @staticmethod
    def version(runs, name, live=False):
        """The data version of run or job `name`: per run and tag, its max step and wall time.

        Args:
          runs: `reader.list_runs(...)`.
          name: a run or a candidate job of `runs`.
          live: the version of the live families' tags (`Family.live`) instead of the others'.

        Returns:
          A hashable tuple; it changes when the provider lists new data for the run (of the
          live families, or of the others).
        """
        return tuple(
            (
                run,
                tuple(
                    (tag, int(ts.max_step), float(ts.max_wall_time))
                    for tag, ts in sorted(runs[run].items())
                    if _is_live(tag) == live
                ),
            )
            for run in reader.group_runs(runs, name)
        )

    def _count(self, kind):
        with self._lock:
            self.computed[kind] += 1

    def run_data(self, ctx, experiment_id, run, families=None, runs=None):
        """The `RunData` of one run or job holding (at least) the families `families`.

        Args:
          ctx, experiment_id: as for `reader.read_run`.
          run: a run or job name.
          families: names of the families needed (None: every family).
          runs: `list_runs(...)` if already listed.

        Returns:
          A `reader.RunData` (shared with other requests: do not modify it).

        Raises:
          errors.NotFoundError: if `run` is neither a run nor a job of this plugin.
        """
        if runs is None:
            runs = self.list_runs(ctx, experiment_id)
        if run not in runs and run not in reader.job_groups(runs):
            raise reader.run_not_found(run)
        version = self.version(runs, run)
        full = self.cache.get(("data", experiment_id, run, None, version))
        if full is not None:
            return full
        scope = None if families is None else reader.with_needs(families)

        def read():
            self._count("read")
            return reader.read_runs(
                self._provider,
                ctx,
                experiment_id,
                run=run,
                runs=runs,
                families=scope,
                downsample=self._downsample,
            )[run].without_worker_runs()

        return self.cache.get_or_compute(
            ("data", experiment_id, run, scope, version),
            read,
            slot=("data", experiment_id, run, scope),
        )

    def live_data(self, ctx, experiment_id, group, runs=None):
        """`{name: RunData}` of one group (`reader.groups`) holding the live families only.

        Read again only when the live families' tags have new data (`version(..., live=True)`);
        a group without any gives `{}`.

        Raises:
          errors.NotFoundError: if `group` is neither a run nor a job of this plugin.
        """
        if runs is None:
            runs = self.list_runs(ctx, experiment_id)
        if group not in runs and group not in reader.job_groups(runs):
            raise reader.run_not_found(group)
        version = self.version(runs, group, live=True)
        if not any(tags for _, tags in version):
            return {}
        names = sorted(registry.live_names())

        def read():
            self._count("live")
            found = reader.read_group(
                self._provider, ctx, experiment_id, group, runs, names, self._downsample
            )
            return {name: data.without_worker_runs() for name, data in found.items()}

        key = ("live", experiment_id, group)
        return self.cache.get_or_compute((*key, version), read, slot=key)

    def body(self, ctx, experiment_id, run, family, args, make_body, run_data=None):
        """A family route's JSON body for `run` and its arguments, cached per data version.

        Args:
          ctx, experiment_id: as for `reader.read_run`.
          run: a run or job name.
          family: the family's name (its tags, and those of its needs, are read).
          args: the route's parsed arguments, `{name: value}` (hashable values).
          make_body: `fn(run_data)`, the route's answer from the run's data (the plugin gives
            its JSON body, encoded).
          run_data: the run's `RunData` when already read (with this family), else None.

        Returns:
          What `make_body` returned (shared with other requests: do not modify it).

        Raises:
          errors.NotFoundError: if `run` is neither a run nor a job of this plugin.
        """
        runs = self.list_runs(ctx, experiment_id)
        if run not in runs and run not in reader.job_groups(runs):
            raise reader.run_not_found(run)
        version = self.version(runs, run)
        key = ("body", experiment_id, run, family, tuple(sorted(args.items())))

        def compute():
            if run_data is not None:
                return make_body(run_data)
            return make_body(self.run_data(ctx, experiment_id, run, [family], runs=runs))

        return self.cache.get_or_compute((*key, version), compute, slot=key)

    def _summaries(self, ctx, experiment_id, runs, group, make_entry):
        """`{name: {"entry", "findings"}}` of one group of `reader.groups(runs)`, cached."""
        version = self.version(runs, group)

        def compute():
            self._count("summary")
            read = reader.read_group(
                self._provider, ctx, experiment_id, group, runs, downsample=self._downsample
            )
            result = {}
            for name, run_data in read.items():
                run_data = run_data.without_worker_runs()
                # Kept for the routes too (they look for a full read before reading their scope).
                own = version if name == group else self.version(runs, name)
                key = ("data", experiment_id, name, None, own)
                self.cache.put(key, run_data, slot=("data", experiment_id, name, None))
                findings = analysis.find_run(run_data, live=False)
                result[name] = {"entry": make_entry(run_data, findings), "findings": findings}
                if self._run_view is not None and self.cache.get(key) is None:
                    # Too large to keep: the run view's bodies now, from this read.
                    self._count("view")
                    for family, args, make_body in self._run_view(name, run_data):
                        try:
                            self.body(ctx, experiment_id, name, family, args, make_body, run_data)
                        except Exception:  # noqa: BLE001 - the route gives it when asked
                            continue
            return result

        return self.cache.get_or_compute(
            ("summary", experiment_id, group, version),
            compute,
            slot=("summary", experiment_id, group),
        )

    def warm(self, ctx, experiment_id, make_entry, seen, warmed, clock=time.monotonic, errors=None):
        """Computes ahead the findings and `/runs` entry of every run or job whose data has
        settled: its data version is the one the previous call saw (`seen`); and its live
        families' read (`live_data`), which the tab judges at each request.

        A job whose full read is too large to keep also gets its run view's bodies (`run_view`),
        so opening the tab after TensorBoard has loaded a large log dir reads nothing. Each
        settled version is computed once. A run or job still training that settles between
        its logged steps is computed ahead again only `WARM_BACKOFF` times as long after its
        last computation ahead as that took (a 90-s job: every 15 minutes at most); a request
        computes its newest data when the tab asks.

        Args:
          ctx, experiment_id: as for `reader.read_run`.
          make_entry: as for `summaries`.
          seen: `{group: version}` returned by the previous call (`{}` at first).
          warmed: `{group: (version, monotonic time before which it waits)}` of what was
            computed ahead; updated.
          clock: `fn() -> seconds`, the time (tests give their own).
          errors: a list getting `(group, exception)` of each run or job whose computation
            raised (the others are computed all the same; that version is not tried again,
            a request for it raises the error to the tab).

        Returns:
          `{group: version}` of the runs and jobs listed now: pass it to the next call.

        Example:
          >>> seen, warmed = {}, {}
          >>> seen = store.warm(ctx, "", runs_entry, seen, warmed)  # lists the versions
          >>> seen = store.warm(ctx, "", runs_entry, seen, warmed)  # computes the settled ones
        """
        runs = self.list_runs(ctx, experiment_id)
        current = {group: self.version(runs, group) for group in reader.groups(runs)}
        for group, version in current.items():
            done, wait_until = warmed.get(group, (None, float("-inf")))
            if seen.get(group) != version or done == version:
                continue
            start = clock()
            if start < wait_until:
                continue
            self._count("warm")
            try:
                self._summaries(ctx, experiment_id, runs, group, make_entry)
                self.live_data(ctx, experiment_id, group, runs)
            except Exception as error:  # noqa: BLE001 - the others are computed all the same
                if errors is not None:
                    errors.append((group, error))
            warmed[group] = (version, start + WARM_BACKOFF * (clock() - start))
        return current

    def summaries(self, ctx, experiment_id, make_entry, run=None, make_live=None):
        """The findings and `/runs` entry of every run and job, or of `run` only.

        Args:
          ctx, experiment_id: as for `reader.read_run`.
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
            if run not in runs and run not in reader.job_groups(runs):
                raise reader.run_not_found(run)
            groups = [run]
        else:
            groups = reader.groups(runs)
        result = {}
        for group in groups:
            found = self._summaries(ctx, experiment_id, runs, group, make_entry)
            if make_live is not None:
                live = self.live_data(ctx, experiment_id, group, runs)
                found = {n: _with_live(s, live.get(n), make_live) for n, s in found.items()}
            result.update(found)
        if run is not None:
            if run not in result:
                raise reader.run_not_found(run)
            return {run: result[run]}
        return {name: result[name] for name in sorted(result)}


def _is_live(tag):
    family = registry.family_of_tag(tag)
    return family is not None and family.live


def _with_live(summary, live_run_data, make_live):
    """A run's cached summary with its live fields and findings added (a new dict)."""
    if live_run_data is None:
        return summary
    fields, findings = make_live(live_run_data)
    entry = {**summary["entry"], **fields}
    counts = dict(entry.get("findings") or {})
    for finding in findings:
        counts[finding.severity] = counts.get(finding.severity, 0) + 1
    entry["findings"] = counts
    return {"entry": entry, "findings": analysis.sort_findings(summary["findings"] + findings)}
