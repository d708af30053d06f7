"""The report: every run of a log dir with its per-replica series and findings.

`load` is the notebook-friendly read API; `tb-replica report` prints `Report.to_text()` or
`Report.to_json()`. Each run's entry is assembled from the registry: a core header, then every
family's present `report_json` / `report_text` block (ordered by `Family.json_order` /
`Family.text_order`). Imports no TensorFlow itself (TensorBoard's event reader may).
"""

import dataclasses
import os
import time

from tb_replica_plugin import analysis, group, registry
from tb_replica_plugin.core import json_stream
from tb_replica_plugin.core.downsample import json_floats
from tb_replica_plugin.families.variables.present import REPORT_TOP
from tb_replica_plugin.read import judge, overview

__all__ = ["REPORT_SCHEMA_VERSION", "REPORT_TOP", "LogDirError", "Report", "json_floats", "load"]

REPORT_SCHEMA_VERSION = 1
# Position of the run's own keys ("findings", "notes", "workers") among the families' blocks.
_CORE_JSON_ORDER = 50


class LogDirError(OSError):
    """Raised when the log dir does not exist or cannot be read."""


@dataclasses.dataclass
class Report:
    """Runs of a log dir, read with every sample kept.

    Attributes:
      logdir: the log directory read.
      runs: `{run: reader.RunData}`; e.g. `runs["fit/replicas"].inputs.batch_size` is an int
        array [steps, replicas] and `.inputs.steps` its step axis.
      findings: `{run: [analysis.Finding, ...]}`, most severe first.
      thresholds: the `analysis.Thresholds` the findings were found with.
      now: the time (seconds since the epoch) the live families (status) were judged at: the
        report says "running" or "silent", and how long ago, as of then.
    """

    logdir: str
    runs: dict
    findings: dict
    thresholds: analysis.Thresholds = dataclasses.field(default_factory=analysis.Thresholds)
    now: float = dataclasses.field(default_factory=time.time)

    def all_findings(self):
        """Every finding of every run, most severe first."""
        return analysis.sort_findings([f for fs in self.findings.values() for f in fs])

    def to_json(self):
        """The JSON document of `tb-replica report --json` (docs/data-format.md)."""
        return {
            "version": REPORT_SCHEMA_VERSION,
            "logdir": self.logdir,
            "runs": [
                {key: json_stream.materialize(value) for key, value in self._run_items(name, data)}
                for name, data in self.runs.items()
            ],
            "summary": analysis.severity_counts(self.all_findings()),
        }

    def json_chunks(self):
        """`to_json()` encoded compactly (`json.dumps(..., allow_nan=False, default=str)`), piece
        by piece: one family block of one run at a time is held as Python objects, not the whole
        document (a 2,048-replica job's document is ~270 MB of text, several times that as
        objects).

        Yields:
          str pieces whose concatenation is `json.dumps(self.to_json(), allow_nan=False,
          default=str)`.

        Raises:
          ValueError: for a NaN or infinite float (the document is strict JSON).
        """
        encode = json_stream.encode
        yield f'{{"version": {encode(REPORT_SCHEMA_VERSION)}, "logdir": {encode(self.logdir)}'
        yield ', "runs": ['
        for index, (name, run_data) in enumerate(self.runs.items()):
            separator = "{"
            yield ", " if index else ""
            for key, value in self._run_items(name, run_data):
                yield f"{separator}{encode(key)}: "
                yield from json_stream.chunks(value)
                separator = ", "
            yield "}"
        yield f'], "summary": {encode(analysis.severity_counts(self.all_findings()))}}}'

    def _run_items(self, name, run_data):
        """One run's entry of `to_json`, as `(key, value)` pairs: `run` and its `source` (from
        every family, `read.overview`), then the family blocks (each computed when reached) and
        the run's own keys."""
        blocks = [
            (family.json_order, index, family) for index, family in enumerate(registry.families())
        ]
        blocks.append((_CORE_JSON_ORDER, -1, None))
        yield "run", name
        yield "source", overview.overview(run_data)["source"]
        for _, _, family in sorted(blocks, key=lambda b: (b[0], b[1])):
            if family is None:
                yield "findings", [f.to_json() for f in self.findings[name]]
                yield "notes", run_data.notes
                yield "workers", run_data.workers
            else:
                yield from self._family_block(family, "report_json", run_data).items()

    def _family_block(self, family, which, run_data):
        """A family's `report_json` or `report_text` of a run (a live family's as of `now`)."""
        block = getattr(family.present, which)
        if family.live:
            return block(run_data, self.thresholds, now=self.now)
        return block(run_data, self.thresholds)

    def to_text(self):
        """Human-readable report, one block per run."""
        lines = [f"tb-replica report: {self.logdir}"]
        if not self.runs:
            lines.append("No replica data found (write some with ReplicaCallback or ReplicaProbe).")
        families = sorted(
            enumerate(registry.families()), key=lambda item: (item[1].text_order, item[0])
        )
        for name, run_data in self.runs.items():
            lines.append("")
            lines.extend(_header_lines(name, run_data))
            for _, family in families:
                lines.extend(self._family_block(family, "report_text", run_data))
            for note in run_data.notes:
                lines.append(f"  note: {note}")
            findings = self.findings[name]
            if not findings:
                lines.append("  findings: none — no problems found in this run.")
            else:
                lines.append(f"  findings ({len(findings)}):")
                for finding in findings:
                    lines.append(f"    [{finding.severity}] {finding.kind}: {finding.message}")
        counts = analysis.severity_counts(self.all_findings())
        lines.append("")
        lines.append(
            f"{len(self.runs)} run(s): {counts['error']} error(s), {counts['warning']} "
            f"warning(s), {counts['info']} info."
        )
        return "\n".join(lines)


def _header_lines(name, run_data):
    """The first lines of a run's block: name, source, replicas, steps, workers, devices."""
    seen = overview.overview(run_data)
    steps = seen["steps"]
    span = f"steps {int(steps[0])}–{int(steps[-1])} ({steps.size})" if steps.size else "no steps"
    replicas, devices = seen["replicas"], seen["devices"]
    inputs = run_data.inputs
    pss = inputs is not None and inputs.strategy == "ParameterServerStrategy"
    unit = "worker" if pss else "replica"  # under ParameterServerStrategy replica r is worker r
    lines = [
        f"run {name}  [{seen['source'] or 'unknown source'}]",
        f"  {unit}s: {len(replicas)}   {span}",
    ]
    if run_data.workers:
        lines.append(f"  multi-worker job: {len(run_data.workers)} workers")
    if pss:
        lines.append("  ParameterServerStrategy: worker r is replica r, step k each worker's k-th")
    for replica, device in zip(replicas, devices, strict=False):
        lines.append(f"    {unit} {replica}: {device}")
    return lines


def load(logdir, run=None, thresholds=None, processes=1, now=None):
    """Reads a log dir into per-run per-replica numpy arrays and findings.

    Args:
      logdir: the log directory (as given to `tensorboard --logdir`).
      run: optional shell-style pattern of run names to keep, e.g. `"*/replicas"`.
      thresholds: `analysis.Thresholds` for the findings (default: `analysis.Thresholds()`).
      processes: processes reading the event files (`group.read_log_dir`): more than 1 reads
        the runs and the workers of each multi-worker job in parallel (each new process takes a
        second or more to start, so it pays off from about 1 GB of events). From a script,
        call `load` under `if __name__ == "__main__":` then (the new processes import the main
        module).
      now: the time (seconds since the epoch) to judge the runs' status at (default: when the
        log dir has been read); two reports of the same files with the same `now` are equal.

    Returns:
      A `Report`.

    Raises:
      LogDirError: if `logdir` is not a readable directory.

    Example:
      ```python
      report = tb_replica_plugin.load("logs")
      series = report.runs["replicas"].inputs
      series.batch_size[:3]          # array([[4, 4], [4, 4], [1, 0]])
      [f.message for f in report.findings["replicas"]]
      ```
    """
    logdir = os.fspath(logdir)
    if "://" not in logdir:
        if not os.path.isdir(logdir):
            raise LogDirError(f"log dir {logdir!r} does not exist or is not a directory")
        if not os.access(logdir, os.R_OK | os.X_OK):
            raise LogDirError(f"log dir {logdir!r} is not readable")
    runs = group.read_log_dir(logdir, run, processes=processes)
    thresholds = thresholds or analysis.Thresholds()
    now = time.time() if now is None else float(now)
    findings = {name: judge.find_run(data, thresholds, now=now) for name, data in runs.items()}
    return Report(logdir=logdir, runs=runs, findings=findings, thresholds=thresholds, now=now)
