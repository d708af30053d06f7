"""The gradients family read side: `GradientsSeries` from the samples, and its merge.

Imports no TensorFlow.
"""

import dataclasses
import json

import numpy as np

from tb_replica_plugin.core import columns, jobs
from tb_replica_plugin.families.gradients import schema

# What the norms of each `GradientsSeries.scaling` are of, in words.
SCALING_WORDS = {
    "replica_loss": "gradient of each replica's own loss",
    "as_given": "gradients as given",
}


def scaling_text(scaling):
    """What the recorded norms are of, in words (`GradientsSeries.scaling`).

    Args:
      scaling: "replica_loss", "as_given", or for a job whose workers recorded different
        scalings, those joined with "," (`merge_gradients`).

    Returns:
      E.g. "gradients as given"; for different scalings, that they differ and are not
      comparable across workers.
    """
    words = [SCALING_WORDS.get(kind, SCALING_WORDS["as_given"]) for kind in scaling.split(",")]
    if len(words) == 1:
        return words[0]
    return (
        f"scalings differ across workers: {', '.join(words)}; norms not comparable across workers"
    )


@dataclasses.dataclass
class CapturedBatch:
    """One replica's local batch, captured at a step where its gradients or loss turned non-finite.

    Attributes:
      step: the step.
      replica: the global replica id.
      arrays: `{input name: numpy array}` (e.g. "x", "y", "x/image"), the kept rows.
      shapes: `{input name: full shape}` of each input in the step (before any truncation).
      truncated: names of the inputs of which only the first rows were kept (`capture_bytes`).
      nonfinite_examples: `{input name: [example indices]}`: rows holding a NaN or an Inf
        (floating inputs only; indices into the replica's local batch).
    """

    step: int
    replica: int
    arrays: dict
    shapes: dict
    truncated: list
    nonfinite_examples: dict

    def to_json(self):
        """The JSON-ready summary (no arrays): step, replica, shapes, dtypes, non-finite rows."""
        return {
            "step": self.step,
            "replica": self.replica,
            "inputs": [
                {
                    "name": name,
                    "dtype": str(array.dtype),
                    "shape": list(self.shapes[name]),
                    "kept_rows": int(array.shape[0]) if array.ndim else None,
                    "truncated": name in self.truncated,
                    "nonfinite_examples": self.nonfinite_examples.get(name, []),
                }
                for name, array in self.arrays.items()
            ],
        }


def _tensor(data):
    from tensorboard.compat.proto import tensor_pb2
    from tensorboard.util import tensor_util

    return tensor_util.make_ndarray(tensor_pb2.TensorProto.FromString(bytes(data)))


def nonfinite_rows(array):
    """Indices of the rows (examples) of `array` holding a NaN or an Inf ([] unless floating)."""
    if array.ndim == 0 or not np.issubdtype(array.dtype, np.floating) or array.shape[0] == 0:
        return []
    bad = ~np.isfinite(array.reshape(array.shape[0], -1))
    return np.flatnonzero(bad.any(axis=1)).tolist()


def parse_batches(step, value):
    """The `CapturedBatch`es of one `gradients/batch` event (see `schema.TAG_GRAD_BATCH`).

    Raises:
      ValueError: if the event is not of that layout.
    """
    parts = list(np.asarray(value, dtype=object).reshape(-1))
    batches = []
    at = 0
    while at < len(parts):
        head = parts[at]
        header = json.loads(head.decode("utf-8") if isinstance(head, bytes) else head)
        count = int(header["leaves"])
        names = [str(n) for n in header["names"]]
        if len(names) != count or at + 1 + 2 * count > len(parts):
            raise ValueError("a captured batch block is incomplete")
        arrays, shapes, truncated = {}, {}, []
        for index, name in enumerate(names):
            shape = [int(d) for d in _tensor(parts[at + 1 + 2 * index]).tolist()]
            array = _tensor(parts[at + 2 + 2 * index])
            arrays[name], shapes[name] = array, shape
            if array.ndim and shape and array.shape[0] < shape[0]:
                truncated.append(name)
        found = {name: nonfinite_rows(a) for name, a in arrays.items()}
        batches.append(
            CapturedBatch(
                step=int(step),
                replica=int(header["replica"]),
                arrays=arrays,
                shapes=shapes,
                truncated=truncated,
                nonfinite_examples={name: rows for name, rows in found.items() if rows},
            )
        )
        at += 1 + 2 * count
    return batches


@dataclasses.dataclass
class GradientsSeries:
    """The gradients family of one run: local (pre all-reduce) gradient health per replica.

    Attributes:
      run: the run name.
      replicas: global replica ids, the order of every per-replica axis.
      variables: names of the variables whose gradient norms are recorded (V).
      shapes: shape of each variable.
      has_loss: whether the replicas' losses were recorded (else `loss` is NaN).
      scaling: what the norms are of: "replica_loss" (the gradient of each replica's own loss,
        Keras distribution scaling and loss scale undone) or "as_given" (as passed, divided by
        the `scale` given to `observe_gradients`); for a job whose workers differ, their
        scalings sorted and joined with "," (e.g. "as_given,replica_loss"; `scaling_text`).
      steps: int64 [S]: the logged steps (dense series).
      global_norm: float64 [S, R]: each replica's local gradient global norm.
      loss: float64 [S, R]: each replica's local loss.
      variable_norms: float64 [S, V, R]: the norm of each variable's gradient per replica.
      nonfinite_steps: int64 [E]: every step at which some replica had a NaN or Inf (gradients
        or loss), logged or not.
      nonfinite: int64 [E, 4, R]: at those steps, per replica: NaN values in gradients, Inf
        values in gradients, loss is NaN (0/1), loss is Inf (0/1).
      loss_scaled: whether a loss-scale optimizer was in use (`fit` with mixed precision): its
        overflow steps are expected and skipped by the optimizer.
      batches: the captured culprit batches (`CapturedBatch`), by step then replica.
      plain_faults: int64 [3, R] or None: per replica, the steps neither logged nor sampled
        whose gradients or loss held NaN/Inf (the device fault record, `gradients/plain_faults`):
        how many, the first and the last (-1: none); only those two are among the events.
      strategy: "ParameterServerStrategy" when each replica is a worker of that strategy, else
        "" (docs/parameter-server.md).
    """

    run: str
    replicas: list
    variables: list
    shapes: list
    has_loss: bool
    scaling: str
    steps: np.ndarray
    global_norm: np.ndarray
    loss: np.ndarray
    variable_norms: np.ndarray
    nonfinite_steps: np.ndarray
    nonfinite: np.ndarray
    loss_scaled: bool = False
    batches: list = dataclasses.field(default_factory=list)
    plain_faults: np.ndarray = None
    strategy: str = ""
    # `rules.global_ratio`'s `(global_norm, its ratio to the median)`: computed once per series.
    ratio_cache: tuple = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @property
    def num_replicas(self):
        return len(self.replicas)

    def batch(self, step, replica):
        """The `CapturedBatch` of `replica` at `step`.

        Raises:
          KeyError: naming the captured (step, replica) pairs when there is no such batch.
        """
        for captured in self.batches:
            if captured.step == int(step) and captured.replica == int(replica):
                return captured
        pairs = ", ".join(f"step {b.step} replica {b.replica}" for b in self.batches) or "none"
        raise KeyError(
            f"no batch captured at step {step} for replica {replica} (captured: {pairs})"
        )


def _same_columns(a, b):
    """Whether two `ReplicaAxis.order` results (None or index arrays) are the same order."""
    if a is None or b is None:
        return a is None and b is None
    return np.array_equal(a, b)


def from_samples(run, samples, notes, needed=None):
    """Builds the `GradientsSeries` of a run from its raw samples, or None without any.

    Args:
      run: the run name.
      samples: `RunData.samples`, `{tag: [(step, numpy value)]}` sorted by step.
      notes: the run's notes list (problems are appended to it).
      needed: unused.

    Returns:
      A `GradientsSeries`, or None when the run has no gradient tags.
    """
    tags = (
        schema.TAG_GRAD_NORMS,
        schema.TAG_GRAD_NONFINITE,
        schema.TAG_GRAD_VARIABLES,
        schema.TAG_GRAD_BATCH,
        schema.TAG_GRAD_PLAIN_FAULTS,
    )
    if not any(samples.get(tag) for tag in tags):
        return None
    batches = _captured_batches(samples, notes)
    last, names = _last_variables(samples, notes)
    dense = [
        group
        for group in columns.by_shape(samples.get(schema.TAG_GRAD_NORMS, []), np.float64)
        if len(group.shape) == 2
    ]
    nonfinite = [
        group
        for group in columns.by_shape(samples.get(schema.TAG_GRAD_NONFINITE, []), np.int64)
        if len(group.shape) == 2 and group.shape[0] == 4
    ]
    width, names = _norms_width(names, dense)
    replicas_of = {group.shape[1] for group in dense + nonfinite}
    num_replicas = len(last.get("replicas", [])) or (max(replicas_of) if replicas_of else 0)
    kept = [group for group in dense if group.shape == (width, num_replicas)]
    skipped = sum(map(len, dense)) - sum(map(len, kept))
    if skipped or len(dense) > 1:
        notes.append(
            f"{skipped} gradient-norm sample(s) with another variable or replica "
            "count were skipped (only the last variable list is shown)."
        )
    nonfinite = [group for group in nonfinite if group.shape[1] == num_replicas]
    steps, stacked = _stacked_by_step(kept, ((width or 2), num_replicas), np.float64)
    event_steps, events = _stacked_by_step(nonfinite, (4, num_replicas), np.int64)
    return GradientsSeries(
        run=run,
        replicas=[int(r) for r in last.get("replicas", range(num_replicas))],
        variables=names,
        shapes=[list(s) for s in last.get("shapes", [[]] * len(names))],
        has_loss=bool(last.get("loss", False)),
        scaling=str(last.get("scaling", "")),
        steps=steps,
        global_norm=stacked[:, 0, :],
        loss=stacked[:, 1, :],
        variable_norms=stacked[:, 2:, :],
        nonfinite_steps=event_steps,
        nonfinite=events,
        loss_scaled=bool(last.get("loss_scaled", False)),
        batches=batches,
        plain_faults=_plain_faults(samples, num_replicas),
        strategy=str(last.get("strategy", "")),
    )


def _plain_faults(samples, num_replicas):
    """The last `gradients/plain_faults` record of the run's replica count (int64 [3, R]), or
    None."""
    for _, value in reversed(samples.get(schema.TAG_GRAD_PLAIN_FAULTS, [])):
        value = np.asarray(value)
        if value.shape == (len(schema.PLAIN_FAULT_ROWS), num_replicas):
            return value.astype(np.int64)
    return None


def _captured_batches(samples, notes):
    """The `CapturedBatch`es of a run's `gradients/batch` events (a note per unreadable one)."""
    batches = []
    for step, value in samples.get(schema.TAG_GRAD_BATCH, []):
        try:
            batches.extend(parse_batches(step, value))
        except Exception:  # noqa: BLE001 - a bad event must not hide the rest of the run
            notes.append(f"An unreadable gradients/batch event at step {step} was skipped.")
    return batches


def _last_variables(samples, notes):
    """The run's last readable `gradients/variables` document.

    Args:
      samples: `RunData.samples`.
      notes: the run's notes (one per unreadable event).

    Returns:
      `(document, names)`: the parsed document and its variable names, or `({}, None)` when the
      run has none.
    """
    last, names = {}, None
    for step, value in samples.get(schema.TAG_GRAD_VARIABLES, []):
        try:
            text = value.item()
            text = text.decode("utf-8") if isinstance(text, bytes) else text
            parsed = json.loads(text)
            last, names = parsed, [str(n) for n in parsed["variables"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            notes.append(f"An unreadable gradients/variables event at step {step} was skipped.")
    return last, names


def _norms_width(names, dense):
    """The rows of a gradient-norms sample (global norm, loss, one per variable), and the names.

    Args:
      names: the last variables document's names, or None without one.
      dense: the run's 2-D norms samples by shape (`columns.Shaped`, the last sample's last).

    Returns:
      `(width, names)`: width from the document, else from the last sample (its variables
      named "variable i"), else None (and no names).
    """
    if names is not None:
        return len(names) + 2, names
    if dense:
        width = dense[-1].shape[0]
        return width, [f"variable {i}" for i in range(width - 2)]
    return None, []


def _stacked_by_step(groups, shape, dtype):
    """`(steps, stacked)`: the steps of `groups` (`columns.Shaped`, at most one) in order, and
    their values (a later sample at the same step wins; `(0, *shape)` zeros of `dtype` when
    there are none)."""
    if not groups:
        return np.zeros(0, np.int64), np.zeros((0, *shape), dtype)
    return columns.last_per_step(groups[0].steps, groups[0].values)


def _scalings_note(scalings, workers):
    """The job's note when its workers recorded gradients of different scalings."""
    each = "; ".join(
        f"{w['name']}: {scaling_text(s)}" for w, s in zip(workers, scalings, strict=True)
    )
    return (
        f"The workers recorded gradients of different scalings ({each}): the norms of replicas "
        "on different workers are not comparable."
    )


class GradientsMerger(jobs.Merger):
    """Every worker's local gradient health on one global replica axis (`jobs.Merger`).

    Per-replica norms and losses are written in global replica order at the logged steps every
    worker has (the others are noted). NaN/Inf events are kept at every step any worker had one
    (a worker without an event at that step counts 0 for its replicas). When the workers
    recorded different variable lists, the global norms and losses are still merged and the
    per-variable norms left out (noted).

    Example:
      >>> merger = GradientsMerger(expected_workers=2)
      >>> for slot, member in enumerate(members):  # the workers' RunData, in worker order
      ...     merger.add(slot, member, None)
      >>> merger.result("job", [0, 1], workers, []).global_norm.shape
      (5, 4)
    """

    attribute = "gradients"

    def __init__(self, expected_workers=1):
        super().__init__(expected_workers)
        self.rows = jobs.StepArrays(expected_workers)
        self.axis = jobs.ReplicaAxis()
        self.layouts = {}  # slot -> what must not change: variables, shapes, loss, scaling
        self.events = {}  # slot -> {step: int64 [4, R]}
        self.batches = {}  # slot -> [CapturedBatch]
        self.replicas = {}
        # The last result's global norms' ratio to the median: `(columns, total, ratio)`.
        self.ratio = (None, 0, np.zeros((0, 0)))

    def add(self, slot, member, since):
        """Writes worker `slot`'s norms, losses and events from step `since` on (all: None).

        Raises:
          jobs.Irregular: if the worker's variables, scaling or replicas changed.
        """
        series = self.series_of(slot, member)
        if series is None:
            return
        self._check_layout(slot, series)
        columns = self.axis.add(slot, series.num_replicas)
        if not self.rows.arrays:
            self._declare(len(series.variables), series.num_replicas)
        self.rows.widen(self.axis.total)
        self._write_norms(slot, series, columns, since)
        events = self.events.setdefault(slot, {})
        for step, counts in zip(series.nonfinite_steps.tolist(), series.nonfinite, strict=True):
            if since is None or step >= since:
                events[step] = counts
        kept = [b for b in self.batches.get(slot, []) if since is None or b.step < since]
        self.batches[slot] = kept + [b for b in series.batches if since is None or b.step >= since]

    def _check_layout(self, slot, series):
        layout = (
            series.variables,
            series.shapes,
            series.has_loss,
            series.scaling,
            series.loss_scaled,
            series.replicas,
        )
        if self.layouts.setdefault(slot, layout) != layout:
            raise jobs.Irregular(f"worker slot {slot}: other gradients layout")
        self.replicas[slot] = series.replicas

    def _declare(self, variables, replicas):
        width = self.expected_workers * replicas
        self.rows.declare("global_norm", (width,), np.float64, np.nan, (0,))
        self.rows.declare("loss", (width,), np.float64, np.nan, (0,))
        self.rows.declare("variable_norms", (variables, width), np.float64, np.nan, (1,))

    def _write_norms(self, slot, series, columns, since):
        keep = series.steps >= since if since is not None else slice(None)
        rows = self.rows.place(slot, series.steps[keep])
        self.rows.write(slot, "global_norm", rows, columns, series.global_norm[keep])
        self.rows.write(slot, "loss", rows, columns, series.loss[keep])
        if series.variable_norms.shape[1] == self.rows.arrays["variable_norms"].shape[1]:
            self.rows.write(slot, "variable_norms", rows, columns, series.variable_norms[keep])

    def result(self, job, order, workers, notes):
        """The job's `GradientsSeries`, or None when no worker (or not every worker: noted)
        recorded gradients."""
        how = "call observe_gradients on every worker"
        if self.absent(workers, order, notes, "gradients", how):
            return None
        layouts = [self.layouts[slot] for slot in order]
        same_variables = all(layout[0] == layouts[0][0] for layout in layouts)
        if not same_variables:
            notes.append(
                "The workers recorded gradients of different variable lists: the job view shows "
                "each replica's global norm and loss, not the per-variable norms."
            )
        self.rows.drop_dead()
        jobs.common_note(self.rows, order, notes, "gradients")
        rows, total, columns = self.rows.complete_rows(), self.axis.total, self.axis.order(order)

        def view(name):
            return self.rows.view(name, rows, total, columns)

        steps = np.asarray(self.rows.steps[rows], np.int64)
        norms = view("variable_norms") if same_variables else np.zeros((len(steps), 0, total))
        event_steps, events = self._events(order)
        scalings = {layout[3] for layout in layouts}
        if len(scalings) > 1:
            notes.append(_scalings_note([layout[3] for layout in layouts], workers))
        series = GradientsSeries(
            run=job,
            replicas=[r for slot in order for r in self.replicas[slot]],
            variables=list(layouts[0][0]) if same_variables else [],
            shapes=list(layouts[0][1]) if same_variables else [],
            has_loss=all(layout[2] for layout in layouts),
            scaling=scalings.pop() if len(scalings) == 1 else ",".join(sorted(scalings)),
            steps=steps,
            global_norm=view("global_norm"),
            loss=view("loss"),
            variable_norms=norms,
            nonfinite_steps=event_steps,
            nonfinite=events,
            loss_scaled=any(layout[4] for layout in layouts),
            batches=sorted(
                (b for slot in order for b in self.batches[slot]), key=lambda b: (b.step, b.replica)
            ),
        )
        series.ratio_cache = (series.global_norm, self._global_ratio(rows, columns, series))
        return series

    def _global_ratio(self, rows, columns, series):
        """`rules.ratio_to_median` of the job's global norms: the rows of the last result that
        no worker wrote again keep their ratios (a row's ratio depends on that row only), the
        others are computed (all of them when the rows or the replica axis moved)."""
        from tb_replica_plugin.families.gradients import rules

        last_columns, last_total, last = self.ratio
        kept = min(len(last), self.rows.changed_from)
        self.rows.clear_changed()
        same_axis = last_total == self.axis.total and _same_columns(last_columns, columns)
        if not isinstance(rows, slice) or not same_axis:
            kept = 0
        ratio = np.empty(series.global_norm.shape)
        if kept:
            ratio[:kept] = last[:kept]
        ratio[kept:] = rules.ratio_to_median(series.global_norm[kept:])
        self.ratio = (columns, self.axis.total, ratio)
        return ratio

    def _events(self, order):
        """`(steps, int64 [E, 4, R])`: every step any worker had a NaN/Inf event at."""
        steps = np.array(sorted(set().union(*(self.events[slot] for slot in order))), np.int64)
        events = np.zeros((steps.size, 4, self.axis.total), np.int64)
        column = 0
        for slot in order:
            width = len(self.replicas[slot])
            for step, counts in self.events[slot].items():
                events[np.searchsorted(steps, step), :, column : column + width] = counts
            column += width
        return steps, events
