"""The examples family read side: `DataSeries` from the samples, sketches, multi-worker merge.

Its `RunData` attribute is `data`. It needs the inputs family (replica ids, first step).
Imports no TensorFlow.
"""

import collections
import dataclasses

import numpy as np

from tb_replica_plugin.core import columns, jobs
from tb_replica_plugin.families.examples import schema


@dataclasses.dataclass
class DataSeries:
    """The data family of one run, at its logged steps (each closing a window of steps).

    Attributes:
      run, replicas: as in `InputsSeries` (replica order of every per-replica axis).
      steps: int64 [S], the logged steps.
      window_steps: int64 [S], steps in the window each logged step closes (1 when every step
        is logged).
      batch_size, distinct: int64 [S, R], examples and distinct examples at the logged step.
      duplicated: int64 [S, R], distinct examples of that replica also fed to another replica
        at that step; `window_duplicated` the same summed over the window.
      shared: int64 [S, R, R], distinct examples fed to both replicas at the logged step
        (diagonal: distinct examples); `window_shared` summed over the window.
      steps_shared: int64 [S, R, R], steps of the window where the two replicas shared at least
        one example (diagonal: `window_steps`).
      sketch: int64 [S, R, K], bottom-K sketch of each replica's example fingerprints (the first
        `min(distinct, K)` entries are valid).
      notes: plain-language problems met while reading.
      window_start: int64 [S], first step of the window each logged step closes (the step after
        the previous logged step; for the first, the run's first step when known). None: not
        known, taken as `steps - window_steps + 1` (exact when every step was sampled).
      sampled: True when some window holds steps that were not sampled (`examples_every` > 1):
        `window_steps`, the window sums and `steps_shared` then count sampled steps only. A
        step that was not sampled is simply absent: it is never a step with 0 examples.
    """

    run: str
    replicas: list
    steps: np.ndarray
    window_steps: np.ndarray
    batch_size: np.ndarray
    distinct: np.ndarray
    duplicated: np.ndarray
    window_duplicated: np.ndarray
    shared: np.ndarray
    window_shared: np.ndarray
    steps_shared: np.ndarray
    sketch: np.ndarray
    notes: list
    window_start: np.ndarray | None = None
    sampled: bool = False

    @property
    def num_replicas(self):
        return len(self.replicas)

    def window_starts(self):
        """int64 [S]: `window_start`, or `steps - window_steps + 1` when it is not known."""
        if self.window_start is not None:
            return self.window_start
        return self.steps - np.maximum(self.window_steps, 1) + 1


def data_from_samples(run, samples, notes, replicas=None, first_step=None):
    """Builds the `DataSeries` of a run from its raw samples, or None when it has none.

    Args:
      run: the run name.
      samples: `RunData.samples`.
      notes: the run's notes list (appended to).
      replicas: replica ids (from the inputs family); `range(R)` when None.
      first_step: the run's first step (from the inputs family), or None: the first window
        then starts `window_steps - 1` steps before its logged step.
    """
    stacked = _stacked(samples, notes)
    if stacked is None:
        return None
    steps, ex, ov = stacked
    num = ex.shape[1]
    if replicas is None or len(replicas) != num:
        replicas = list(range(num))
    window_steps = np.diagonal(ov[:, 2], axis1=1, axis2=2)[:, 0].copy()
    # Windows run from the step after the previous logged step; with sampling (examples_every
    # > 1) they hold more steps than they sampled.
    start = steps - np.maximum(window_steps, 1) + 1
    start[1:] = steps[:-1] + 1
    if first_step is not None and first_step <= steps[0]:
        start[0] = first_step
    sampled = bool((window_steps < steps - start + 1).any())
    return DataSeries(
        run=run,
        replicas=[int(r) for r in replicas],
        steps=steps,
        window_steps=window_steps,
        batch_size=ex[:, :, 0],
        distinct=ex[:, :, 1],
        duplicated=ex[:, :, 2],
        window_duplicated=ex[:, :, 3],
        shared=ov[:, 0],
        window_shared=ov[:, 1],
        steps_shared=ov[:, 2],
        sketch=ex[:, :, 4:],
        notes=notes,
        window_start=start,
        sampled=sampled,
    )


def _stacked(samples, notes):
    """`(steps, examples, overlap)` of the steps with both samples (the last of each at a step)
    in the run's most common layout, int64; None without any (a note for steps skipped)."""
    examples = samples.get(schema.TAG_DATA_EXAMPLES, [])
    overlap = samples.get(schema.TAG_DATA_OVERLAP, [])
    if isinstance(examples, columns.Column) and isinstance(overlap, columns.Column):
        return _stacked_columns(examples, overlap, notes)
    examples, overlap = dict(examples), dict(overlap)
    steps = sorted(set(examples) & set(overlap))
    if not steps:
        return None
    counts = collections.Counter(examples[s].shape[0] for s in steps)
    num = counts.most_common(1)[0][0]
    kept = [s for s in steps if _layout_ok(examples[s].shape, overlap[s].shape, num)]
    if len(kept) < len(steps):
        notes.append(f"data: {len(steps) - len(kept)} logged step(s) of another layout skipped.")
    if not kept:
        return None
    ex = np.stack([examples[s] for s in kept]).astype(np.int64)
    ov = np.stack([overlap[s] for s in kept]).astype(np.int64)
    return np.array(kept, dtype=np.int64), ex, ov


def _stacked_columns(examples, overlap, notes):
    """`_stacked` of two `columns.Column`s (one layout each: every step kept, or none)."""
    ex_steps, ex = columns.last_per_step(examples.steps, examples.values)
    ov_steps, ov = columns.last_per_step(overlap.steps, overlap.values)
    steps, at_ex, at_ov = np.intersect1d(ex_steps, ov_steps, return_indices=True)
    if not steps.size:
        return None
    if not _layout_ok(ex.shape[1:], ov.shape[1:], ex.shape[1] if ex.ndim > 1 else None):
        notes.append(f"data: {steps.size} logged step(s) of another layout skipped.")
        return None
    return (
        steps,
        _rows(ex, at_ex).astype(np.int64, copy=False),
        _rows(ov, at_ov).astype(np.int64, copy=False),
    )


def _rows(values, rows):
    """`values[rows]`: `values` itself when `rows` are all of them in order."""
    if len(rows) == len(values) and (len(rows) == 0 or rows[-1] == len(rows) - 1):
        return values
    return values[rows]


def _layout_ok(examples_shape, overlap_shape, num):
    """Whether a step's examples (`[num, >= 4]`) and overlap (`[3, num, num]`) are readable."""
    return (
        len(examples_shape) == 2
        and examples_shape[0] == num
        and examples_shape[1] >= 4
        and tuple(overlap_shape) == (3, num, num)
    )


def from_samples(run, samples, notes, needed):
    """The `DataSeries` of a run (`data_from_samples`), with the inputs family's replicas.

    Args:
      run: the run name.
      samples: `RunData.samples`.
      notes: the run's notes list (appended to).
      needed: `{"inputs": InputsSeries}`.

    Returns:
      A `DataSeries`, or None.
    """
    inputs = needed["inputs"]
    return data_from_samples(
        run,
        samples,
        notes,
        inputs.replicas or None,
        int(inputs.steps[0]) if inputs.steps.size else None,
    )


def sketch_overlaps(sketch, distinct):
    """Examples each pair of replicas shares, from their bottom-K sketches (one step).

    Args:
      sketch: int64 [R, K] bottom-K sketches (`DataSeries.sketch` rows: the smallest distinct
        fingerprints, ascending, the first `min(distinct, K)` valid).
      distinct: int64 [R], the replicas' distinct example counts.

    Returns:
      `(shared, exact, duplicated)`: int64 [R, R] shared examples per pair (diagonal:
      `distinct`), bool [R, R] where that count is exact, and int64 [R] the distinct examples of
      each replica found on another replica (exact when every replica has at most K).
      For a pair (a, b), let t = the smaller of the two sketches' largest entries (a set of at
      most K elements is whole: its t is +inf). Every fingerprint of either set up to t is in
      its sketch, so `both` (sketch entries in both) and `union` (entries of either up to t)
      are exact counts over the fingerprints up to t; J = both / union estimates the Jaccard
      index and `shared = round(J (|A| + |B|) / (1 + J))` (clipped to the smaller set). When
      both sets have at most K elements, t = +inf and this is the exact intersection. Computed
      for every pair at once with two matrix products over the sketch entries.

    Example:
      >>> sketch_overlaps(np.array([[1, 2, 3, 0], [2, 3, 5, 0]]), np.array([3, 3]))[0].tolist()
      [[3, 2], [2, 3]]
    """
    sketch = np.asarray(sketch, np.int64)
    distinct = np.asarray(distinct, np.int64)
    num, size = sketch.shape
    valid = np.arange(size)[None, :] < np.minimum(distinct, size)[:, None]
    values, inverse = np.unique(sketch[valid], return_inverse=True)
    owner = np.nonzero(valid)[0]
    presence = np.zeros((values.size, num), np.float32)
    presence[inverse, owner] = 1.0
    complete = distinct <= size
    last = np.where(valid.any(axis=1), sketch[np.arange(num), np.maximum(valid.sum(1) - 1, 0)], 0)
    below = np.where(complete[None, :], True, values[:, None] <= last[None, :]).astype(np.float32)
    both = np.rint(presence.T @ presence).astype(np.int64)
    up_to = np.rint(presence.T @ below).astype(np.int64)  # [r, q]: r's entries up to q's t
    union = up_to + up_to.T - both
    with np.errstate(divide="ignore", invalid="ignore"):
        jaccard = np.where(union > 0, both / np.maximum(union, 1), 0.0)
        total = (distinct[:, None] + distinct[None, :]).astype(np.float64)
        shared = np.rint(jaccard * total / (1.0 + jaccard)).astype(np.int64)
    shared = np.minimum(shared, np.minimum(distinct[:, None], distinct[None, :]))
    exact = complete[:, None] & complete[None, :]
    shared = np.where(exact, both, shared)
    np.fill_diagonal(shared, distinct)
    on_others = presence.sum(axis=1) > 1
    duplicated = np.rint(presence.T @ on_others.astype(np.float32)).astype(np.int64)
    return shared, exact, duplicated


def sketch_overlap(sketch_a, distinct_a, sketch_b, distinct_b):
    """`(count, exact)`: examples two replicas share, from their sketches (`sketch_overlaps`).

    Example:
      >>> sketch_overlap(np.array([1, 2, 3, 0]), 3, np.array([2, 3, 5, 0]), 3)
      (2, True)
    """
    shared, exact, _ = sketch_overlaps(
        np.stack([sketch_a, sketch_b]), np.array([distinct_a, distinct_b])
    )
    return int(shared[0, 1]), bool(exact[0, 1])


# The [S, R, R] matrices of a job's merged series: beyond this, the merge is skipped with a note
# (2048 replicas × 1,000 steps would take 94 GiB).
MAX_PAIR_BYTES = 2 << 30


class ExamplesMerger(jobs.Merger):
    """Examples fed to replicas of different workers at the same step (`jobs.Merger`).

    Within a worker every count is exact (each worker's own `shared`, `duplicated` and window
    fields, written into its block of the job's arrays). Across workers no example crosses:
    each replica wrote a bottom-K sketch (K = 16) of its example fingerprints at every logged
    step, and for each pair of global replicas on different workers and each step every worker
    logged (computed once per step, when every worker has written it: `_cross`):

    - `shared`: exact when both replicas had at most K distinct examples at that step (the
      sketches are the whole sets), else the bottom-K Jaccard estimate (`sketch_overlaps`);
      the steps where it was estimated are noted.
    - `duplicated` (distinct examples of a replica also on another replica): exact when every
      replica had at most K distinct examples at that step (computed from the whole sets),
      else at least the largest of the worker's own count and the cross-worker pairs'.
    - window fields (`window_shared`, `steps_shared`, `window_duplicated`): the within-worker
      parts are exact; the cross-worker parts are known only at the logged step and are
      extrapolated to its window (times `window_steps`; a pair counts every step of the window
      as shared when it shared at the logged step). With `update_freq=1` every window is that
      one step and nothing is extrapolated.

    A job whose `[steps, replicas, replicas]` matrices would pass `MAX_PAIR_BYTES` (decided at
    the first worker, from its steps) keeps none and gives no series (noted).
    """

    attribute = "data"

    def __init__(self, expected_workers=1):
        super().__init__(expected_workers)
        self.rows = jobs.StepArrays(expected_workers)
        self.axis = jobs.ReplicaAxis()
        self.replicas = {}
        self.sampled = {}
        self.skipped = False
        self.declared = False
        self.derived = 0  # complete rows whose cross-worker parts are computed

    def add(self, slot, member, since):
        """Writes worker `slot`'s counts, sketches and pair blocks from step `since` on.

        Raises:
          jobs.Irregular: if the worker's replicas changed.
        """
        series = self.series_of(slot, member)
        if series is None:
            return
        if self.replicas.setdefault(slot, series.replicas) != series.replicas:
            raise jobs.Irregular(f"worker slot {slot}: other replicas")
        columns = self.axis.add(slot, series.num_replicas)
        if not self.declared:
            self._declare(series)
            self.declared = True
        self.rows.widen(self.axis.total)
        keep = series.steps >= since if since is not None else slice(None)
        starts = series.window_starts()[keep]
        # Sampled: a window of the steps taken holds steps it did not sample (`DataSeries`).
        spans = series.steps[keep] - starts + 1
        sampled = bool((series.window_steps[keep] < spans).any())
        self.sampled[slot] = self.sampled.get(slot, False) or sampled
        rows = self.rows.place(slot, series.steps[keep])
        if self.skipped:
            return
        for name in ("batch_size", "distinct", "duplicated", "window_duplicated", "sketch"):
            self.rows.write(slot, name, rows, columns, getattr(series, name)[keep])
        for name, values in (("window_steps", series.window_steps[keep]), ("start", starts)):
            self.rows.write(slot, name, rows, slice(slot, slot + 1), values[:, None])
        for name in ("shared", "window_shared", "steps_shared"):
            self.rows.write(slot, name, rows, columns, getattr(series, name)[keep])

    def _declare(self, first):
        replicas = self.expected_workers * first.num_replicas
        size = first.sketch.shape[-1]
        pair_bytes = first.steps.size * replicas * replicas * 3 * 8
        self.skipped = pair_bytes > MAX_PAIR_BYTES
        if self.skipped:  # only the steps are kept, for the note
            return
        for name in ("batch_size", "distinct", "duplicated", "window_duplicated"):
            self.rows.declare(name, (replicas,), np.int64, 0, (0,))
            if name.endswith("duplicated"):
                self.rows.declare(f"{name}_job", (replicas,), np.int64, 0, (0,))
        self.rows.declare("sketch", (replicas, size), np.int64, 0, (0,))
        workers, largest = self.expected_workers, np.iinfo(np.int64)
        self.rows.declare("window_steps", (workers,), np.int64, largest.max, slot_axes=(0,))
        self.rows.declare("start", (workers,), np.int64, largest.min, slot_axes=(0,))
        for name in ("shared", "window_shared", "steps_shared"):
            self.rows.declare(name, (replicas, replicas), np.int64, 0, (0, 1))

    def result(self, job, order, workers, notes):
        """The job's `DataSeries`, or None when no worker (or not every worker: noted) recorded
        example fingerprints, or when its pair matrices would be too large (noted)."""
        if self.absent(workers, order, notes, "example fingerprints", "call observe_examples"):
            return None
        self.rows.drop_dead()
        jobs.common_note(self.rows, order, notes, "data")
        rows, total = self.rows.complete_rows(), self.axis.total
        steps = np.asarray(self.rows.steps[rows], np.int64)
        pair_bytes = len(steps) * total * total * 3 * 8
        if self.skipped or pair_bytes > MAX_PAIR_BYTES:
            self._skip(notes, len(steps), total)
            return None
        columns = self.axis.order(order)
        per_worker = [
            self.rows.view(n, rows, len(order))[:, order] for n in ("window_steps", "start")
        ]
        windows, starts = per_worker
        if windows.size and np.any(windows != windows[:, :1]):
            notes.append(
                "data: the workers' logging windows differ; the job view uses the shortest window "
                "of each logged step."
            )
        window_steps = windows.min(axis=1) if windows.size else np.zeros(0, np.int64)
        estimated = self._cross(order, window_steps)
        view = {n: self.rows.view(n, rows, total, columns) for n in self.rows.arrays}
        self._notes(notes, estimated, len(steps), window_steps, view["sketch"].shape[-1])
        return DataSeries(
            run=job,
            replicas=[r for slot in order for r in self.replicas[slot]],
            steps=steps,
            window_steps=window_steps.astype(np.int64),
            batch_size=view["batch_size"],
            distinct=view["distinct"],
            duplicated=view["duplicated_job"],
            window_duplicated=view["window_duplicated_job"],
            shared=view["shared"],
            window_shared=view["window_shared"],
            steps_shared=view["steps_shared"],
            sketch=view["sketch"],
            notes=notes,
            # The shortest window of each logged step (as window_steps); sampled when any was.
            window_start=starts.max(axis=1).astype(np.int64) if starts.size else starts[:, 0],
            sampled=any(self.sampled[slot] for slot in order),
        )

    def _skip(self, notes, steps, total):
        """Drops the job's arrays for good (a job only grows: its steps are still counted) and
        notes it."""
        self.skipped = True
        for name in list(self.rows.arrays):
            self.rows.forget(name)
        notes.append(
            f"data: the examples shared across workers are not computed for this job: its "
            f"{steps} logged steps × {total}² replica pairs would take "
            f"{steps * total * total * 3 * 8 / 2**30:.0f} GiB. Each worker's run shows its own "
            "replicas' overlap; log examples less often (`examples_every`) to compare across "
            "workers."
        )

    def _cross(self, order, window_steps):
        """Computes the cross-worker parts of the complete rows not computed yet (those written
        again included); returns the rows (of all) where they were estimated."""
        self.derived = min(self.derived, self.rows.changed_from)
        self.rows.clear_changed()
        rows = np.arange(self.rows.size)[self.rows.complete_rows()]
        arrays, total = self.rows.arrays, self.axis.total
        owner = np.concatenate(
            [np.full(count, slot) for slot, count in self.axis.counts.items()] or [[]]
        )
        cross = owner[:, None] != owner[None, :]
        size = arrays["sketch"].shape[-1]
        for k, row in enumerate(rows):
            if row < self.derived:
                continue
            distinct = arrays["distinct"][row, :total]
            pairs, _, found = sketch_overlaps(arrays["sketch"][row, :total], distinct)
            own = arrays["duplicated"][row, :total]
            shared = np.where(cross, pairs, arrays["shared"][row, :total, :total])
            arrays["shared"][row, :total, :total] = shared
            if np.all(distinct <= size):
                duplicated = found  # every set is whole: exact
            else:
                across = np.where(cross, shared, 0).max(axis=1)
                duplicated = np.minimum(np.maximum(own, across), distinct)
            arrays["duplicated_job"][row, :total] = duplicated
            span = max(int(window_steps[k]), 1)
            block = (row, slice(0, total), slice(0, total))
            arrays["window_shared"][block] = np.where(
                cross, shared * span, arrays["window_shared"][block]
            )
            arrays["steps_shared"][block] = np.where(
                cross, np.where(shared > 0, span, 0), arrays["steps_shared"][block]
            )
            arrays["window_duplicated_job"][row, :total] = np.maximum(
                arrays["window_duplicated"][row, :total], duplicated * span
            )
        self.derived = self.rows.size
        distinct = arrays["distinct"][rows, :total]
        return int((distinct > size).any(axis=1).sum())

    @staticmethod
    def _notes(notes, estimated, steps, window_steps, size):
        if estimated:
            notes.append(
                f"data: at {estimated} of {steps} logged step(s) a replica had more than "
                f"{size} distinct examples; the examples shared across workers are estimated "
                f"there from bottom-{size} sketches (exact within a worker)."
            )
        if np.any(window_steps > 1):
            notes.append(
                "data: not every step is logged; the examples shared across workers are known "
                "at the logged steps and extrapolated to the steps between them (exact within a "
                "worker)."
            )
