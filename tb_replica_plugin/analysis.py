"""Findings: the recorded series turned into plain-language problems, with cause and fix.

Pure Python (no TensorFlow), on the ground floor (docs/architecture.md, "Layers"): the types every
family's rules build on (`Thresholds`, `Finding`), grouping (`group_findings`), sorting, counting
and the text helpers of their messages. It imports nothing of the package: running every
registered family's rules on a run (`read.judge.find_run`) and gathering their kinds
(`read.judge.finding_kinds`) is the read side's.

Severity means one thing in every family: `error` = training is producing a wrong model (or
failing) now; `warning` = likely unintended, check it; `info` = expected behaviour worth knowing.
"""

import dataclasses
import math
import numbers

SEVERITIES = ("error", "warning", "info")


SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Configurable thresholds of the rules.

    Attributes:
      max_imbalance_ratio: an `uneven_batch` finding is raised when max / min batch size over
        replicas exceeds this (1.0: any difference).
      min_identical_rng_steps: an `identical_rng_streams` finding is raised when replicas draw
        the same numbers from a generator at this many logged steps or more (1: any).
      max_duplicate_share: a `duplicate_examples` finding is raised when, over the run, the
        share of a replica's examples that another replica got at the same step exceeds this
        (0.01: more than 1 %, so a dataset with a few repeated records is not flagged).
      straggler_factor: a worker of a multi-worker job is a `straggler` when its median busy
        seconds per step exceed the median over workers times this...
      straggler_min_seconds: ...and exceed it by at least this many seconds (timer noise on
        millisecond steps is not a straggler; under ParameterServerStrategy, how much longer a
        `pss_straggler`'s steps take than the others' median, each on its worker's clock).
      pss_straggler_factor: under ParameterServerStrategy a worker is a `pss_straggler` when
        the median steps per second of the other workers is at least this many times its own...
      pss_straggler_min_steps: ...the others ran (median) at least this many more steps than
        it (a few steps of a short run go to whichever worker is free first)...
      slow_replica_factor: a replica is a `slow_replica` when its median ready time per step
        (from the step's start until its local gradients reach the host) is at least this many
        times the median of the other replicas of its worker...
      slow_replica_min_seconds: ...and at least this many seconds above it (0.005: host
        scheduling jitter of a few tenths of a millisecond on millisecond steps, or logical CPU
        replicas taking turns on the host's cores, is not a slow replica; one clock, so less
        than across hosts).
      variable_drift_rel_l2: a `variable_drift` finding is raised when ||copy_r - copy_0|| /
        ||copy_0|| exceeds this for any replica r at any logged step (exact where the exact
        check ran, else the sketch estimate). Smaller non-zero differences (copies that are not
        bit-identical) give `variable_bits_differ` (info). 1e-6 is about 8 float32 ulps of
        relative error: far above rounding noise of identical updates, far below real drift.
      max_grad_norm_ratio: a `gradient_norm_outlier` finding is raised when a replica's local
        gradient norm exceeds this many times the median of the other replicas' norms at a
        logged step (10.0: replicas of a healthy run fed i.i.d. shards stay within a few times
        each other even at small per-replica batches).
      min_grad_outlier_fraction: ... and only when that replica is over the ratio at at least
        this fraction of the logged steps (0.5: a shard that is consistently off; with tiny
        per-replica batches, e.g. 2 examples, two replicas' norms differ 10× at single steps by
        chance). Every step's ratio is shown in the tab whatever this is.
      stall_seconds: a run (or a worker of a job) is `stalled` when its last heartbeat shows
        no progress (no new step, the training thread on the same innermost Python line) for
        more than this many seconds. None (the default): each run's own stall time, the
        `stall_secs` its probe or callback recorded (default 60 s, when it writes every thread's
        stack), or 300 s for a run that recorded none (written with `heartbeat=False`, or by an
        older version). Set it to judge every run alike (lower: see a hang sooner; higher: a
        long step, evaluation or checkpoint is not a stall).
      silent_seconds: a run without an end record whose last heartbeat is older than this many
        seconds (or three heartbeat intervals, whichever is longer) stopped: killed or lost
        (`stopped_without_end`).
    """

    max_imbalance_ratio: float = 1.0
    min_identical_rng_steps: int = 1
    max_duplicate_share: float = 0.01
    straggler_factor: float = 1.25
    straggler_min_seconds: float = 0.01
    pss_straggler_factor: float = 1.5
    pss_straggler_min_steps: int = 5
    slow_replica_factor: float = 1.25
    slow_replica_min_seconds: float = 0.005
    variable_drift_rel_l2: float = 1e-6

    max_grad_norm_ratio: float = 10.0
    min_grad_outlier_fraction: float = 0.5

    stall_seconds: float | None = None
    silent_seconds: float = 60.0

    @classmethod
    def from_overrides(cls, overrides):
        """Thresholds with some fields set from `NAME=VALUE` strings (as `--threshold` gives).

        Args:
          overrides: iterable of strings such as `"max_imbalance_ratio=1.5"`.

        Returns:
          A `Thresholds`; fields not named keep their defaults.

        Raises:
          ValueError: on a malformed pair, an unknown name or a value that is not a number.

        Example:
          >>> Thresholds.from_overrides(["max_imbalance_ratio=1.5"]).max_imbalance_ratio
          1.5
        """
        fields = {field.name: field for field in dataclasses.fields(cls)}
        values = {}
        for override in overrides:
            name, sep, raw = str(override).partition("=")
            name = name.strip()
            if not sep:
                raise ValueError(f"threshold {override!r} is not NAME=VALUE")
            if name not in fields:
                raise ValueError(
                    f"unknown threshold {name!r}; known thresholds: {', '.join(sorted(fields))}"
                )
            kind = int if fields[name].type in (int, "int") else float
            try:
                values[name] = kind(raw)
            except ValueError:
                raise ValueError(f"threshold {name} needs a number, got {raw!r}") from None
        return cls(**values)


@dataclasses.dataclass
class Finding:
    """One problem found in one run.

    Attributes:
      kind: the rule, e.g. "empty_shard".
      severity: "error", "warning" or "info".
      run: the run name.
      first_step, last_step, count: the steps where it holds (first, last, how many).
      replicas: replica ids involved.
      name: what it is about: the input name (shape and dtype rules), the variable or layer
        name (gradient and drift rules), None when it concerns the whole batch.
      value: the measured value (e.g. imbalance ratio), threshold: what it was compared with.
      message: one or two sentences with the likely cause and the fix.
      view: the part of the tab that shows it ("batch", "shapes", "gradients", "rng", "data",
        "step_time", "drift", "placement" or "watch").
      cause: a key naming the cause within the kind (e.g. "bn_moving_statistics"), or None.
        Findings of one run, kind and cause are grouped into one (see `group_findings`).
      items: for a grouped finding, the findings it stands for (as JSON dicts without `run`,
        `kind`, `cause` and `items`); empty otherwise.
    """

    kind: str
    severity: str
    run: str
    first_step: int
    last_step: int
    count: int
    replicas: list
    name: str | None
    value: float | int | None
    threshold: float | int | None
    message: str
    view: str
    cause: str | None = None
    items: list = dataclasses.field(default_factory=list)

    def to_json(self):
        """The finding as a dict of strict JSON: a NaN or infinite `value` or `threshold` is the
        string "NaN", "Infinity" or "-Infinity" (as the HTTP API and `tb-replica report --json`
        write every non-finite number)."""
        document = dataclasses.asdict(self)
        for key in ("value", "threshold"):
            document[key] = _json_number(document[key])
        return document


def _json_number(value):
    """`value`, or the string TensorBoard's JSON writes for it when it is a non-finite float."""
    if isinstance(value, numbers.Real) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def fmt_steps(steps):
    """ "step 3", or "4 steps (1, 2, 3, 5)" (at most 5 listed, then "and N more")."""
    steps = list(steps)
    if len(steps) == 1:
        return f"step {steps[0]}"
    shown = ", ".join(str(s) for s in steps[:5])
    more = f" and {len(steps) - 5} more" if len(steps) > 5 else ""
    return f"{len(steps)} steps ({shown}{more})"


def names_text(names, shown=3):
    """ "`a`", "`a` and `b`", "`a`, `b`, `c` and 4 more" (the first `shown`, then a count)."""
    names = [f"`{n}`" for n in names]
    if len(names) <= shown:
        return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def _item_json(finding):
    item = finding.to_json()
    for key in ("run", "kind", "cause", "items"):
        item.pop(key)
    return item


def group_findings(findings, describe):
    """Findings of one run, kind and cause merged into one finding with `items`.

    A finding whose `cause` is None stays as it is, as does the only finding of its cause.
    The merged finding keeps the most severe severity, the first and last steps over its items,
    the largest count and value, the union of replicas, `name` None, and the message
    `describe(kind, cause, items)` returns.

    Args:
      findings: a list of `Finding` of one family.
      describe: `(kind, cause, items) -> str`, the message of a group (`items`: the findings,
        most severe first, then in the order the rules gave them).

    Returns:
      A list of `Finding`, most severe first.

    Example:
      >>> [len(f.items) for f in group_findings(findings, rules.group_message)]  # 3 BN layers
      [6]
    """
    groups, loose = {}, []
    for finding in findings:
        if finding.cause is None:
            loose.append(finding)
        else:
            groups.setdefault((finding.run, finding.kind, finding.cause), []).append(finding)
    merged = []
    for (run, kind, cause), members in groups.items():
        if len(members) == 1:
            merged.extend(members)
            continue
        members = sorted(members, key=lambda f: SEVERITY_RANK[f.severity])  # stable: rule order
        values = [f.value for f in members if f.value is not None]
        merged.append(
            Finding(
                kind=kind,
                severity=members[0].severity,
                run=run,
                first_step=min(f.first_step for f in members),
                last_step=max(f.last_step for f in members),
                count=max(f.count for f in members),
                replicas=sorted({r for f in members for r in f.replicas}),
                name=None,
                value=max(values) if values else None,
                threshold=members[0].threshold,
                message=describe(kind, cause, members),
                view=members[0].view,
                cause=cause,
                items=[_item_json(f) for f in members],
            )
        )
    return sort_findings(loose + merged)


def sort_findings(findings):
    """Most severe first, then by run and first step."""
    return sorted(findings, key=lambda f: (SEVERITY_RANK[f.severity], f.run, f.first_step, f.kind))


def replica_list_text(replicas):
    """ "0–3" for a run of consecutive ids, "0, 2" otherwise."""
    replicas = sorted(int(r) for r in replicas)
    if len(replicas) > 2 and replicas == list(range(replicas[0], replicas[-1] + 1)):
        return f"{replicas[0]}–{replicas[-1]}"
    if len(replicas) == 2:
        return f"{replicas[0]} and {replicas[1]}"
    return ", ".join(str(r) for r in replicas)


def severity_counts(findings):
    """`{"error": n, "warning": n, "info": n}` for a list of findings."""
    counts = dict.fromkeys(SEVERITIES, 0)
    for finding in findings:
        counts[finding.severity] += 1
    return counts
