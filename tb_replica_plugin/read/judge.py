"""Judging a run: every registered family's rules, in registry order (the read side).

The same findings feed the tab, `tb-replica report`, `tb_replica_plugin.load` and `halt_on`.
Each family's rules (`tb_replica_plugin/families/<name>/rules.py`) declare their kinds in
`Family.rules.kinds`; `finding_kinds()` gathers them. The types (`Finding`, `Thresholds`) and
`group_findings` are the ground floor's (`analysis`).
"""

from tb_replica_plugin import registry
from tb_replica_plugin.analysis import Thresholds, group_findings, sort_findings


def find_run(run_data, thresholds=Thresholds(), live=None, now=None):
    """Findings of every family of one run.

    Every registered family's `rules.find` runs in registry order; a family whose rules have a
    `group_message(kind, cause, items)` has its findings of one kind and cause grouped into one
    (`group_findings`); then the rules of families that have an `annotate` hook amend the
    findings of the others, in reverse registry order (gradients adds an empty shard's NaN loss
    to `empty_shard`, then inputs names the worker of each finding of a multi-worker job).

    Args:
      run_data: a `reader.RunData`.
      thresholds: the `Thresholds` to apply.
      live: None for every family; False for the families that are not live (`Family.live`),
        True for the live ones only (the tab computes those apart, at each request).
      now: the time (`time.time()`) the live families' rules judge the run at (None: now).

    Returns:
      A list of `Finding`, most severe first.

    Example:
      >>> [f.kind for f in find_run(run_data)]   # 17 examples, batch 8, 2 replicas
      ['empty_shard']
    """
    findings = []
    chosen = [f for f in registry.families() if live is None or f.live == live]
    for family in chosen:
        if family.live:
            found = family.rules.find(run_data, thresholds, now=now)
        else:
            found = family.rules.find(run_data, thresholds)
        describe = family.rules.group_message
        findings.extend(group_findings(found, describe) if describe else found)
    # Last family first: a family's words on another's finding (gradients on an empty shard's
    # NaN loss) come before those of the families it depends on (inputs names the worker).
    for family in reversed(registry.families()):
        if family.rules.annotate is not None:
            family.rules.annotate(findings, run_data)
    return sort_findings(findings)


def finding_kinds():
    """Every finding kind of every registered family, with its rule's metadata.

    Returns:
      `{kind: {"severity": default severity, "thresholds": (names of `Thresholds` fields it
      uses,), "summary": one sentence, "family": family name}}`, in registry order.

    Raises:
      ValueError: if two families declare the same kind.
    """
    kinds = {}
    for family in registry.families():
        for kind, meta in family.rules.kinds.items():
            if kind in kinds:
                raise ValueError(f"finding kind {kind!r} declared by two families")
            kinds[kind] = {**meta, "family": family.name}
    return kinds
