"""The variables family's merge of a job's workers: cross-worker weight drift, one at a time.

No weights cross workers: each worker fingerprinted its own copies on their devices (bitwise
hash, stats, linear sketch, the same projection on every worker); here those fingerprints are
put on one global replica axis, so the drift of every copy from global replica 0 (worker 0's
first copy) is computed as within one worker. The exact element-wise check (`exact=True`)
compares copies within a worker only; it stays in each worker's own run. Imports no TensorFlow.
"""

import numpy as np

from tb_replica_plugin.core import jobs
from tb_replica_plugin.families.variables import read

__all__ = ["VariablesMerger"]


class VariablesMerger(jobs.Merger):
    """Cross-worker weight drift of a job from the per-copy fingerprints each worker wrote.

    Each worker's hashes and fingerprint rows go into the job's `[steps, variables, replicas]`
    arrays as it is read; a copy bit-identical to global replica 0's at that step (same hash,
    same algorithm) takes replica 0's row, so a healthy job holds one row per variable and step
    for all its copies (each worker wrote its own replica 0's). Drift is computed once per step,
    when every worker has written it (`_derive`): 0 for bit-identical copies, estimated from the
    fingerprints for the others. Steps: those every worker logged.

    Example:
      >>> merger = VariablesMerger(expected_workers=2)
      >>> for slot, member in enumerate(members):
      ...     merger.add(slot, member, None)
      >>> merger.result("job", [0, 1], workers, []).rel_l2.shape  # [steps, variables, 4]
      (3, 1, 4)
    """

    attribute = "variables"

    def __init__(self, expected_workers=1):
        super().__init__(expected_workers)
        self.rows = jobs.StepArrays(expected_workers)
        self.axis = jobs.ReplicaAxis()
        self.meta = {}  # slot -> its placement's fields (they must not change)
        self.table = np.zeros((0, 0))  # fingerprint rows, each held once
        self.count = 0  # rows of `table` in use
        self.derived = 0  # complete rows whose drift is computed
        self.estimated = False  # some copy's drift was estimated: l2, rel, lower differ

    def add(self, slot, member, since):
        """Writes worker `slot`'s hashes, fingerprints and coverage from step `since` on.

        Raises:
          jobs.Irregular: if the worker's placement or fingerprint width changed.
        """
        series = self.series_of(slot, member)
        if series is None:
            return
        self._keep_meta(slot, series)
        columns = self.axis.add(slot, series.num_replicas)
        if not self.rows.arrays:
            self._declare(series)
        self.rows.widen(self.axis.total)
        keep = series.steps >= since if since is not None else np.ones(series.steps.size, bool)
        rows = self.rows.place(slot, series.steps[keep])
        again = (
            self._written_before(rows, columns, series.hash[keep]) if since is not None else None
        )
        row_of = self._job_rows(slot, series, keep, rows, again)
        self.rows.write(slot, "hash", rows, columns, series.hash[keep])
        self.rows.write(slot, "row_of", rows, columns, row_of)
        coverage = series.coverage[keep][:, None, :]
        self.rows.write(slot, "coverage", rows, slice(slot, slot + 1), coverage)

    def _keep_meta(self, slot, series):
        document = series.placement_events[-1][1]
        width = series.rows.shape[1] if len(series.rows) else None
        meta = self.meta.setdefault(slot, {"document": document, "width": width})
        if meta["document"] != document or width not in (None, meta["width"] or width):
            raise jobs.Irregular(f"worker slot {slot}: other placement")
        meta["width"] = meta["width"] or width
        layout = read.document_layout(document)
        if layout["present"].shape[1] == series.num_replicas:  # computed once per document
            meta["present"], meta["algorithm"] = layout["present"], layout["algorithm"]
        else:
            meta["present"], meta["algorithm"] = read.copy_algorithms(
                series.variables, series.num_replicas
            )
        meta.update(names=series.names, replicas=series.replicas, devices=series.devices)
        meta.update(source=series.source, rotation=series.rotation, variables=series.variables)

    def _declare(self, first):
        variables, replicas = len(first.variables), self.expected_workers * first.num_replicas
        self.rows.declare("hash", (variables, replicas), np.int64, 0, (1,))
        self.rows.declare("row_of", (variables, replicas), np.int64, -1, (1,))
        workers = self.expected_workers
        self.rows.declare("coverage", (workers, variables), np.float64, 1.0, slot_axes=(0,))
        self.rows.declare("identical", (variables, replicas), bool, False, (1,))
        self.rows.declare("zero", (variables, replicas), np.float64, np.nan, (1,))
        self.table = np.zeros((16, first.rows.shape[1]))

    def _written_before(self, rows, columns, hashes):
        """`(rows, mask)` of a worker's steps written again (its last step, with new data):
        int64 [S, V, R_w] the table rows its copies had, and where a copy has the same hash
        as then (its row is kept, not appended again: a live job's table would grow by a step's
        rows at every look)."""
        at = np.maximum(rows, 0)
        before = self.rows.arrays["row_of"][:, :, columns][at]
        same_hash = self.rows.arrays["hash"][:, :, columns][at] == hashes
        return before, (before >= 0) & same_hash & (rows >= 0)[:, None, None]

    def _job_rows(self, slot, series, keep, rows, again=None):
        """int64 [S, V, R] of the worker's kept steps: each copy's row in the job's table; its
        own rows appended unless bit-identical to global replica 0's copy at that step, or
        written before with the same hash (`again`: `_written_before`, or None)."""
        row_of, hashes = series.row_of[keep], series.hash[keep]
        valid = (row_of >= 0) & (rows >= 0)[:, None, None]
        before, again = again if again is not None else (row_of, np.zeros(row_of.shape, bool))
        if slot == 0:
            reference = hashes[:, :, 0]
            new = self._mapped(series, row_of[:, :, 0], valid[:, :, 0] & ~again[:, :, 0])
            reference_row = np.where(again[:, :, 0], before[:, :, 0], new)
        else:
            at = np.maximum(rows, 0)
            reference = self.rows.arrays["hash"][at, :, 0]
            reference_row = np.where((rows >= 0)[:, None], self.rows.arrays["row_of"][at, :, 0], -1)
        same = valid & (hashes == reference[:, :, None]) & (reference_row >= 0)[:, :, None]
        same &= self._comparable(slot)[None]
        own = self._mapped(series, row_of, valid & ~same & ~again)
        return np.where(same, reference_row[:, :, None], np.where(again, before, own))

    def _comparable(self, slot):
        """bool [V, R_w]: the worker's copies hashed by global replica 0's algorithm, both
        present (as `read.document_layout` says on the job's axis)."""
        meta, first = self.meta[slot], self.meta.get(0, self.meta[slot])
        if meta["algorithm"].shape[0] != first["algorithm"].shape[0]:
            return np.zeros_like(meta["present"])
        zero = first["present"][:, :1] & meta["present"]
        return zero & (meta["algorithm"] == first["algorithm"][:, :1])

    def _mapped(self, series, row_of, mask):
        """`row_of` where `mask` as rows of the job's table (the worker's rows appended), -1
        elsewhere."""
        source = np.unique(row_of[mask])
        mapping = np.full(len(series.rows) + 1, -1, np.int64)
        mapping[source] = self._append(series.rows[source])
        return np.where(mask, mapping[row_of], -1)

    def _append(self, rows):
        """The table indices of `rows`, appended (the table grows by doubling); -1 for rows of
        another width than the table's (such workers are not merged: `_mergeable`)."""
        if rows.shape[1] != self.table.shape[1]:
            if self.count:
                return np.full(len(rows), -1, np.int64)
            self.table = np.zeros((len(self.table), rows.shape[1]))
        needed = self.count + len(rows)
        if needed > len(self.table):
            grown = np.zeros((max(needed, 2 * len(self.table)), rows.shape[1]))
            grown[: self.count] = self.table[: self.count]
            self.table = grown
        self.table[self.count : needed] = rows
        indices = np.arange(self.count, needed, dtype=np.int64)
        self.count = needed
        return indices

    def result(self, job, order, workers, notes):
        """The job's `VariablesSeries` over the steps every worker logged, or None when no
        worker recorded variables (or their versions, variable lists or fingerprint widths
        differ: noted)."""
        how = "no cross-worker weight drift; call observe_variables on every worker"
        if self.absent(workers, order, notes, "variables", how) or not self._mergeable(
            order, notes
        ):
            return None
        document = self._document(order)
        layout = read.document_layout(document)
        self.rows.drop_dead()
        rows, total, columns = self.rows.complete_rows(), self.axis.total, self.axis.order(order)
        steps = np.asarray(self.rows.steps[rows], np.int64)
        if columns is None:
            identical, l2, rel, lower = self._derived(layout, rows, total)
            hash_arr, row_of = (self.rows.view(n, rows, total) for n in ("hash", "row_of"))
        else:  # workers read out of order (rare): computed again in the job's order
            hash_arr, row_of = (self.rows.view(n, rows, total, columns) for n in ("hash", "row_of"))
            identical = (hash_arr == hash_arr[:, :, :1]) & layout["comparable"][None]
            l2, rel, lower = read.drift_estimates(
                self.table[: self.count], row_of, identical, layout
            )
        coverage = self.rows.view("coverage", rows, len(order))[:, order].min(axis=1, initial=1.0)
        placement = [(int(steps[0]) if steps.size else 0, document)]
        return read.series_of_arrays(
            job,
            document,
            layout,
            placement,
            steps,
            hash_arr,
            self.table[: self.count],
            row_of,
            identical,
            (l2, rel, lower),
            coverage,
            {},
            notes,
        )

    def _mergeable(self, order, notes):
        """Whether the workers' fingerprints compare: one version, variable list and width."""
        metas = [self.meta[slot] for slot in order]
        versions = {int(m["document"].get("fingerprint", {}).get("version", 1)) for m in metas}
        if len(versions) > 1:
            notes.append(
                f"The workers wrote fingerprints of different versions ({sorted(versions)}: "
                "different versions of tb_replica_plugin): cross-worker weight drift is not "
                "computed (use the same version on every worker)."
            )
            return False
        if any(m["names"] != metas[0]["names"] for m in metas):
            notes.append(
                "The workers recorded different variable lists: cross-worker weight drift is not "
                "computed (pass the same variables on every worker)."
            )
            return False
        if len({m["width"] for m in metas if m["width"] is not None}) > 1:
            notes.append(
                "The workers wrote fingerprints of different widths: cross-worker weight drift is "
                "not computed (use the same version of tb_replica_plugin on every worker)."
            )
            return False
        return True

    def _document(self, order):
        """The job's placement document: every worker's copies on the global replica axis."""
        metas = [self.meta[slot] for slot in order]
        offsets = np.cumsum([0] + [len(m["replicas"]) for m in metas])[:-1]
        variables = []
        for index, first in enumerate(metas[0]["variables"]):
            entries = [m["variables"][index] for m in metas]
            merged = dict(first)
            merged["devices"] = [d for e in entries for d in e.get("devices", [])]
            merged["hash"] = [
                h for e in entries for h in (e.get("hash") or ["mix64"] * len(e.get("columns", [])))
            ]
            merged["columns"] = [
                int(c) + int(offset) if c >= 0 else -1
                for e, offset in zip(entries, offsets, strict=True)
                for c in e.get("columns", [])
            ]
            merged["mirrored"] = all(e.get("mirrored", False) for e in entries)
            variables.append(merged)
        return {
            "variables": variables,
            "devices": [d for m in metas for d in m["devices"]],
            "replicas": [r for m in metas for r in m["replicas"]],
            "source": metas[0]["source"],
            "fingerprint": metas[0]["document"].get("fingerprint", {}),
            "rotation": metas[0]["rotation"],
        }

    def _derived(self, layout, rows, total):
        """`(identical, l2, rel, lower)` of the complete rows, computed for the rows not done
        yet (and those written again) and kept."""
        self.derived = min(self.derived, self.rows.changed_from)
        self.rows.clear_changed()
        done = np.arange(self.rows.size)[rows]
        todo = done[done >= self.derived]
        if todo.size:
            self._derive(layout, slice(int(todo[0]), int(todo[-1]) + 1), total)
        self.derived = int(done[-1]) + 1 if done.size else self.derived
        names = ("l2", "rel", "lower") if self.estimated else ("zero",) * 3
        arrays = [self.rows.view(name, rows, total) for name in names]
        for array in arrays:
            array.flags.writeable = False
        return (self.rows.view("identical", rows, total), *arrays)

    def _derive(self, layout, block, total):
        """Drift of the copies of rows `block`: 0 where bit-identical to global replica 0's
        copy (whose row they then share), estimated from the fingerprints elsewhere."""
        arrays = self.rows.arrays
        hash_arr, row_of = arrays["hash"][block, :, :total], arrays["row_of"][block, :, :total]
        identical = (hash_arr == hash_arr[:, :, :1]) & layout["comparable"][None]
        first = np.broadcast_to(row_of[:, :, :1], row_of.shape)
        same = identical & (row_of >= 0) & (first >= 0)
        np.copyto(row_of, first, where=same)  # a worker read before worker 0 had this step
        arrays["identical"][block, :, :total] = identical
        zeros = read.identical_zeros(identical, out=arrays["zero"][block, :, :total])
        table = self.table[: self.count]
        l2, rel, lower = read.drift_estimates(table, row_of, identical, layout, zeros)
        if l2 is not rel and not self.estimated:  # the first estimate: three arrays from now on
            self.estimated = True
            for name in ("l2", "rel", "lower"):
                self.rows.declare_like(name, "zero")
        if self.estimated:
            for name, values in (("l2", l2), ("rel", rel), ("lower", lower)):
                arrays[name][block, :, :total] = values
