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
    are summarized. Built in named steps: `_read_copies` (each copy read on its device, its
    hash and summary planned in its column), `_hash` (the columns' hashes), `_find_shareable`
    (which variables may take replica 0's rows), `_fingerprint` (the rows, under that cond).

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
        self._entries = entries
        self._num = len(entries)
        self._replicas = num_replicas
        self._layouts = {} if layouts is None else layouts
        self._fused_min_copies = fused_min_copies
        self._projection = {}
        self._columns = [_Column() for _ in range(num_replicas)]
        self._width = len(STAT_COLUMNS) + SKETCH_SIZE
        values, exacts = self._read_copies(part, exact)
        self.hash = self._hash()
        self._find_shareable(values)
        self.fingerprint = self._fingerprint(values)
        self.exact = None
        if exact:
            empty = tf.zeros([0, num_replicas, 2], tf.float64)
            self.exact = tf.stack(exacts) if exacts else empty
        # The planning state holds every copy's value (eagerly, the values themselves): drop it.
        del self._columns, self._projection, self._missing

    # -------------------------------------------------------------- step 1: read

    def _read_copies(self, part, exact):
        """Reads every copy on its device (the `part` of it when rotating) and plans its hash
        and summary in its column.

        Returns:
          `(values, exacts)`: per variable `{column: value}`, and per variable its float64
          [R, 2] exact differences from replica 0 (when `exact`).
        """
        values, exacts = [], []
        row_shapes = {}  # device -> its own [1, -1] constant (no transfer per copy)
        for index, entry in enumerate(self._entries):
            present = {}
            for copy, column, algorithm in zip(
                entry.copies, entry.columns, entry.hashes, strict=True
            ):
                if column < 0 or column in present:
                    continue
                with tf.device(copy.device):
                    value = _read(copy) if part is None else part(index, _read(copy))
                    present[column] = value
                    if copy.device not in row_shapes:
                        row_shapes[copy.device] = tf.constant([1, -1], tf.int32)
                    self._plan(index, entry, algorithm, column, copy.device, value, row_shapes)
            values.append(present)
            if exact:
                exacts.append(self._exact_row(index, entry, present))
        return values, exacts

    def _plan(self, index, entry, algorithm, position, device, value, row_shapes):
        """Puts one copy in its column (`position`): hashed with its group (farmhash of a
        numeric copy) or alone, summarized with the column's fused copies (numeric) or
        alone."""
        column = self._columns[position]
        column.device = column.device or device
        numeric = is_numeric(entry.dtype) and _static_size(value) is not None
        if algorithm == HASH_FARMHASH and numeric:
            column.farm.add(index)  # hashed with its group (`_Column.hash_farm`)
        else:
            column.hashes[index] = copy_hash(value, entry.dtype, algorithm, self._projection)
        if numeric:
            column.fused.append((index, tf.reshape(value, row_shapes[device])))
        else:
            column.single[index] = copy_summary(value, entry.dtype)

    def _exact_row(self, index, entry, present):
        """float64 [R, 2]: each copy's exact difference from replica 0's (NaN without one)."""
        row = [tf.constant([np.nan, np.nan], tf.float64)] * self._replicas
        if 0 in present:
            with tf.device(entry.copies[entry.columns.index(0)].device):
                for column, value in present.items():
                    # Copies the whole of copy r to replica 0's device.
                    row[column] = exact_difference(value, present[0], entry.dtype)
        return tf.stack(row)

    # -------------------------------------------------------------- step 2: hash

    def _hash(self):
        """int64 [V, R]: every column's hashes, one vector per device."""
        for column in self._columns:
            if column.farm:
                column.hash_farm()
        hashes = [column.hash_vector(self._num) for column in self._columns]
        if not self._num:
            return tf.zeros([0, self._replicas], tf.int64)
        return tf.stack(hashes, axis=1)

    # -------------------------------------------------------------- step 3: shareable

    def _find_shareable(self, values):
        """`present` and `shareable` (see the attributes): a numeric variable whose copies
        share one hash algorithm and include replica 0's may take replica 0's rows."""
        shareable = [
            i
            for i, entry in enumerate(self._entries)
            if 0 in values[i]
            and len(values[i]) > 1
            and is_numeric(entry.dtype)
            and len(set(entry.hashes)) == 1
        ]
        present = [[r in copies for r in range(self._replicas)] for copies in values]
        self.present = np.array(present, dtype=bool).reshape(self._num, self._replicas)
        self.shareable = np.isin(np.arange(self._num), shareable)
        self._shared = set(shareable)

    # -------------------------------------------------------------- step 4: rows

    def _fingerprint(self, values):
        """float64 [V, R, 4 + K]: replica 0's rows, then the others' under one cond on every
        shareable copy hashing like replica 0's (they take its rows) or not (summarized)."""
        self._missing = None
        if not self._num:
            return tf.zeros([0, self._replicas, self._width], tf.float64)
        # One NaN row (`_summarize`'s last), made once outside the cond as the branches share it.
        self._missing = tf.fill([1, self._width], tf.constant(np.nan, tf.float64))
        table0, where0 = self._summarize(self._columns[0])
        matrices = [self._gather(table0, where0)]
        if self._replicas > 1:
            for column in self._columns[1:]:
                if self._at_once(column):
                    column.join()  # outside the cond: one capture per dtype, not per copy
            others = tf.cond(
                self._all_shared_agree(),
                lambda: [
                    self._agreeing_rows(r, values, table0, where0) for r in range(1, self._replicas)
                ],
                lambda: [self._differing_rows(r, table0, where0) for r in range(1, self._replicas)],
            )
            matrices.extend(others)
        return tf.stack(matrices, axis=1)

    def _all_shared_agree(self):
        """bool: every present copy of a shareable variable hashes like replica 0's."""
        if not self._shared:
            return tf.constant(True)
        mask = self.present & self.shareable[:, None]
        equal = tf.equal(self.hash, self.hash[:, :1])
        return tf.reduce_all(tf.logical_or(equal, tf.constant(~mask)))

    def _at_once(self, column):
        """Whether the column's copies are summarized at once (`fused_summary`)."""
        return bool(column.fused) and len(column.fused) >= self._fused_min_copies

    def _summarize(self, column, reuse=None):
        """`(table, where)`: [rows of the column's fused copies + singles, then a NaN row], and
        the row of each variable index. `reuse`: `(need, rows)` for a fused column, bool
        [copies] and their rows of replica 0: only the copies where `need` holds are
        summarized."""
        rows = []
        where = {index: i for i, (index, _) in enumerate(column.fused)}
        if self._at_once(column):
            rows.append(self._fused_rows(column, reuse))
        elif column.fused:
            with tf.device(column.device):
                rows.append(grouped_summary(column.groups(), self._projection))
        for index, summary in column.single.items():
            where[index] = len(where)
            rows.append(summary[None, :])
        rows.append(self._missing)
        return tf.concat(rows, axis=0), where

    def _fused_rows(self, column, reuse):
        """The rows of a column's copies summarized at once (`fused_summary`), or, with
        `reuse`, only those where its `need` holds (the others take replica 0's rows)."""
        sizes = tuple(_static_size(flat) for _, flat in column.fused)
        dtypes = tuple(flat.dtype for _, flat in column.fused)
        key = (column.device, sizes, dtypes)
        if key not in self._layouts:
            self._layouts[key] = SummaryLayout(sizes, column.device)
        layout = self._layouts[key]
        with tf.device(column.device):
            if column.joined is None:
                column.join()
            if reuse is None:
                return fused_summary(_as_float64(column.joined), layout)
            need, shared_rows = reuse
            own = partial_fused_summary(column.joined, _dtype_runs(dtypes), layout, need)
            return tf.where(need[:, None], own, shared_rows)

    def _gather(self, table, where):
        """One row per variable: its row of `table`, or the NaN row (the last)."""
        return tf.gather(table, [where.get(i, len(where)) for i in range(self._num)])

    def _agreeing_rows(self, r, values, table0, where0):
        """Replica r's rows where the shareable copies agree: replica 0's rows for them, its
        own summaries for the others."""
        column = self._columns[r]
        own = _Column()
        own.device = column.device
        own.fused = [(i, f) for i, f in column.fused if i not in self._shared]
        own.single = {i: s for i, s in column.single.items() if i not in self._shared}
        table, where = self._summarize(own)
        full = tf.concat([table0, table], axis=0)
        offset = table0.shape[0]
        positions = []
        for i in range(self._num):
            if i in self._shared and r in values[i]:
                positions.append(where0[i])
            elif i in where:
                positions.append(offset + where[i])
            else:
                positions.append(offset + len(where))  # NaN row
        return tf.gather(full, positions)

    def _differing_rows(self, r, table0, where0):
        """Replica r's rows where some shareable copy differs: its own summaries (a copy
        bit-identical to replica 0's, in a column summarized at once, takes replica 0's rows:
        the same values the agreeing branch writes)."""
        column = self._columns[r]
        reuse = None
        if self._at_once(column):
            indices = [i for i, _ in column.fused]
            reusable = [i in self._shared for i in indices]  # each in where0
            equal = tf.gather(tf.equal(self.hash[:, r], self.hash[:, 0]), indices)
            need = tf.logical_not(tf.logical_and(equal, tf.constant(reusable)))
            positions0 = [where0[i] if i in self._shared else 0 for i in indices]
            reuse = (need, tf.gather(table0, positions0))
        table, where = self._summarize(column, reuse)
        return self._gather(table, where)
