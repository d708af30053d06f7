"""Variables family, the check of one logged step: every copy's hash and fingerprint at once.

Per replica device, the copies are hashed where they live (`tf.fingerprint` of a `[k, n]` matrix
of the copies of one size and dtype on a CPU: one op per group, the same hash per row as one per
copy; `fingerprint.copy_hash` elsewhere), and summarized by `fingerprint.grouped_summary` (a short
list: one set of reductions per group) or `fingerprint.fused_summary` (a long one: a few segment
ops per device). Under one `tf.cond` on "every copy's hash equals replica 0's", only replica 0's
copies are summarized and their rows go to every replica (the normal case); otherwise the
differing copies are. See `fingerprint.py` for what a hash, stats and sketch are.

Everything here runs in cross-replica context (or eagerly) on the per-device component variables.
"""

import numpy as np
import tensorflow as tf

from tb_replica_plugin.families.variables.fingerprint import (
    HASH_FARMHASH,
    SKETCH_SIZE,
    STAT_COLUMNS,
    SummaryLayout,
    _as_float64,
    _dtype_runs,
    _joined_by_dtype,
    _static_size,
    copy_hash,
    copy_summary,
    exact_difference,
    fused_summary,
    grouped_summary,
    is_numeric,
    partial_fused_summary,
)

# A device holding at least this many copies has them summarized at once (`fused_summary`: a
# few segment ops, whatever the number of variables; traced ops matter more than run time then).
# Fewer copies are summarized by groups of one size (`grouped_summary`: faster at run time).
FUSED_MIN_COPIES = 64
# Copies of one size and dtype up to this many elements are stacked, hashed and summarized
# together (`_Column.groups`); larger ones one by one.
GROUP_MAX_ELEMENTS = 1 << 16


def _read(copy):
    """The value of a component variable: one `ReadVariableOp` (no Python-side wrappers)."""
    handle = getattr(copy, "handle", None)
    if handle is None:
        return tf.convert_to_tensor(copy)
    return tf.raw_ops.ReadVariableOp(resource=handle, dtype=copy.dtype)


class _Column:
    """The copies on one replica device: their hashes, and what the summaries need."""

    def __init__(self):
        self.hashes = {}  # variable index -> int64 scalar
        self.farm = set()  # variable indices of `fused` copies hashed by `tf.fingerprint`
        self.farm_rows = []  # ([variable indices], [k, 8] uint8 fingerprints), once hashed
        self.fused = []  # (variable index, [1, n] flat copy) in summary order
        self.single = {}  # variable index -> summary of a copy outside the fused summary
        self.device = None
        self.joined = None  # the fused copies' elements (`_joined_by_dtype`), once joined
        self._groups = None

    def groups(self):
        """`[(positions in fused, [k, n] copies)]`: the fused copies by static size and dtype
        (up to `GROUP_MAX_ELEMENTS`), stacked on the device once (shared by the hashes and the
        summary)."""
        if self._groups is None:
            by_kind = {}
            for position, (_, flat) in enumerate(self.fused):
                size = _static_size(flat)
                # A large copy stays alone: stacking would copy it for an op saved.
                kind = (size, flat.dtype) if size <= GROUP_MAX_ELEMENTS else position
                by_kind.setdefault(kind, []).append(position)
            with tf.device(self.device):
                self._groups = [
                    (
                        positions,
                        tf.concat([self.fused[p][1] for p in positions], axis=0)
                        if len(positions) > 1
                        else self.fused[positions[0]][1],
                    )
                    for positions in by_kind.values()
                ]
        return self._groups

    def hash_farm(self, method="farmhash64"):
        """Hashes the `farm` copies: one `tf.fingerprint` per group of one size and dtype (it
        hashes each row's bytes, as one call per copy would)."""
        with tf.device(self.device):
            for positions, matrix in self.groups():
                indices = [self.fused[p][0] for p in positions]
                # One algorithm for every numeric copy of a device (`hash_algorithm`).
                if indices[0] in self.farm:
                    rows = tf.raw_ops.Fingerprint(data=matrix, method=method)
                    self.farm_rows.append((indices, rows))

    def hash_vector(self, num):
        """int64 [num]: each variable's copy's hash (0 where the device holds none), assembled
        on the device, so one tensor per device leaves it (not one scalar per copy)."""
        others = sorted(self.hashes)  # copies not hashed by `tf.fingerprint` rows
        order = [index for indices, _ in self.farm_rows for index in indices] + others
        if not order:
            return tf.zeros([num], tf.int64)
        with tf.device(self.device):
            parts = [tf.stack([self.hashes[i] for i in others])] if others else []
            if self.farm_rows:
                rows = tf.concat([row for _, row in self.farm_rows], axis=0)
                parts.insert(0, tf.reshape(tf.bitcast(rows, tf.int64), [-1]))
            if order == list(range(num)):
                return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]
            where = {index: i for i, index in enumerate(order)}
            table = tf.concat([*parts, tf.zeros([1], tf.int64)], axis=0)
            return tf.gather(table, [where.get(i, len(order)) for i in range(num)])

    def join(self):
        """Joins the fused copies' elements by dtype now (a branch then captures a few tensors)."""
        with tf.device(self.device):
            self.joined = _joined_by_dtype([flat for _, flat in self.fused])


class VariablesStats:
    """The variables family for one logged step, in cross-replica context.

    Per replica device, the copies are hashed by groups of one size and dtype (one
    `tf.fingerprint` per group on a CPU; `copy_hash` per copy elsewhere) and summarized by
    groups (`grouped_summary`) or all at once (`fused_summary`: a few segment sums over the
    concatenated elements, for 64 copies or more), so the traced check has a few ops per group
    whatever the size of the variables. Bit-identical copies have identical summaries: under
    one `tf.cond` on "every copy's hash equals replica 0's" only replica 0's copies are
    summarized and their rows are written for every replica; otherwise every replica's copies
    are summarized.

    Args:
      entries: `VariableEntry` list (the V axis).
      num_replicas: R, the number of local replica devices (the R axis).
      exact: also compute the exact element-wise difference from replica 0.
      layouts: optional dict caching the `SummaryLayout` of each device and size list.
      fused_min_copies: a device holding at least this many copies has them summarized at once
        (`fused_summary`), fewer by groups of one size (`grouped_summary`). The default suits
        a check that runs in the training step; a check traced for one host-side call (epoch
        ends) passes 1, as its cost is tracing, not running.
      part: `part(index, value)`: the slice of variable `index`'s copy to check (`rotation.py`).

    Attributes:
      hash: int64 [V, R] (0 where replica r's device holds no copy).
      fingerprint: float64 [V, R, 4 + K] (NaN where replica r's device holds no copy).
      exact: float64 [V, R, 2] `(max_abs, l2)` of copy r minus copy 0, or None.
      present: bool numpy [V, R]: replica r's device holds a copy.
      shareable: bool numpy [V]: a copy hashing like replica 0's has replica 0's row exactly.
    """

    def __init__(
        self,
        entries,
        num_replicas,
        exact=False,
        layouts=None,
        fused_min_copies=FUSED_MIN_COPIES,
        part=None,
    ):
        width = len(STAT_COLUMNS) + SKETCH_SIZE
        layouts = {} if layouts is None else layouts
        columns = [_Column() for _ in range(num_replicas)]
        values = []  # per variable {column: value}
        exacts = []
        projection = {}
        row_shapes = {}  # device -> its own [1, -1] constant (no transfer per copy)
        for index, entry in enumerate(entries):
            present = {}
            for copy, column, algorithm in zip(
                entry.copies, entry.columns, entry.hashes, strict=True
            ):
                if column < 0 or column in present:
                    continue
                target = columns[column]
                with tf.device(copy.device):
                    target.device = target.device or copy.device
                    value = _read(copy) if part is None else part(index, _read(copy))
                    present[column] = value
                    numeric = is_numeric(entry.dtype) and _static_size(value) is not None
                    if copy.device not in row_shapes:
                        row_shapes[copy.device] = tf.constant([1, -1], tf.int32)
                    flat = tf.reshape(value, row_shapes[copy.device]) if numeric else None
                    if algorithm == HASH_FARMHASH and numeric:
                        target.farm.add(index)  # hashed with its group (`_Column.hash_farm`)
                    else:
                        target.hashes[index] = copy_hash(value, entry.dtype, algorithm, projection)
                    if numeric:
                        target.fused.append((index, flat))
                    else:
                        target.single[index] = copy_summary(value, entry.dtype)
            values.append(present)
            if exact:
                row = [tf.constant([np.nan, np.nan], tf.float64)] * num_replicas
                if 0 in present:
                    with tf.device(entries[index].copies[entries[index].columns.index(0)].device):
                        for column, value in present.items():
                            # Copies the whole of copy r to replica 0's device.
                            row[column] = exact_difference(value, present[0], entry.dtype)
                exacts.append(tf.stack(row))
        num = len(entries)
        for column in columns:
            if column.farm:
                column.hash_farm()
        hashes = [column.hash_vector(num) for column in columns]
        self.hash = tf.stack(hashes, axis=1) if num else tf.zeros([0, num_replicas], tf.int64)

        missing = tf.fill([1, width], tf.constant(np.nan, tf.float64))

        def at_once(column):  # the column's copies summarized at once (`fused_summary`)
            return bool(column.fused) and len(column.fused) >= fused_min_copies

        def summarize(column, reuse=None):
            """[rows of the column's fused copies + singles, then a NaN row], and row of each
            variable index. `reuse`: `(need, rows)` for a fused column, bool [copies] and their
            rows of replica 0: only the copies where `need` holds are summarized."""
            rows = []
            where = {index: i for i, (index, _) in enumerate(column.fused)}
            if at_once(column):
                sizes = tuple(_static_size(flat) for _, flat in column.fused)
                dtypes = tuple(flat.dtype for _, flat in column.fused)
                key = (column.device, sizes, dtypes)
                if key not in layouts:
                    layouts[key] = SummaryLayout(sizes, column.device)
                with tf.device(column.device):
                    if column.joined is None:
                        column.join()
                    if reuse is None:
                        rows.append(fused_summary(_as_float64(column.joined), layouts[key]))
                    else:
                        need, shared_rows = reuse
                        own = partial_fused_summary(
                            column.joined, _dtype_runs(dtypes), layouts[key], need
                        )
                        rows.append(tf.where(need[:, None], own, shared_rows))
            elif column.fused:
                with tf.device(column.device):
                    rows.append(grouped_summary(column.groups(), projection))
            for index, summary in column.single.items():
                where[index] = len(where)
                rows.append(summary[None, :])
            rows.append(missing)
            return tf.concat(rows, axis=0), where

        def gather(table, where):
            """One row per variable: its row of `table`, or the NaN row (the last)."""
            return tf.gather(table, [where.get(i, len(where)) for i in range(num)])

        shareable = [
            i
            for i, entry in enumerate(entries)
            if 0 in values[i]
            and len(values[i]) > 1
            and is_numeric(entry.dtype)
            and len(set(entry.hashes)) == 1
        ]
        present = [[r in copies for r in range(num_replicas)] for copies in values]
        self.present = np.array(present, dtype=bool).reshape(num, num_replicas)
        self.shareable = np.isin(np.arange(num), shareable)
        if not num:
            self.fingerprint = tf.zeros([0, num_replicas, width], tf.float64)
        else:
            table0, where0 = summarize(columns[0])
            matrices = [gather(table0, where0)]
            if num_replicas > 1:
                same = tf.constant(True)
                if shareable:
                    # Every present copy of a shareable variable hashes like replica 0's.
                    mask = self.present & self.shareable[:, None]
                    equal = tf.equal(self.hash, self.hash[:, :1])
                    same = tf.reduce_all(tf.logical_or(equal, tf.constant(~mask)))
                shared = set(shareable)

                def agree(r):
                    column = columns[r]
                    own = _Column()
                    own.device = column.device
                    own.fused = [(i, f) for i, f in column.fused if i not in shared]
                    own.single = {i: s for i, s in column.single.items() if i not in shared}
                    table, where = summarize(own)
                    full = tf.concat([table0, table], axis=0)
                    offset = table0.shape[0]
                    positions = []
                    for i in range(num):
                        if i in shared and r in values[i]:
                            positions.append(where0[i])
                        elif i in where:
                            positions.append(offset + where[i])
                        else:
                            positions.append(offset + len(where))  # NaN row
                    return tf.gather(full, positions)

                def differ(r):
                    column = columns[r]
                    reuse = None
                    if at_once(column):
                        # A copy bit-identical to replica 0's takes its rows (the same values
                        # the agreeing branch writes); the others are summarized.
                        indices = [i for i, _ in column.fused]
                        reusable = [i in shared for i in indices]  # each in where0
                        equal = tf.gather(tf.equal(self.hash[:, r], self.hash[:, 0]), indices)
                        need = tf.logical_not(tf.logical_and(equal, tf.constant(reusable)))
                        positions0 = [where0[i] if i in shared else 0 for i in indices]
                        rows0 = tf.gather(table0, positions0)
                        reuse = (need, rows0)
                    table, where = summarize(column, reuse)
                    return gather(table, where)

                for column in columns[1:]:
                    if at_once(column):
                        column.join()  # outside the cond: one capture per dtype, not per copy

                others = tf.cond(
                    same,
                    lambda: [agree(r) for r in range(1, num_replicas)],
                    lambda: [differ(r) for r in range(1, num_replicas)],
                )
                matrices.extend(others)
            self.fingerprint = tf.stack(matrices, axis=1)
        self.exact = None
        if exact:
            self.exact = tf.stack(exacts) if exacts else tf.zeros([0, num_replicas, 2], tf.float64)
