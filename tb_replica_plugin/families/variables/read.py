"""The variables family read side: `VariablesSeries` (weight drift, placement) and its merge.

Imports no TensorFlow.
"""

import dataclasses
import functools
import json
import math

import numpy as np

from tb_replica_plugin.families.variables import schema


@dataclasses.dataclass
class VariablesSeries:
    """The variables family (weight drift and placement) of one run.

    Axes: S logged steps, V variables (the order of `variables`), R local replicas, K sketch
    buckets. Divergence is always of replica r's copy from replica 0's copy; it is exactly 0
    where the bitwise hashes are equal, and NaN where either replica holds no copy.

    Attributes:
      run: the run name.
      replicas: replica ids (the R axis); devices: the device of each replica.
      source: what wrote the run ("fit", "custom_loop").
      central_storage: the strategy keeps one copy of each variable on a parameter device on
        purpose (CentralStorageStrategy): variables are not expected to be mirrored.
      variables: one dict per variable, from the latest placement event: `name`, `shape`,
        `dtype`, `trainable`, `sync` ("on_write", "on_read", "none"), `devices` (of its copies),
        `columns` (replica position of each copy, -1 when on no replica device), `mirrored`.
      placement_events: `[(step, document)]` of every placement event.
      steps: int64 [S] logged steps (values after the update of that step).
      hash: int64 [S, V, R] bitwise hash of each copy; present: bool [V, R].
      rows: float64 [N, 4 + K]: the fingerprints read (min, max, sum, sum of squares, then the
        sketch), each once; row_of: int64 [S, V, R]: the row of each copy's fingerprint (-1:
        none; a copy bit-identical to replica 0's has replica 0's row). `stats` [S, V, R, 4] and
        `sketch` [S, V, R, K] are their dense views (NaN where none), built on access.
      identical: bool [S, V, R]: copy r is bit-identical to copy 0 (hashes equal, by the same
        algorithm).
      hash_comparable: bool [V, R]: copies r and 0 exist and were hashed by the same algorithm
        (placement `"hash"` per copy: "farmhash64" on CPU, "mix64" elsewhere; logs of
        fingerprint version 1 used "mix64" everywhere). Elsewhere bit identity is unknown and
        only the sketch compares the copies.
      l2_estimate, rel_l2_estimate: float64 [S, V, R]: ||copy_r - copy_0|| and that over
        ||copy_0||, estimated from the sketches (exact for variables of at most K elements).
      max_abs_lower: float64 [S, V, R]: a lower bound of max |copy_r - copy_0| from the stats
        (exact for variables of at most K elements).
      exact: bool [S]: the exact check ran at that step; exact_max_abs, exact_l2, exact_rel_l2:
        float64 [S, V, R], NaN where it did not run.
      rel_l2, max_abs: float64 [S, V, R]: the exact value where it ran, else the estimate (rel
        L2) or the lower bound (max-abs). Where these arrays hold the same values (every copy
        bit-identical to replica 0's, no exact check) they are one read-only array.
      coverage: float64 [S, V]: the fraction of each variable's elements the check at that step
        read (1.0: whole; less at a rotating check, `variables/window`, whose hash, fingerprint
        and drift are those of the slice it read).
      rotation: the placement's rotation (`{"period", "budget", "whole_elements"}`) or None.
      notes: plain-language problems met while reading.
    """

    run: str
    replicas: list
    devices: list
    source: str
    central_storage: bool
    variables: list
    placement_events: list
    steps: np.ndarray
    hash: np.ndarray
    present: np.ndarray
    rows: np.ndarray
    row_of: np.ndarray
    identical: np.ndarray
    hash_comparable: np.ndarray
    l2_estimate: np.ndarray
    rel_l2_estimate: np.ndarray
    max_abs_lower: np.ndarray
    exact: np.ndarray
    exact_max_abs: np.ndarray
    exact_l2: np.ndarray
    exact_rel_l2: np.ndarray
    rel_l2: np.ndarray
    max_abs: np.ndarray
    coverage: np.ndarray
    rotation: dict
    notes: list

    @property
    def num_replicas(self):
        return len(self.replicas)

    @property
    def stats(self):
        """float64 [S, V, R, 4]: every copy's stats (built from `rows` on each access)."""
        return dense_fingerprints(self.rows, self.row_of)[..., :4]

    @property
    def sketch(self):
        """float64 [S, V, R, K]: every copy's sketch (built from `rows` on each access)."""
        return dense_fingerprints(self.rows, self.row_of)[..., 4:]

    @property
    def names(self):
        return [v["name"] for v in self.variables]


def _relative(l2, norm0):
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = l2 / norm0
    rel = np.where((norm0 == 0) & (l2 == 0), 0.0, rel)
    return np.where((norm0 == 0) & (l2 > 0), np.inf, rel)


def compact_fingerprints(samples, hashes):
    """Every copy's fingerprint as `(rows, row_of)`, each written fingerprint kept once.

    Args:
      samples: one `variables/fingerprint` value per step: float64 [V, R, 4 + K] (version 1),
        or [U, 2 + 4 + K] rows `(v, r, fingerprint)` (version 2).
      hashes: int64 [S, V, R] of the same steps.

    Returns:
      `(rows, row_of)`: float64 [N, 4 + K] fingerprints and int64 [S, V, R] the row of each
      copy's (-1: none). A copy without a row in a version-2 sample whose hash equals replica
      0's copy's has replica 0's row: the writer left it out for being exactly that.
    """
    shape = hashes.shape
    ids = schema.FINGERPRINT_ID_COLUMNS
    widths = {v.shape[-1] - (ids if v.ndim == 2 else 0) for v in samples}
    width = widths.pop() if len(widths) == 1 else 4  # mixed widths: none is comparable
    row_of = np.full(shape, -1, dtype=np.int64)
    tables, count = [], 0
    written, at = [], []
    for i, value in enumerate(samples):
        if value.ndim == 3 and value.shape[-1] == width:  # version 1: every copy
            tables.append(value.reshape(-1, width))
            row_of[i] = count + np.arange(value.shape[0] * value.shape[1]).reshape(shape[1:])
            count += len(tables[-1])
        elif value.ndim == 2 and value.shape[-1] == width + ids:
            written.append(value)
            at.append(i)
    if written:
        table = np.concatenate(written)
        # The step index of each row, without an array per step (a long run has 100k of them).
        at = np.repeat(np.array(at, dtype=np.int64), [len(v) for v in written])
        v, r = table[:, 0], table[:, 1]
        valid = (v >= 0) & (v < shape[1]) & (r >= 0) & (r < shape[2]) & (v == np.floor(v))
        if not valid.all():  # copies only when a row names no copy (a corrupt sample)
            table, at, v, r = table[valid], at[valid], v[valid], r[valid]
        row_of[at, v.astype(np.int64), r.astype(np.int64)] = count + np.arange(len(table))
        tables.append(table[:, ids:])  # a view: the id columns stay in memory, unread
        first = row_of[:, :, :1]
        from_0 = (row_of < 0) & (first >= 0) & (hashes == hashes[:, :, :1]) & (hashes != 0)
        row_of = np.where(from_0, first, row_of)
    if not tables:
        return np.zeros((0, width)), row_of
    rows = tables[0] if len(tables) == 1 else np.concatenate(tables)
    return rows.astype(np.float64, copy=False), row_of


def dense_fingerprints(rows, row_of):
    """float64 `row_of.shape + [4 + K]`: `rows[row_of]`, NaN where `row_of` is -1."""
    if not len(rows):
        return np.full(row_of.shape + rows.shape[-1:], np.nan)
    taken = rows[np.maximum(row_of, 0)]
    taken[row_of < 0] = np.nan
    return taken


def fingerprint_column(rows, row_of, column):
    """float64 `row_of.shape`: `rows[row_of, column]`, NaN where `row_of` is -1 (one column of
    `dense_fingerprints` without the others)."""
    if not len(rows):
        return np.full(row_of.shape, np.nan)
    taken = rows[np.maximum(row_of, 0), column]
    taken[row_of < 0] = np.nan
    return taken


def build_variables_series(
    run, placement_events, hash_points, fingerprint_points, exact_points, window_points=()
):
    """Builds a `VariablesSeries` from decoded samples (pure; no data provider needed).

    Args:
      run: the run name.
      placement_events: `[(step, document dict)]`.
      hash_points: `[(step, int64 [V, R])]`; fingerprint_points: `[(step, float64 [V, R, 4+K])]`
        or `[(step, float64 [U, 2 + 4 + K])]` rows (`compact_fingerprints`); exact_points:
        `[(step, float64 [V, R, 2])]`; window_points: `[(step, int64 [V, 2])]` (rotating
        checks; the last event of a step wins, as for every tag: a full check at an epoch end
        comes after the rotating check of that step).

    Returns:
      A `VariablesSeries`, or None when there is no placement event.
    """
    notes = []
    if not placement_events:
        return None
    placement_events = sorted(placement_events, key=lambda p: p[0])
    document = placement_events[-1][1]
    num_v, num_r = len(document.get("variables", [])), len(document.get("devices", []))
    hashes = {s: v for s, v in hash_points if v.shape == (num_v, num_r)}
    fingerprints = {
        s: v
        for s, v in fingerprint_points
        if (v.ndim == 3 and v.shape[:2] == (num_v, num_r))
        or (v.ndim == 2 and v.shape[1] > schema.FINGERPRINT_ID_COLUMNS)
    }
    exacts = {s: v for s, v in exact_points if v.shape == (num_v, num_r, 2)}
    windows = {s: v for s, v in window_points if v.shape == (num_v, 2)}
    dropped = {s for s, _ in hash_points} - set(hashes)
    if dropped or len(placement_events) > 1:
        notes.append(
            f"The variable list changed during this run ({len(placement_events)} placement "
            f"events); shown: the {num_v} variables of the last one"
            + (f", {len(dropped)} logged step(s) of other lists skipped." if dropped else ".")
        )
    steps = np.array(sorted(set(hashes) & set(fingerprints)), dtype=np.int64)
    hash_arr = np.stack([hashes[s] for s in steps]) if steps.size else np.zeros((0, num_v, num_r))
    hash_arr = hash_arr.astype(np.int64, copy=False)
    rows, row_of = compact_fingerprints([fingerprints[s] for s in steps], hash_arr)
    coverage = window_coverage(document, steps, windows)
    return assemble_series(
        run, placement_events, steps, hash_arr, rows, row_of, exacts, notes, coverage
    )


def window_coverage(document, steps, windows):
    """float64 [S, V]: the fraction of each variable's elements read at each step's check.

    Args:
      document: the placement document (variable shapes).
      steps: int64 [S]; windows: `{step: int64 [V, 2]}` (first element, count; -1: whole).
    """
    variables = document.get("variables", [])
    sizes = variable_sizes(variables)
    counts = np.full((len(steps), len(variables)), -1.0)  # -1: read whole
    at = [i for i, step in enumerate(steps.tolist()) if step in windows]
    if at:
        counts[at] = np.stack([windows[int(steps[i])][:, 1] for i in at])
    with np.errstate(divide="ignore", invalid="ignore"):
        part = np.where((counts >= 0) & np.isfinite(sizes), counts / sizes, 1.0)
    return np.clip(part, 0.0, 1.0)


def variable_sizes(variables):
    """float64 [V]: each placement variable's element count (inf when a dimension is unknown)."""
    sizes = np.empty(len(variables))
    for index, variable in enumerate(variables):
        shape = variable.get("shape") or []
        known = all(d is not None for d in shape)
        sizes[index] = float(math.prod(shape)) if known else np.inf
    return sizes


def copy_algorithms(variables, num_r):
    """`(present bool [V, R], algorithm object [V, R])`: which replicas hold a copy of each
    variable, and the hash algorithm of each ("mix64" where the placement names none)."""
    present = np.zeros((len(variables), num_r), dtype=bool)
    algorithm = np.full((len(variables), num_r), "mix64", dtype=object)
    for index, variable in enumerate(variables):
        columns = variable.get("columns", [])
        algorithms = variable.get("hash") or ["mix64"] * len(columns)
        for column, name in zip(columns, algorithms, strict=False):
            if 0 <= column < num_r:
                present[index, column] = True
                algorithm[index, column] = str(name)
    return present, algorithm


def document_layout(document):
    """What a placement document says of its copies, for the drift arrays.

    Kept on a document parsed by `placement_document` (one object per distinct document: a
    run re-read at each look keeps its layout); the arrays are read-only.

    Returns:
      `{"variables", "devices", "replicas", "sizes", "present", "both", "comparable",
      "algorithm"}`: the variables, devices and replica ids, float64 [V] element counts
      (`variable_sizes`), bool [V, R] each: replica r holds a copy (`present`), it and replica
      0 do (`both`), and both were hashed by the same algorithm (`comparable`; fingerprint
      version 1: "mix64"), and object [V, R] the hash algorithm of each copy
      (`copy_algorithms`).
    """
    kept = getattr(document, "layout", None)
    if kept is not None:
        return kept
    variables = list(document.get("variables", []))
    devices = [str(d) for d in document.get("devices", [])]
    present, algorithm = copy_algorithms(variables, len(devices))
    both = present & present[:, :1]
    layout = {
        "variables": variables,
        "devices": devices,
        "replicas": [int(r) for r in document.get("replicas", range(len(devices)))],
        # Unknown dimensions: inf (the sketch was hashed, never the exact small-variable copy).
        "sizes": variable_sizes(variables),
        "present": present,
        "both": both,
        "comparable": both & (algorithm == algorithm[:, :1]),
        "algorithm": algorithm,
    }
    for value in layout.values():
        if isinstance(value, np.ndarray):
            value.setflags(write=False)
    if isinstance(document, PlacementDocument):
        document.layout = layout
    return layout


class PlacementDocument(dict):
    """A parsed placement document (a dict, equal to the JSON's), holding its `layout` once
    `document_layout` computed it (None before)."""

    layout = None


@functools.lru_cache(maxsize=4096)
def placement_document(raw):
    """The placement document of a placement event's value (`bytes` or `str` of JSON), parsed
    once per distinct value: the same dict for the same text (do not modify it).

    Raises:
      ValueError: if it is not JSON of a placement event (a dict with a `variables` list).
    """
    document = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    if not isinstance(document, dict) or not isinstance(document.get("variables"), list):
        raise ValueError("not a placement event")
    return PlacementDocument(document)


def identical_zeros(identical, out=None):
    """float64: 0.0 where `identical`, NaN elsewhere (the drift of copies that are not
    estimated), written into `out` when given (no array of its size made).

    Example:
      >>> identical_zeros(np.array([True, False])).tolist()
      [0.0, nan]
    """
    out = np.empty(identical.shape) if out is None else out
    out.fill(np.nan)
    np.copyto(out, 0.0, where=identical)
    return out


def drift_estimates(rows, row_of, identical, layout, zeros=None):
    """The drift of every copy from replica 0's: 0 where bit-identical, estimated from the
    fingerprints for the other copies present with replica 0's (normally none), NaN elsewhere.

    Args:
      rows, row_of: the fingerprints (`compact_fingerprints`), row_of int64 [S, V, R].
      identical: bool [S, V, R]: copy r bit-identical to copy 0 (same algorithm).
      layout: `document_layout` of the placement.
      zeros: `identical_zeros(identical)` when the caller holds it (None: made here).

    Returns:
      `(l2, rel, lower)`, float64 [S, V, R] each: ||copy_r - copy_0||, that over ||copy_0||,
      and a lower bound of max |copy_r - copy_0|. When no copy needs an estimate they are one
      read-only array (a read-only view of `zeros`).
    """
    zeros = identical_zeros(identical) if zeros is None else zeros
    at = np.nonzero(layout["both"][None] & ~identical)  # the copies whose drift is estimated
    if not len(at[0]):  # every copy bit-identical to replica 0's or absent (the norm)
        zero = zeros.view()
        zero.flags.writeable = False
        return zero, zero, zero
    copy = dense_fingerprints(rows, row_of[at])
    first = dense_fingerprints(rows, row_of[at[0], at[1], 0])
    sizes = layout["sizes"][at[1]]
    with np.errstate(invalid="ignore"):
        difference = copy[:, 4:] - first[:, 4:]
        l2_at = np.sqrt(np.sum(np.square(difference), axis=-1))
        rel_at = _relative(l2_at, np.sqrt(np.maximum(first[:, 3], 0.0)))
        delta = np.abs(copy[:, :4] - first[:, :4])
        lower_at = np.maximum(delta[:, 0], delta[:, 1])
        lower_at = np.maximum(lower_at, delta[:, 2] / np.maximum(sizes, 1.0))
        lower_at = np.nan_to_num(lower_at, nan=np.nan, posinf=np.inf)
        small = sizes <= rows.shape[-1] - 4
        sketch_max = np.max(np.abs(difference), axis=-1, initial=0.0)
        lower_at = np.where(small, np.maximum(lower_at, sketch_max), lower_at)
    estimates = []
    for values in (l2_at, rel_at, lower_at):
        estimate = zeros.copy()
        estimate[at] = values
        estimates.append(estimate)
    return tuple(estimates)


def exact_fields(steps, exacts, rows, row_of, rel, lower):
    """The exact check's arrays where it ran, and the best drift (exact, else estimated).

    Returns:
      `{"exact", "exact_max_abs", "exact_l2", "exact_rel_l2", "rel_l2", "max_abs"}` (see
      `VariablesSeries`); without any exact check one read-only NaN view for the three exact
      arrays, and the estimates as best.
    """
    shape = row_of.shape
    exact = np.array([s in exacts for s in steps], dtype=bool)
    if not exact.any():
        nan = np.broadcast_to(np.nan, shape)
        return {
            "exact": exact,
            "exact_max_abs": nan,
            "exact_l2": nan,
            "exact_rel_l2": nan,
            "rel_l2": rel,
            "max_abs": lower,
        }
    exact_max_abs, exact_l2 = np.full(shape, np.nan), np.full(shape, np.nan)
    for i, step in enumerate(steps):
        if step in exacts:
            exact_max_abs[i] = exacts[step][..., 0]
            exact_l2[i] = exacts[step][..., 1]
    squares0 = fingerprint_column(rows, row_of[:, :, 0], 3)  # replica 0's sum of squares
    norm0 = np.sqrt(np.maximum(squares0, 0.0))[:, :, None]  # [S, V, 1]
    exact_rel = np.where(np.isnan(exact_l2), np.nan, _relative(exact_l2, norm0))
    return {
        "exact": exact,
        "exact_max_abs": exact_max_abs,
        "exact_l2": exact_l2,
        "exact_rel_l2": exact_rel,
        "rel_l2": np.where(exact[:, None, None], exact_rel, rel),
        "max_abs": np.where(exact[:, None, None], exact_max_abs, lower),
    }


def layout_notes(layout, coverage, rotation):
    """The notes of a series' copies and checks: copies hashed with another algorithm than
    replica 0's, and logged steps that checked a rotating slice of the large variables."""
    notes = []
    if (layout["both"] & ~layout["comparable"]).any():
        notes.append(
            "Some copies were hashed with a different algorithm than replica 0's (farmhash64 on "
            "CPU devices, mix64 on others): their bit identity is unknown, their drift is "
            "estimated from the sketches only."
        )
    if (coverage < 1.0).any():
        period = (rotation or {}).get("period", "P")
        whole = (rotation or {}).get("whole_elements", 4096)
        notes.append(
            f"{int((coverage < 1.0).any(axis=1).sum())} of {len(coverage)} logged step(s) "
            f"checked a rotating slice of each variable larger than {whole:,} "
            f"elements (every element once every {period} logged steps, and whole at each epoch "
            "end with ReplicaCallback): a drift confined to other elements shows up to "
            f"{period} logged steps late, and the drift at such a step is that of its slice."
        )
    return notes


def assemble_series(
    run, placement_events, steps, hash_arr, rows, row_of, exacts, notes, coverage=None
):
    """The `VariablesSeries` of decoded arrays (`build_variables_series`).

    Drift is computed only for copies that are not bit-identical to replica 0's (normally none):
    the others' is exactly 0 whatever their fingerprints. `coverage`: float64 [S, V] (default:
    every check whole).
    """
    document = placement_events[-1][1]
    layout = document_layout(document)
    identical = (hash_arr == hash_arr[:, :, :1]) & layout["comparable"][None]
    l2, rel, lower = drift_estimates(rows, row_of, identical, layout)
    if coverage is None:
        coverage = np.ones((len(steps), len(layout["variables"])))
    return series_of_arrays(
        run,
        document,
        layout,
        placement_events,
        steps,
        hash_arr,
        rows,
        row_of,
        identical,
        (l2, rel, lower),
        coverage,
        exacts,
        notes,
    )


def series_of_arrays(
    run,
    document,
    layout,
    placement_events,
    steps,
    hash_arr,
    rows,
    row_of,
    identical,
    drift,
    coverage,
    exacts,
    notes,
):
    """The `VariablesSeries` of decoded (or merged) arrays and their drift estimates
    `drift = (l2, rel, lower)`; the layout's notes are added to `notes`."""
    l2, rel, lower = drift
    rotation = document.get("rotation") or None
    notes.extend(layout_notes(layout, coverage, rotation))
    return VariablesSeries(
        run=run,
        replicas=layout["replicas"],
        devices=layout["devices"],
        source=str(document.get("source", "")),
        central_storage=bool(document.get("central", False)),
        variables=layout["variables"],
        placement_events=placement_events,
        steps=steps,
        hash=hash_arr,
        present=layout["present"],
        rows=rows,
        row_of=row_of,
        identical=identical,
        hash_comparable=layout["comparable"],
        l2_estimate=l2,
        rel_l2_estimate=rel,
        max_abs_lower=lower,
        coverage=coverage,
        rotation=rotation,
        notes=notes,
        **exact_fields(steps, exacts, rows, row_of, rel, lower),
    )


def from_samples(run, samples, notes, needed=None):
    """Builds the `VariablesSeries` of a run from its raw samples, or None without any.

    Args:
      run: the run name.
      samples: `RunData.samples`.
      notes: the run's notes list (the series shares it; problems are appended).
      needed: unused.

    Returns:
      A `VariablesSeries`, or None.
    """
    events = []
    bad = 0
    for step, value in samples.get(schema.TAG_VARIABLE_PLACEMENT, []):
        try:
            events.append((step, placement_document(value.item())))
        except (ValueError, AttributeError, TypeError):
            bad += 1
    if bad:
        notes.append(f"{bad} unreadable variable placement event(s) skipped.")
    series = build_variables_series(
        run,
        events,
        samples.get(schema.TAG_VARIABLE_HASH, []),
        samples.get(schema.TAG_VARIABLE_FINGERPRINT, []),
        samples.get(schema.TAG_VARIABLE_EXACT, []),
        samples.get(schema.TAG_VARIABLE_WINDOW, []),
    )
    if series is not None:
        notes.extend(series.notes)
        series.notes = notes
    return series
