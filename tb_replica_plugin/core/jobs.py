"""Multi-worker jobs: which runs are workers of one job, and what the families' mergers share.

A job's families are merged one worker at a time (`Merger`): each worker's values go into the
job's arrays (`StepArrays`, at the steps every worker logged, on the replica axis of
`ReplicaAxis`) as it is read, so the job is held merged and one worker at a time besides.

Imports no TensorFlow.
"""

import re

import numpy as np

# `<job>/<task_type>_<task_index>`: the run a worker's probe writes (`ReplicaProbe.run_dir`).
WORKER_RUN = re.compile(r"^(?:(?P<job>.+)/)?(?P<task_type>chief|worker)_(?P<task_index>\d+)$")


ROOT_JOB = "."


def job_of_run(run):
    """The job name of a worker's run (`"mw/replicas"` for `"mw/replicas/worker_1"`), else None.

    Whether it is one is confirmed by its data (the worker fields of its shapes events).
    """
    match = WORKER_RUN.match(run)
    if match is None:
        return None
    return match.group("job") or ROOT_JOB


def candidate_jobs(run_names):
    """`{job: [worker runs]}` for runs named like a worker's run, grouped by job name."""
    jobs = {}
    for run in run_names:
        job = job_of_run(run)
        if job is not None:
            jobs.setdefault(job, []).append(run)
    return jobs


def worker_name(worker):
    """`"worker_1"`: the name of a worker from its `InputsSeries.worker` fields."""
    return f"{worker['task_type']}_{worker['task_index']}"


# ------------------------------------------------------------------------ streaming merges


class Irregular(Exception):  # noqa: N818 - a condition, not a failure: the group is read again
    """New data a job's merged series cannot take in place (a layout that changed, a step
    written out of order): the group is read again from its start."""


class ReplicaAxis:
    """Each worker slot's columns on a job's replica axis, in the order slots were added.

    Slots are numbered 0, 1, ... in the order their workers were first read; a slot without the
    family's data is never added. The job's worker order (by worker index) is usually that
    order, else `order` says how to take the columns.

    Example:
      >>> axis = ReplicaAxis()
      >>> axis.add(0, 2), axis.add(2, 3), axis.total, axis.order([2, 0]).tolist()
      (slice(0, 2, None), slice(2, 5, None), 5, [2, 3, 4, 0, 1])
    """

    def __init__(self):
        self.slices = {}
        self.total = 0

    @property
    def counts(self):
        """`{slot: replicas}`, in the order slots were added."""
        return {slot: columns.stop - columns.start for slot, columns in self.slices.items()}

    def add(self, slot, count):
        """The columns of `slot` holding `count` replicas (a new slot after the others).

        Raises:
          Irregular: if `slot` was added with another count.
        """
        columns = self.slices.get(slot)
        if columns is None:
            columns = self.slices[slot] = slice(self.total, self.total + int(count))
            self.total += int(count)
        elif columns.stop - columns.start != count:
            raise Irregular(
                f"worker slot {slot}: {count} replicas, not {columns.stop - columns.start}"
            )
        return columns

    def order(self, slots):
        """Column indices taking the slots in the order `slots` (those added), or None when it
        is the order they were added in."""
        chosen = [self.slices[s] for s in slots if s in self.slices]
        if [c.start for c in chosen] == sorted(c.start for c in self.slices.values()) and len(
            chosen
        ) == len(self.slices):
            return None
        return np.concatenate(
            [np.arange(c.start, c.stop) for c in chosen] or [np.zeros(0, np.int64)]
        ).astype(np.int64)


# A job's arrays get `rows // HEADROOM` spare rows when they first grow past their capacity.
HEADROOM = 8


class StepArrays:
    """A family's per-step job arrays: one row per step some worker logged, in step order.

    Each worker slot writes its values into its columns of the rows of its steps (`place`,
    `write`); a row is *complete* when every slot wrote it, and the job's series shows the
    complete rows (the steps every worker logged). A step a slot logs below
    the last row without a row of its own can never be complete (the slot that wrote the later
    row did not log it, and steps only grow), so it gets none; a row some slot has passed
    without writing is *dead* and `drop_dead` drops it. Rows (with room, `HEADROOM`) and the
    replica axis grow by doubling, so a worker's new steps are written in place; arrays handed
    out before keep their values, except a slot's rewritten last step (see `GroupState`).

    Attributes:
      steps: int64 [rows] (a view): the step of each row.
      size: rows in use.
      arrays: `{name: array}` declared with `declare`, first axis the rows (capacity).
      changed_from: the first row written or dropped since `clear_changed` (for what is derived
        from complete rows).

    Example:
      >>> rows = StepArrays(slots=2)
      >>> rows.declare("norm", (1,), np.float64, np.nan, replica_axes=(0,))
      >>> rows.write(0, "norm", rows.place(0, [1, 2]), slice(0, 1), np.ones((2, 1)))
      >>> rows.write(1, "norm", rows.place(1, [2]), slice(1, 2), np.ones((1, 1)))
      >>> rows.drop_dead()  # step 1: slot 1 logged step 2 without it
      >>> rows.steps[rows.complete_rows()].tolist()
      [2]
    """

    def __init__(self, slots=1):
        self._steps = np.zeros(0, np.int64)
        self._present = np.zeros((0, max(int(slots), 1)), bool)
        self.size = 0
        self.arrays = {}
        self._specs = {}
        self.logged = {}  # slot -> distinct steps it logged (rows or not)
        self.last = {}  # slot -> the last step it logged
        self.changed_from = 0

    @property
    def steps(self):
        return self._steps[: self.size]

    @property
    def slots(self):
        return len(self.logged)

    def declare(self, name, row_shape, dtype, fill, replica_axes=(), slot_axes=()):
        """An array of rows of `row_shape`: its `replica_axes` grow with `widen`, its
        `slot_axes` (one entry per worker slot) as slots come."""
        kind = "slot" if slot_axes else "replica"
        axes = tuple(slot_axes or replica_axes)
        self._specs[name] = (tuple(row_shape), np.dtype(dtype), fill, axes, kind)
        self.arrays[name] = np.full((len(self._steps), *row_shape), fill, dtype)

    def declare_like(self, name, other):
        """Array `name` as a copy of array `other` (same rows, shape and fill)."""
        self._specs[name] = self._specs[other]
        self.arrays[name] = self.arrays[other].copy()

    def forget(self, name):
        """Drops array `name`."""
        self.arrays.pop(name, None)
        self._specs.pop(name, None)

    def lengthen(self, name, size):
        """Makes the last axis of array `name` (not a replica axis) `size` long, filling."""
        shape, dtype, fill, axes, kind = self._specs[name]
        grown = np.full((*self.arrays[name].shape[:-1], size), fill, dtype)
        grown[..., : shape[-1]] = self.arrays[name]
        self.arrays[name] = grown
        self._specs[name] = ((*shape[:-1], size), dtype, fill, axes, kind)

    def widen(self, replicas, kind="replica"):
        """Makes the replica axes (`kind` "slot": the slot axes) of every array at least
        `replicas` long (by doubling)."""
        for name, (shape, dtype, fill, axes, its_kind) in list(self._specs.items()):
            if axes and its_kind == kind and shape[axes[0]] < replicas:
                size = max(replicas, 2 * shape[axes[0]])
                grown = tuple(size if i in axes else n for i, n in enumerate(shape))
                array = np.full((len(self._steps), *grown), fill, dtype)
                array[(slice(None), *(slice(0, n) for n in shape))] = self.arrays[name]
                self.arrays[name] = array
                self._specs[name] = (grown, dtype, fill, axes, its_kind)

    def place(self, slot, steps):
        """The rows of `slot`'s `steps` (ascending, unique): new steps above the last row get new
        rows; -1 for a step below it without a row (it can never be complete).

        Raises:
          Irregular: if a step is not above the last step `slot` logged before, unless it is
            that step (its values written again).
        """
        steps = np.asarray(steps, np.int64)
        last = self.last.get(slot)
        if steps.size and last is not None and steps[0] < last:
            raise Irregular(f"worker slot {slot} logged step {int(steps[0])} after {last}")
        self._grow_slots(slot)
        top = self._steps[self.size - 1] if self.size else np.iinfo(np.int64).min
        new = steps[steps > top]
        self._append(new)
        at = np.searchsorted(self.steps, steps)
        found = (at < self.size) & (self._steps[np.minimum(at, self.size - 1)] == steps)
        rows = np.where(found, at, -1) if self.size else np.full(steps.shape, -1)
        self._present[rows[rows >= 0], slot] = True
        counted = steps if last is None else steps[steps > last]
        self.logged[slot] = self.logged.get(slot, 0) + int(counted.size)
        if steps.size:
            self.last[slot] = int(steps[-1])
            if found.any():
                self.changed_from = min(self.changed_from, int(rows[found][0]))
        return rows.astype(np.int64)

    def write(self, slot, name, rows, columns, values):
        """Writes `values` (one entry per row of `rows`) at those rows and the slot's `columns`
        of the array's replica axes (skipping rows -1)."""
        keep = rows >= 0
        if not keep.any():
            return
        rows, values = rows[keep], np.asarray(values)[keep]
        axes = self._specs[name][3]
        index = [slice(None)] * (1 + len(self._specs[name][0]))
        for axis in axes:
            index[axis + 1] = columns
        contiguous = rows[-1] - rows[0] + 1 == rows.size
        index[0] = slice(int(rows[0]), int(rows[-1]) + 1) if contiguous else rows
        self.arrays[name][tuple(index)] = values

    def view(self, name, rows, total, order=None):
        """The rows `rows` of array `name`, its replica axes cut to `total` columns and taken in
        `order` (`ReplicaAxis.order`; None: as they are). A view when `rows` is a slice and
        `order` None."""
        array = self.arrays[name][rows]
        axes = self._specs[name][3]
        index = [slice(None)] * array.ndim
        for axis in axes:
            index[axis + 1] = slice(0, total)
        array = array[tuple(index)]
        if order is not None:
            for axis in axes:
                array = np.take(array, order, axis=axis + 1)
        return array

    def _grow_slots(self, slot):
        if slot >= self._present.shape[1]:
            width = max(slot + 1, 2 * self._present.shape[1])
            grown = np.zeros((len(self._present), width), bool)
            grown[:, : self._present.shape[1]] = self._present
            self._present = grown
        self.widen(slot + 1, kind="slot")
        self.logged.setdefault(slot, 0)

    def _append(self, steps):
        if not steps.size:
            return
        needed = self.size + steps.size
        if needed > len(self._steps):
            # Doubling, with an eighth of room at the first fill: a job read whole then growing
            # by a few steps per look does not copy its arrays at its first new steps.
            capacity = max(needed + needed // HEADROOM, 2 * len(self._steps), 16)
            self._steps = _grown(self._steps, capacity, 0)
            self._present = _grown(self._present, capacity, False)
            for name, spec in self._specs.items():
                self.arrays[name] = _grown(self.arrays[name], capacity, spec[2])
        self._steps[self.size : needed] = steps
        self.size = needed

    def complete_rows(self):
        """The rows every slot wrote, in step order: a slice when they are the first rows (the
        arrays' views are the series), else an index array (call `drop_dead` first)."""
        present = self._present[: self.size, : self.slots]
        complete = present.all(axis=1) if self.slots else np.zeros(self.size, bool)
        count = int(complete.sum())
        if complete[:count].all():
            return slice(0, count)
        return np.flatnonzero(complete)

    def drop_dead(self):
        """Drops the rows some slot has passed without writing (they can never be complete)."""
        present = self._present[: self.size, : self.slots]
        floor = np.iinfo(np.int64).min
        last = np.array([self.last.get(s, floor) for s in range(self.slots)], np.int64)
        dead = (~present & (last[None, :] > self.steps[:, None])).any(axis=1)
        if dead.any():
            self._keep(~dead)

    def _keep(self, keep):
        """Drops the rows where `keep` is False (new arrays; views handed out keep theirs)."""
        first = int(np.argmin(keep))
        size = int(keep.sum())
        self._steps = np.concatenate([self.steps[keep], self._steps[self.size :]])
        present = self._present
        self._present = np.concatenate([present[: self.size][keep], present[self.size :]])
        for name in self.arrays:
            array = self.arrays[name]
            self.arrays[name] = np.concatenate([array[: self.size][keep], array[self.size :]])
        self.size = size
        self.changed_from = min(self.changed_from, first)

    def clear_changed(self):
        """Marks every row as seen by what is derived from complete rows."""
        self.changed_from = self.size


def _grown(array, capacity, fill):
    zeros = not array.dtype.hasobject and fill == 0  # the kernel's zero pages: not written here
    grown = (np.zeros if zeros else np.empty)((capacity, *array.shape[1:]), array.dtype)
    grown[: len(array)] = array
    if not zeros:
        grown[len(array) :] = fill  # each element written once
    return grown


class Merger:
    """Base of a family's streaming merge of a job: one worker at a time into the job's arrays.

    The reader creates one merger per family and job (`Family.merger`), then calls
    `add(slot, member, since)` once per worker read, in worker order (slot 0 first), and again
    for each worker's new data (`since`: its last step before it, whose rows the new data may
    write again; None at its first add); `result(job, order, workers, notes)` gives the job's
    series at any time (views of the arrays where it can). Subclasses implement `add` and
    `result`; `absent` notes workers without the family's series.

    Attributes:
      attribute: the family's `RunData` attribute.
      sample_tags: the tags whose raw samples `add` reads from a worker's `RunData.samples`
        (beside its series): a worker read by another process sends only those
        (`shared_read`); None: it may read any (all are sent).
      seen: `{slot: whether its series was not None at its last add}`.
    """

    attribute = None
    sample_tags = ()

    def __init__(self, expected_workers=1):
        self.expected_workers = max(int(expected_workers), 1)
        self.seen = {}

    def series_of(self, slot, member):
        """The family's series in `member` (a worker's `RunData`), noting whether it had one."""
        series = getattr(member, self.attribute, None)
        self.seen[slot] = series is not None or self.seen.get(slot, False)
        return series

    def absent(self, workers, order, notes, what, how):
        """True when some or all slots have no series (with a note naming them when some do).

        Args:
          workers: the job's worker dicts, in `order`; order: the slots in worker order.
          notes: the job's notes (appended to).
          what, how: what is missing and how to get it (words of the note).

        Returns:
          Whether the job view has no series of the family.
        """
        have = [self.seen.get(slot, False) for slot in order]
        missing = note_workers_without(workers, have, notes, ABSENT_NOTE, what=what, how=how)
        return missing is None or bool(missing)

    def add(self, slot, member, since):
        """Takes worker slot `slot`'s `RunData` (or its part from step `since` on)."""
        raise NotImplementedError

    def result(self, job, order, workers, notes):
        """The job's series (or None), its notes appended to `notes`."""
        raise NotImplementedError


ABSENT_NOTE = (
    "Workers {names} recorded no {what}: the job view has none ({how}); each worker's own run "
    "still shows its own."
)


def note_workers_without(workers, have, notes, note, **fields):
    """Notes the workers of a job that lack a family's data when other workers have it.

    The one place that builds a job's "missing workers" note (`Merger.absent`, and the merges
    of step_time's ready times and of status).

    Args:
      workers: the job's worker dicts (each with its "name").
      have: per worker, in the same order, whether it has the data.
      notes: the job's notes (appended to).
      note: the note's template: `{names}` becomes the missing workers' names, joined by ", ";
        the other fields come from `fields`.
      **fields: the template's other fields.

    Returns:
      None when no worker has the data (no note); else the names of the workers without it
      (empty when every worker has it; a note appended when not).

    Example:
      >>> note_workers_without([{"name": "w0"}, {"name": "w1"}], [True, False], notes,
      ...                      "{names} recorded no {what}.", what="status")
      ['w1']
    """
    if not any(have):
        return None
    missing = [worker["name"] for worker, has in zip(workers, have, strict=True) if not has]
    if missing:
        notes.append(note.format(names=", ".join(missing), **fields))
    return missing


def common_note(rows, order, notes, what):
    """The note of a job whose workers logged different steps (a worker's count of steps differs
    from the complete rows' of `rows`, the steps every worker logged)."""
    count = len(rows.steps[rows.complete_rows()])
    if any(rows.logged.get(slot, 0) != count for slot in order):
        notes.append(
            f"{what}: the job view shows the {count} step(s) every worker logged; some "
            "workers logged steps the others did not."
        )


def merge_all(merger, job, member_runs, workers, notes):
    """A family's merge of whole workers held at once: each added in turn, in worker order.

    For callers that hold every worker's series (tests, `group.merge_job`'s pure use).

    Args:
      merger: the family's `Merger` class (`Family.merger`).
      job: the job name.
      member_runs: the workers' `RunData` (or objects with the family's attribute), in worker
        order.
      workers: the job's worker dicts, same order; notes: the job's notes (appended to).

    Returns:
      The job's series of that family (or None).

    Example:
      >>> merge_all(GradientsMerger, "job", members, workers, []).replicas
      [0, 1, 2, 3]
    """
    merging = merger(len(member_runs))
    for slot, member in enumerate(member_runs):
        merging.add(slot, member, None)
    return merging.result(job, list(range(len(member_runs))), workers, notes)
