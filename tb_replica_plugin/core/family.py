"""The family contract: the typed descriptor every family's package gives (`FAMILY = Family(...)`).

A family is one package under `tb_replica_plugin/families/` (or anywhere importable) whose
`__init__` defines `FAMILY = Family(...)`, naming every part of the family (its reader and merge,
its rules, its presenter, its write side). The ground floor (docs/architecture.md, "Layers"): these
types import nothing of the package; `registry` holds the ordered list of the descriptors.
"""

import dataclasses
from collections.abc import Callable, Mapping


@dataclasses.dataclass(frozen=True)
class Rules:
    """A family's rules: its findings and the kinds it declares.

    Attributes:
      find: `find(run_data, thresholds)` -> list of `analysis.Finding`.
      kinds: `{kind: {"severity", "thresholds", "summary"}}`: every kind `find` may give.
      group_message: `group_message(kind, cause, items)` -> the message of a group of findings
        of one kind and cause (`analysis.group_findings`), or None when they are never grouped.
      annotate: `annotate(findings, run_data)`, which amends the findings of every family of the
        run after all have been found, or None; run in reverse registry order (gradients adds an
        empty shard's NaN loss to `empty_shard`, then inputs names the worker of each finding of
        a job).
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
      uses: names of the families whose code it imports or whose series its rules read from
        the `RunData` (they come before it too), e.g. watch describes its leaves with the inputs
        family's shape statistics, and gradients' rules leave an empty batch's NaN loss to the
        inputs family's `empty_shard`.
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
