"""One run of a group read: its new samples split by family kind and parsed (`read_member`).

What `group.GroupState` reads of each run at each look, and what a helper process
(`shared_read`) or a reading pool's process (`read_run_files`) reads for it: below both, so that
the group, the helper and the pool read a run the same way and none imports another. No
TensorFlow.
"""

import os

import numpy as np

from tb_replica_plugin import reader, registry
from tb_replica_plugin.core import columns
from tb_replica_plugin.read import event_files

# Distinct steps of each tag kept to parse a worker's new data with (`Member.context`): the last
# step may be written again, and the examples' window of a step starts after the step before.
CONTEXT_STEPS = 2


class MemberRead:
    """What reading one run of a group gave (`read_member`).

    Attributes:
      run: the run.
      data: `RunData` of its families that are not live, from its context and new samples
        (None when there is neither).
      live: `{tag: [(step, value)]}` of the live families' new samples.
      samples: `{tag: [(step, value)]}` of the other families: the context and the new
        samples, sorted by step.
      notes: notes of its families' readers on that parse.
      schema_notes: notes of its tags that this version cannot read (`reader.readable_tags`).
      unreadable: those tags.
      identity: `reader.worker_identity` of the run (None: not a worker of a job).
      new: new samples of the families that are not live; first_new: their first step.
    """

    def __init__(self, run, data, live, samples, notes, identity, **fields):
        self.run = run
        self.data = data
        self.live = live
        self.samples = samples
        self.notes = notes
        self.identity = identity
        self.schema_notes = fields.get("schema_notes", [])
        self.unreadable = fields.get("unreadable", frozenset())
        self.new = fields.get("new", 0)
        self.first_new = fields.get("first_new")
        self.complete = True  # `samples` are all the run's (not `trimmed`)


def read_member(run, tail_read, context=None, identity_from_live=True):
    """Reads one run's new values (`TailRead`): split by family kind, parsed with `context`.

    Args:
      run: the run name.
      tail_read: the tail's `TailRead`.
      context: `{tag: [(step, value)]}` kept from earlier reads (`Member.context`), parsed
        before the new samples; None for a first read.
      identity_from_live: also build the live families to tell the run's worker identity.

    Returns:
      A `MemberRead`.
    """
    schema_notes = []
    readable = reader.readable_tags(tail_read.contents, schema_notes)
    live, samples = {}, {tag: list(points) for tag, points in (context or {}).items()}
    new = []  # each tag's new steps
    for tag, points in tail_read.samples.items():  # [(step, numpy value)] or a `Column`
        if tag not in readable:
            continue
        if reader.is_live_tag(tag):
            live.setdefault(tag, []).extend(points)
        else:
            samples[tag] = columns.joined(samples[tag], points) if tag in samples else points
            new.append(columns.steps_of(points))
    samples = {tag: columns.by_step(points) for tag, points in samples.items()}
    notes = []
    data = reader.build_run(run, samples, notes, registry_names(live=False)) if samples else None
    identity = reader.worker_identity(data) if data is not None else None
    if identity is None and identity_from_live and live:
        ordered = {tag: sorted(p, key=lambda x: x[0]) for tag, p in live.items()}
        identity = reader.worker_identity(
            reader.build_run(run, ordered, [], registry_names(live=True))
        )
    return MemberRead(
        run,
        data,
        live,
        samples,
        notes,
        identity,
        schema_notes=schema_notes,
        unreadable=frozenset(tail_read.contents) - readable,
        new=sum(len(steps) for steps in new),
        first_new=min(int(steps.min()) for steps in new) if new else None,
    )


def registry_names(live):
    """The names of the registered families that are (or are not) live."""
    return [f.name for f in registry.families() if f.live == live]


def kept_context(samples):
    """`{tag: [(step, value)]}`: each tag's samples at its last `CONTEXT_STEPS` distinct steps,
    copied (a value read in bulk is a row of its tag's whole read: kept, the row would keep it)."""
    context = {}
    for tag, points in samples.items():
        steps = columns.steps_of(points)
        if steps.size:
            first = context_start(steps)
            kept = np.flatnonzero(steps >= first).tolist()
            context[tag] = [(int(steps[i]), np.array(points[i][1])) for i in kept]
    return context


def context_start(steps):
    """The first of the last `CONTEXT_STEPS` distinct values of `steps` (int [n], n >= 1).

    Steps in order (as a tag's samples are, but for a step written again) are read from their
    end, not sorted whole: 4,000 tags of a 256-worker job took 0.1 s with `np.unique`.

    Example:
      >>> int(context_start(np.array([1, 2, 2, 3]))), int(context_start(np.array([3, 1, 2])))
      (2, 2)
    """
    if steps.size > 1 and bool(np.all(steps[1:] >= steps[:-1])):
        runs = np.flatnonzero(steps[1:] != steps[:-1]) + 1  # where each later value starts
        return steps[runs[-CONTEXT_STEPS]] if runs.size >= CONTEXT_STEPS else steps[0]
    return np.unique(steps)[-CONTEXT_STEPS:][0]


def classic_tags(family):
    return set(family.tags) | set(family.merge_tags)


def read_run_files(logdir, run):
    """`MemberRead` of a run's event files, read whole (a pool process's work), trimmed."""
    from tb_replica_plugin import metadata
    from tb_replica_plugin.read.event_files import RunTail

    directory = logdir if run == "." else os.path.join(logdir, run)
    with event_files.reading_in_bulk():
        got = read_member(run, RunTail(directory, metadata.PLUGIN_NAME).read())
        return trimmed(got)


def trimmed(got):
    """`got` keeping of its samples only what a state takes from a first read besides its
    series: each tag's context and the whole-job families' samples (for the report, which
    reads once)."""
    classic = set()
    for family in registry.families():
        if family.merger is None and family.merge is not None and not family.live:
            classic |= classic_tags(family)
    kept = kept_context(got.samples)
    for tag, points in got.samples.items():
        if tag in classic or any(reader.tag_matches(tag, [c]) for c in classic):
            kept[tag] = points
    got.samples = kept
    got.complete = False
    return got
