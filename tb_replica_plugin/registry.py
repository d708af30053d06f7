"""The one registry of stat families: which families exist, in which order, and what they need.

A family is one package under `tb_replica_plugin/families/` (or anywhere importable) whose
`__init__` defines `FAMILY = Family(...)`. Adding a family is: its package, one line in
`FAMILY_MODULES`, one tab section in `frontend/src/sections.js`.

Order: `FAMILY_MODULES` is in dependency order (a family comes after every family it `needs`) and
is also the order of the tab's routes and of `/runs` "families". The reader reads families in this
order, so a family can use the series of the families it needs.

Imports no TensorFlow (nor anything else heavy): descriptors are loaded lazily, on first use.
"""

import dataclasses
import fnmatch
import importlib

# One line per family, in dependency order.
FAMILY_MODULES = (
    "tb_replica_plugin.families.inputs",
    "tb_replica_plugin.families.step_time",
    "tb_replica_plugin.families.gradients",
    "tb_replica_plugin.families.rng",
    "tb_replica_plugin.families.examples",
    "tb_replica_plugin.families.variables",
    "tb_replica_plugin.families.watch",
)


@dataclasses.dataclass(frozen=True)
class Family:
    """Descriptor of one stat family.

    The entry points are resolved lazily, by convention, from the package's submodules:

    - `<package>.schema`: `TAGS = {tag: kind}` and the tensor layouts (imported by writer and
      reader). A tag with `*` is a pattern (`fnmatch`), for a family that writes one tag per
      user-chosen name (watch: `watch/*/stats`).
    - `<package>.read`: `from_samples(run, samples, notes, needed)` -> series or None, the
      family's series from one run's decoded samples (`needed`: `{name: series}` of the families
      in `needs`, already read); `merge(job, member_runs, workers, notes)` -> series or None, the
      series of a multi-worker job from its workers' `RunData`.
    - `<package>.rules`: `find(run_data, thresholds)` -> list of `analysis.Finding`;
      `FINDING_KINDS = {kind: {"severity", "thresholds", "summary"}}`; optionally
      `annotate(findings, run_data)` (see `annotates_findings`).
    - `<package>.present`: `ARGS = {argument: parser}` and `body(run, run_data, args)` -> the
      route's JSON; `report_json(run_data, thresholds)` -> `{key: value}` merged into the run's
      entry of `tb-replica report --json`; `report_text(run_data, thresholds)` -> lines of the
      text report; optionally `listed(run_data)` (whether `/runs` names the family; default: its
      series is not None) and `recorded_steps(run_data)` (steps counted in `/runs`
      first_step/last_step; default: none).
    - `<package>.record`: the write side (TensorFlow, in-graph), loaded lazily by the probe only;
      nothing on the read side imports it.

    Attributes:
      name: the family name, e.g. "examples".
      attribute: the `RunData` attribute holding its series, e.g. "data" for examples.
      package: the importable package, e.g. "tb_replica_plugin.families.examples".
      tags: `{tag: kind}` of the summaries it writes (its `schema.TAGS`).
      versions: `{kind: schema version}` written for its kinds whose layout changed since
        version 1 (its `schema.VERSIONS`); readers read every older version too.
      needs: names of the families it reads (they come before it in the registry).
      merge_tags: tags whose raw samples its `read.merge` reads from the workers' `RunData`
        (the other samples of a job's workers are dropped as soon as each is read).
      route: the URL path of its route under the plugin (e.g. "/data"), or None.
      annotates_findings: its `rules.annotate` may amend the findings of other families of the
        same run (inputs names the worker of each finding of a multi-worker job); it runs after
        every family's `rules.find`.
      text_order, json_order: position of its block in `tb-replica report` text and in each
        run's entry of `--json` (the run's "findings", "notes" and "workers" sit at 50). They keep
        the report exactly as it was laid out before the registry (text: step-time lines right
        after the run header, then batch-size changes, rng, examples, variables, gradients;
        JSON: step_time last), so registry order (dependency order) need not match it. Families
        that leave them at 100 follow the others in registry order.
    """

    name: str
    attribute: str
    package: str
    tags: dict
    versions: dict = dataclasses.field(default_factory=dict)
    needs: tuple = ()
    merge_tags: tuple = ()
    route: str | None = None
    annotates_findings: bool = False
    text_order: int = 100
    json_order: int = 100

    def module(self, part):
        """The family's submodule `part` ("schema", "read", "rules", "present"), imported.

        Raises:
          ImportError: if the package has no such submodule.
        """
        return importlib.import_module(f"{self.package}.{part}")

    @property
    def read(self):
        return self.module("read")

    @property
    def rules(self):
        return self.module("rules")

    @property
    def present(self):
        return self.module("present")


_CACHE = {}


def clear_cache():
    """Forgets the loaded descriptors (after `FAMILY_MODULES` changed, e.g. in a test)."""
    _CACHE.clear()


def families():
    """Every family's descriptor, in registry (dependency) order; loaded once and cached.

    Returns:
      A tuple of `Family`.

    Raises:
      ImportError: if a package in `FAMILY_MODULES` cannot be imported.
      ValueError: if a package has no `FAMILY` or a family needs one that is missing or comes
        later in the registry.
    """
    key = tuple(FAMILY_MODULES)
    cached = _CACHE.get(key)
    if cached is None:
        loaded = []
        for package in key:
            descriptor = getattr(importlib.import_module(package), "FAMILY", None)
            if not isinstance(descriptor, Family):
                raise ValueError(f"{package} defines no FAMILY = registry.Family(...)")
            loaded.append(descriptor)
        check_order(loaded)
        cached = tuple(loaded)
        # Request threads may race here: each returns its own (equal) tuple, never a lookup.
        _CACHE.clear()
        _CACHE[key] = cached
    return cached


def check_order(descriptors):
    """Checks that every family's `needs` come before it.

    Args:
      descriptors: `Family` descriptors in registry order.

    Raises:
      ValueError: naming the first family whose need is missing or registered after it.
    """
    seen = set()
    for descriptor in descriptors:
        for need in descriptor.needs:
            if need not in seen:
                raise ValueError(
                    f"family {descriptor.name!r} needs {need!r}, which is not registered "
                    "before it in registry.FAMILY_MODULES"
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
