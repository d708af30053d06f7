"""The gradients family read side: `GradientsSeries` from the samples, and its merge.

Imports no TensorFlow.
"""

import dataclasses
import json

import numpy as np

from tb_replica_plugin.core import jobs
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
    )
    if not any(samples.get(tag) for tag in tags):
        return None
    batches = []
    for step, value in samples.get(schema.TAG_GRAD_BATCH, []):
        try:
            batches.extend(parse_batches(step, value))
        except Exception:  # noqa: BLE001 - a bad event must not hide the rest of the run
            notes.append(f"An unreadable gradients/batch event at step {step} was skipped.")
    documents = []
    for step, value in samples.get(schema.TAG_GRAD_VARIABLES, []):
        try:
            text = value.item()
            text = text.decode("utf-8") if isinstance(text, bytes) else text
            parsed = json.loads(text)
            documents.append((step, parsed, [str(n) for n in parsed["variables"]]))
        except (ValueError, KeyError, TypeError, AttributeError):
            notes.append(f"An unreadable gradients/variables event at step {step} was skipped.")
    last = documents[-1][1] if documents else {}
    names = documents[-1][2] if documents else []
    dense = [
        (int(step), np.asarray(value, np.float64))
        for step, value in samples.get(schema.TAG_GRAD_NORMS, [])
        if np.ndim(value) == 2
    ]
    counts = {value.shape for _, value in dense}
    if documents:
        width = len(names) + 2
    elif dense:
        width = dense[-1][1].shape[0]
        names = [f"variable {i}" for i in range(width - 2)]
    else:
        width = None
    replicas_of = {value.shape[1] for _, value in dense}
    nonfinite = [
        (int(step), np.asarray(value, np.int64))
        for step, value in samples.get(schema.TAG_GRAD_NONFINITE, [])
        if np.ndim(value) == 2 and np.shape(value)[0] == 4
    ]
    replicas_of |= {value.shape[1] for _, value in nonfinite}
    num_replicas = len(last.get("replicas", [])) or (max(replicas_of) if replicas_of else 0)
    kept = [(s, v) for s, v in dense if v.shape == (width, num_replicas)]
    if len(kept) < len(dense) or len(counts) > 1:
        notes.append(
            f"{len(dense) - len(kept)} gradient-norm sample(s) with another variable or replica "
            "count were skipped (only the last variable list is shown)."
        )
    nonfinite = [(s, v) for s, v in nonfinite if v.shape[1] == num_replicas]
    by_step = dict(kept)  # a later write at the same step wins
    steps = np.array(sorted(by_step), np.int64)
    stacked = (
        np.stack([by_step[s] for s in steps.tolist()])
        if steps.size
        else np.zeros((0, (width or 2), num_replicas))
    )
    events = dict(nonfinite)
    event_steps = np.array(sorted(events), np.int64)
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
        nonfinite=(
            np.stack([events[s] for s in event_steps.tolist()])
            if event_steps.size
            else np.zeros((0, 4, num_replicas), np.int64)
        ),
        loss_scaled=bool(last.get("loss_scaled", False)),
        batches=batches,
    )


def _scalings_note(series, workers):
    """The job's note when its workers recorded gradients of different scalings."""
    each = "; ".join(
        f"{w['name']}: {scaling_text(s.scaling)}" for w, s in zip(workers, series, strict=True)
    )
    return (
        f"The workers recorded gradients of different scalings ({each}): the norms of replicas "
        "on different workers are not comparable."
    )


def merge_gradients(job, member_runs, workers, notes):
    """Every worker's local gradient health on one global replica axis.

    Per-replica norms and losses are concatenated in global replica order at the logged steps
    every worker has (the others are noted). NaN/Inf events are kept at every step any worker
    had one (a worker without an event at that step counts 0 for its replicas). When the
    workers recorded different variable lists, the global norms and losses are still merged and
    the per-variable norms left out (noted).

    Returns:
      A `GradientsSeries`, or None when no worker (or not every worker: noted) recorded
      gradients.
    """
    series = jobs.members_with(
        "gradients",
        member_runs,
        workers,
        notes,
        "gradients",
        "call observe_gradients on every worker",
    )
    if series is None:
        return None
    same_variables = all(s.variables == series[0].variables for s in series)
    if not same_variables:
        notes.append(
            "The workers recorded gradients of different variable lists: the job view shows "
            "each replica's global norm and loss, not the per-variable norms."
        )
    steps = jobs.common_steps(series, notes, "gradients")
    at = [np.searchsorted(s.steps, steps).astype(np.int64) for s in series]

    def concat(field):
        return np.concatenate([getattr(s, field)[i] for s, i in zip(series, at, strict=True)], -1)

    total = sum(s.num_replicas for s in series)
    variable_norms = (
        concat("variable_norms") if same_variables else np.zeros((len(steps), 0, total))
    )
    event_steps = np.array(
        sorted(set().union(*(s.nonfinite_steps.tolist() for s in series))), np.int64
    )
    events = np.zeros((event_steps.size, 4, total), np.int64)
    column = 0
    for s in series:
        where = np.searchsorted(event_steps, s.nonfinite_steps)
        events[where, :, column : column + s.num_replicas] = s.nonfinite
        column += s.num_replicas
    scalings = {s.scaling for s in series}
    if len(scalings) > 1:
        notes.append(_scalings_note(series, workers))
    return GradientsSeries(
        run=job,
        replicas=[r for s in series for r in s.replicas],
        variables=list(series[0].variables) if same_variables else [],
        shapes=list(series[0].shapes) if same_variables else [],
        has_loss=all(s.has_loss for s in series),
        scaling=scalings.pop() if len(scalings) == 1 else ",".join(sorted(scalings)),
        steps=np.array(steps, np.int64),
        global_norm=concat("global_norm"),
        loss=concat("loss"),
        variable_norms=variable_norms,
        nonfinite_steps=event_steps,
        nonfinite=events,
        loss_scaled=any(s.loss_scaled for s in series),
        batches=sorted((b for s in series for b in s.batches), key=lambda b: (b.step, b.replica)),
    )
