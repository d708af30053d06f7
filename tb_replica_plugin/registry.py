"""The one registry of stat families: which families exist, in which order, and what they need.

A family is one package under `tb_replica_plugin/families/` (or anywhere importable) whose
`__init__` defines `FAMILY = Family(...)`: a typed descriptor that names every part of the family
(its reader and merge, its rules, its presenter, its write side). Adding a family is: its package,
one line in `_registered` below, one tab section in `frontend/src/sections.js`.

Order: the registry is in dependency order (a family comes after every family it `needs` or
`uses`) and is also the order of the tab's routes and of `/runs` "families". The reader reads
families in this order, so a family can use the series of the families it needs.

Imports no TensorFlow: a descriptor names its write side by a function that imports it
(`Family.write_side`), called by the probe only; the read side (numpy) is imported with the
descriptors, on first use.
"""

import contextlib
import dataclasses
import fnmatch
from collections.abc import Callable, Mapping


def _registered():
    """Every built-in family's descriptor, one line each, in dependency order."""
    from tb_replica_plugin.families import (
        examples,
        gradients,
        inputs,
        rng,
        status,
        step_time,
        variables,
        watch,
    )

    return (
        inputs.FAMILY,
        step_time.FAMILY,
        gradients.FAMILY,
        rng.FAMILY,
        examples.FAMILY,
        variables.FAMILY,
        watch.FAMILY,
        status.FAMILY,
    )


@dataclasses.dataclass(frozen=True)
class Rules:
    """A family's rules: its findings and the kinds it declares.

    Attributes:
      find: `find(run_data, thresholds)` -> list of `analysis.Finding`.
      kinds: `{kind: {"severity", "thresholds", "summary"}}`: every kind `find` may give.
      group_message: `group_message(kind, cause, items)` -> the message of a group of findings
        of one kind and cause (`analysis.group_findings`), or None when they are never grouped.
      annotate: `annotate(findings, run_data)`, which amends the findings of every family of the
        run after all have been found (inputs names the worker of each finding of a job), or None.
    """

    find: Callable
    kinds: Mapping
    group_message: Callable | None = None
    annotate: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Presenter:
    """How a family shows its series: its route's body, its report blocks, its facts in `/runs`.

    Attributes:
      body: `body(run, run_data, args)` -> the route's JSON (or a `core.args.Download`).
      args: `{argument: parser}` of the route (each parser takes the raw string or None).
      report_json: `report_json(run_data, thresholds)` -> `{key: value}` merged into the run's
        entry of `tb-replica report --json`.
      report_text: `report_text(run_data, thresholds)` -> lines of the text report.
      run_view_args: the arguments the tab's run view sends this route instead of the common
        ones (the rng view asks 2 steps).
      listed: `listed(run_data)` -> whether `/runs` names the family (None: its series is not
        None).
      identity: `identity(run_data)` -> `{"replicas", "devices", "source", "steps"}` or None:
        what the family knows of the run's replicas (`read.overview`), or None.
      recorded_steps: `recorded_steps(run_data)` -> arrays of the steps it recorded (the run's
        first and last step), or None.
      runs_fields: `runs_fields(run_data)` -> `{key: value}` added to the run's `/runs` entry, or
        None.
      live_fields: for a live family (`Family.live`), `live_fields(run_data, now)` -> `{key:
        value}` added to the run's `/runs` entry at each request (`now`: `time.time()`), or None.
    """

    body: Callable
    report_json: Callable
    report_text: Callable
    args: Mapping = dataclasses.field(default_factory=dict)
    run_view_args: Mapping = dataclasses.field(default_factory=dict)
    listed: Callable | None = None
    identity: Callable | None = None
    recorded_steps: Callable | None = None
    runs_fields: Callable | None = None
    live_fields: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Family:
    """Descriptor of one stat family.

    Attributes:
      name: the family name, e.g. "examples".
      attribute: the `RunData` attribute holding its series, e.g. "data" for examples.
      tags: `{tag: kind}` of the summaries it writes (its `schema.TAGS`). A tag with `*` is a
        pattern (`fnmatch`), for a family that writes one tag per user-chosen name (watch:
        `watch/*/stats`).
      read: `read(run, samples, notes, needed)` -> its series of one run, or None: from the run's
        decoded samples (`{tag: [(step, numpy value)]}` in step order, each a sequence to read,
        not to change: a list, or a `core.columns.Column` whose `steps` and `values` are
        arrays, `columns.by_shape` takes both; `needed`: `{name: series}` of the families in
        `needs`, already read).
      rules: its `Rules`.
      present: its `Presenter`.
      merger: the class of its streaming merge of a multi-worker job (`core.jobs.Merger`):
        `merger(expected_workers)` takes one worker's series at a time into the job's arrays
        (`add`) and gives the job's series (`result`); None for a family merged by `merge`.
      merge: for a family without `merger`, `merge(job, member_runs, workers, notes)` -> the
        series of a job from all its workers' `RunData` at once (their series and the samples
        of its tags and `merge_tags`; small families: status, a third-party family's), or None;
        None when a job never has this family's series.
      write_side: a function of no arguments that imports the write side (TensorFlow) and returns
        `(Recorder class, Recording mixin or None)` (`core.recorder`): the probe creates one
        recorder per family and `ReplicaProbe` gets the mixin's `observe_*` methods. None for a
        family recorded by another's write side (step_time: by inputs).
      versions: `{kind: schema version}` written for its kinds whose layout changed since
        version 1 (its `schema.VERSIONS`); readers read every older version too.
      needs: names of the families whose series it reads (they come before it in the registry;
        a route of this family reads their tags too).
      uses: names of the families whose code it imports (they come before it too), e.g. watch
        describes its leaves with the inputs family's shape statistics.
      merge_tags: tags whose raw samples its `merge` reads from the workers' `RunData` (a job
        keeps each worker's samples of these and of the family's tags; those of the families
        with a `merger` are dropped as soon as each worker is merged).
      route: the URL path of its route under the plugin (e.g. "/data"), or None.
      worker_of: `worker_of(series)` -> `{"worker", "replicas", "devices"}` when its series of a
        run says the run is a worker of a multi-worker job (`worker`: the probe's worker dict,
        `core.distribute.worker_info`), else None; None for a family that cannot tell. The
        reader groups a job's workers by the first family that can.
      live: its findings and route depend on the time they are asked at, not only on its data
        (status: a run whose heartbeats stopped is "silent" only once enough time has passed),
        and its data changes while nothing else does (heartbeats): the tab reads it apart, its
        tags do not count in the data version of the other families' cached reads, and its
        findings and route body are computed at each request from its own cached read.
      text_order, json_order: position of its block in `tb-replica report` text and in each
        run's entry of `--json` (the run's "findings", "notes" and "workers" sit at 50), so
        registry order (dependency order) need not match the report's layout. Families that
        leave them at 100 follow the others in registry order.
    """

    name: str
    attribute: str
    tags: Mapping
    read: Callable
    rules: Rules
    present: Presenter
    merger: type | None = None
    merge: Callable | None = None
    write_side: Callable | None = None
    versions: Mapping = dataclasses.field(default_factory=dict)
    needs: tuple = ()
    uses: tuple = ()
    merge_tags: tuple = ()
    route: str | None = None
    worker_of: Callable | None = None
    live: bool = False
    text_order: int = 100
    json_order: int = 100


_extra = ()  # families registered by `registered`, after the built-in ones
_loaded = None  # the tuple `families()` returns, built on first use
_tag_family = {}  # tag -> family, for `family_of_tag` (emptied when the registry changes)


@contextlib.contextmanager
def registered(*descriptors):
    """Registers `descriptors` after the built-in families for the duration of the block.

    For tests (tests/toy_family/) and for a family that lives outside this package.

    Args:
      *descriptors: `Family` descriptors, in dependency order.

    Raises:
      ValueError: (on entry) if a descriptor's `needs` or `uses` is not registered before it.

    Example:
      >>> with registry.registered(toy_family.FAMILY):
      ...     [f.name for f in registry.families()][-1]
      'toy'
    """
    global _extra, _loaded
    previous = _extra
    _extra, _loaded = (*previous, *descriptors), None
    try:
        families()
        yield
    finally:
        _extra, _loaded = previous, None


def families():
    """Every family's descriptor, in registry (dependency) order; loaded once and cached.

    Returns:
      A tuple of `Family`.

    Raises:
      ValueError: if two families share a name or a family needs or uses one that is missing
        or comes later in the registry.
    """
    global _loaded
    loaded = _loaded
    if loaded is None:
        loaded = (*_registered(), *_extra)
        check_order(loaded)
        _tag_family.clear()
        _loaded = loaded  # request threads may race here: each builds an equal tuple
    return loaded


def check_order(descriptors):
    """Checks that names are unique and that every family's `needs` and `uses` come before it.

    Args:
      descriptors: `Family` descriptors in registry order.

    Raises:
      ValueError: naming the first duplicate, or the first family whose need is missing or
        registered after it.
    """
    seen = set()
    for descriptor in descriptors:
        if descriptor.name in seen:
            raise ValueError(f"two families are called {descriptor.name!r}")
        for need in (*descriptor.needs, *descriptor.uses):
            if need not in seen:
                raise ValueError(
                    f"family {descriptor.name!r} needs {need!r}, which is not registered before it"
                )
        seen.add(descriptor.name)


def family(name):
    """The descriptor of the family called `name`.

    Raises:
      KeyError: if no registered family has that name.
    """
    for descriptor in families():
        if descriptor.name == name:
            return descriptor
    raise KeyError(name)


def live_names():
    """The names of the registered families with `live` set (a frozenset)."""
    return frozenset(f.name for f in families() if f.live)


def family_of_tag(tag):
    """The registered family that writes `tag` (exact tag, else a tag pattern), or None.

    Remembered per tag until the registry changes (a job's data version asks it per tag and
    worker).
    """
    loaded = families()
    if tag not in _tag_family:
        found = next((d for d in loaded if tag in d.tags), None)
        if found is None:
            patterns = ((d, p) for d in loaded for p in d.tags if "*" in p)
            found = next((d for d, p in patterns if fnmatch.fnmatchcase(tag, p)), None)
        _tag_family[tag] = found
    return _tag_family[tag]


def tag_kinds():
    """`{tag: kind}` of every registered family's schema."""
    kinds = {}
    for descriptor in families():
        kinds.update(descriptor.tags)
    return kinds


def kind_version(kind):
    """The schema version written for `kind` (1 unless its family's `versions` says newer)."""
    for descriptor in families():
        if kind in descriptor.versions:
            return descriptor.versions[kind]
    return 1


def tag_kind(tag):
    """The kind of a written tag: its family's exact tag, else the first matching tag pattern.

    Args:
      tag: a tag as written, e.g. "inputs/shapes" or "watch/logits/stats".

    Returns:
      The kind (str), or None when no registered family writes such a tag.
    """
    kinds = tag_kinds()
    if tag in kinds:
        return kinds[tag]
    for pattern, kind in kinds.items():
        if "*" in pattern and fnmatch.fnmatchcase(tag, pattern):
            return kind
    return None
