"""The report: every run of a log dir with its per-replica series and findings.

`load` is the notebook-friendly read API; `tb-replica report` prints `Report.to_text()` or
`Report.to_json()`. Imports no TensorFlow itself (TensorBoard's event reader may).
"""

import dataclasses
import os

import numpy as np

from tb_replica_plugin import analysis, plugin, reader
from tb_replica_plugin.families.examples import rules as examples_rules
from tb_replica_plugin.families.gradients import rules as gradients_rules
from tb_replica_plugin.families.inputs import read as inputs_read
from tb_replica_plugin.families.rng import rules as rng_rules
from tb_replica_plugin.families.step_time import rules as step_time_rules

REPORT_SCHEMA_VERSION = 1
REPORT_TOP = 5  # most divergent variables with per-step series in the report


def json_floats(array):
    """Nested lists of floats with NaN/Inf as the strings "NaN", "Infinity", "-Infinity" (as
    TensorBoard's HTTP responses write them), so the document is strict JSON."""

    def convert(value):
        if isinstance(value, list):
            return [convert(v) for v in value]
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return value

    return convert(np.asarray(array, np.float64).tolist())


def gradients_json(series):
    """The `gradients` block of a run in `tb-replica report --json` (None without gradients)."""
    if series is None:
        return None
    return {
        "variables": series.variables,
        "shapes": series.shapes,
        "has_loss": series.has_loss,
        "scaling": series.scaling,
        "steps": series.steps.tolist(),
        "global_norm": json_floats(series.global_norm),
        "ratio_to_median": json_floats(gradients_rules.ratio_to_median(series.global_norm)),
        "loss": json_floats(series.loss),
        "variable_norms": json_floats(series.variable_norms),
        "nonfinite": [
            {
                "step": int(step),
                "grad_nan": counts[0].tolist(),
                "grad_inf": counts[1].tolist(),
                "loss_nan": counts[2].tolist(),
                "loss_inf": counts[3].tolist(),
            }
            for step, counts in zip(series.nonfinite_steps, series.nonfinite, strict=True)
        ],
    }


def _fmt(value):
    return f"{value:.4g}" if np.isfinite(value) else str(value)


def gradients_text(series, max_events=20):
    """The lines of the gradients block of `tb-replica report` (text)."""
    if series is None:
        return []
    lines = []
    steps = (
        f"{series.steps.size} logged step(s) {int(series.steps[0])}–{int(series.steps[-1])}"
        if series.steps.size
        else "no logged steps"
    )
    what = (
        "gradient of each replica's own loss"
        if series.scaling == "replica_loss"
        else ("gradients as given")
    )
    lines.append(f"  gradients ({what}), {steps}, {len(series.variables)} variable(s):")
    if series.steps.size:
        ratio = gradients_rules.ratio_to_median(series.global_norm)
        with np.errstate(all="ignore"):
            for index, replica in enumerate(series.replicas):
                norms = series.global_norm[:, index]
                finite = ratio[:, index][np.isfinite(ratio[:, index])]
                peak = finite.max() if finite.size else float("nan")
                loss = series.loss[-1, index]
                loss_text = f", last loss {_fmt(loss)}" if series.has_loss else ""
                lines.append(
                    f"    replica {replica}: median norm {_fmt(np.nanmedian(norms))}, last "
                    f"{_fmt(norms[-1])}, max ratio to median {_fmt(peak)}{loss_text}"
                )
    if series.nonfinite_steps.size:
        lines.append("  NaN/Inf (step: replica grad NaN/Inf, loss NaN/Inf):")
        for step, counts in list(zip(series.nonfinite_steps, series.nonfinite, strict=True))[
            :max_events
        ]:
            parts = [
                f"replica {replica} {counts[0, i]}/{counts[1, i]}, {counts[2, i]}/{counts[3, i]}"
                for i, replica in enumerate(series.replicas)
                if counts[:, i].sum()
            ]
            lines.append(f"    step {int(step)}: " + "; ".join(parts))
        if series.nonfinite_steps.size > max_events:
            lines.append(f"    … {series.nonfinite_steps.size - max_events} more (see --json)")
    return lines


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
    """

    logdir: str
    runs: dict
    findings: dict
    thresholds: analysis.Thresholds = dataclasses.field(default_factory=analysis.Thresholds)

    def all_findings(self):
        """Every finding of every run, most severe first."""
        return analysis.sort_findings([f for fs in self.findings.values() for f in fs])

    def to_json(self):
        """The JSON document of `tb-replica report --json` (schema in README)."""
        runs = []
        for name, run_data in self.runs.items():
            series = run_data.inputs
            runs.append(
                {
                    "run": name,
                    "source": series.source or getattr(run_data.variables, "source", ""),
                    "replicas": series.replicas,
                    "devices": series.devices,
                    "num_replicas": series.num_replicas,
                    "first_step": int(series.steps[0]) if series.steps.size else None,
                    "last_step": int(series.steps[-1]) if series.steps.size else None,
                    "steps": series.steps.tolist(),
                    "batch_size": series.batch_size.tolist(),
                    "shape_events": [
                        {"step": e["step"], "inputs": e["inputs"]} for e in series.shape_events
                    ],
                    "rng": plugin.rng_body(run_data.rng) if run_data.rng else None,
                    "data": plugin.data_body(run_data.data) if run_data.data else None,
                    "variables": None
                    if run_data.variables is None
                    else plugin.variables_body(run_data.variables, self.thresholds, top=REPORT_TOP),
                    "gradients": gradients_json(run_data.gradients),
                    "findings": [f.to_json() for f in self.findings[name]],
                    "notes": run_data.notes,
                    "workers": run_data.workers,
                    "step_time": _step_time_json(run_data),
                }
            )
        findings = self.all_findings()
        return {
            "version": REPORT_SCHEMA_VERSION,
            "logdir": self.logdir,
            "runs": runs,
            "summary": analysis.severity_counts(findings),
        }

    def to_text(self):
        """Human-readable report, one block per run."""
        lines = [f"tb-replica report: {self.logdir}"]
        if not self.runs:
            lines.append("No replica data found (write some with ReplicaCallback or ReplicaProbe).")
        for name, run_data in self.runs.items():
            series = run_data.inputs
            lines.append("")
            steps = (
                f"steps {int(series.steps[0])}–{int(series.steps[-1])} ({series.steps.size})"
                if series.steps.size
                else "no steps"
            )
            replicas, devices = series.replicas, series.devices
            if not replicas and run_data.variables is not None:
                replicas, devices = run_data.variables.replicas, run_data.variables.devices
            source = series.source or getattr(run_data.variables, "source", "")
            lines.append(f"run {name}  [{source or 'unknown source'}]")
            lines.append(f"  replicas: {len(replicas)}   {steps}")
            if run_data.workers:
                lines.append(f"  multi-worker job: {len(run_data.workers)} workers")
            for replica, device in zip(replicas, devices, strict=False):
                lines.append(f"    replica {replica}: {device}")
            lines.extend(_step_time_lines(run_data))
            if series.shape_events:
                lines.append("  batch size per replica (step: sizes), at every change:")
            for event in series.shape_events[:20]:
                sizes = inputs_read.event_batch_sizes(event)
                lines.append(f"    step {event['step']}: {sizes}")
                for entry in event["inputs"]:
                    shapes = "  ".join(
                        f"{list(s)}:{d}"
                        for s, d in zip(entry["shapes"], entry["dtypes"], strict=False)
                    )
                    flag = "  <-- mismatch" if entry["mismatch"] else ""
                    lines.append(f"      {entry['name']}: {shapes}{flag}")
            if len(series.shape_events) > 20:
                lines.append(f"    … {len(series.shape_events) - 20} more changes (see --json)")
            lines.extend(_rng_text(run_data.rng))
            lines.extend(_data_text(run_data.data))
            lines.extend(_variables_text(run_data.variables, self.thresholds))
            lines.extend(gradients_text(run_data.gradients))
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


def _rng_text(series):
    """The rng block of the text report: per generator, which replicas draw the same numbers."""
    if series is None or series.steps.size == 0:
        return []
    lines = [f"  random generators ({series.steps.size} logged steps):"]
    for index, generator in enumerate(series.generators):
        fingerprint = series.fingerprint[:, index]
        identical = sum(
            len(set(rng_rules.stream_groups(row))) < series.num_replicas for row in fingerprint
        )
        groups = rng_rules.stream_groups(fingerprint[-1])
        owner = f", layer {generator['layer_class']}" if generator.get("layer_class") else ""
        if not generator.get("mirrored"):
            lines.append(
                f"    {generator['name']} [{generator['kind']}{owner}]: one state shared by "
                "every replica (not mirrored), draws serialised; not compared"
            )
            continue
        lines.append(
            f"    {generator['name']} [{generator['kind']}{owner}]: replicas draw the same "
            f"numbers at {identical}/{series.steps.size} logged steps; last step stream "
            f"groups {groups}"
        )
    return lines


def _data_text(series):
    """The data block of the text report: examples shared by replica pairs over the run."""
    if series is None or series.steps.size == 0:
        return []
    share, steps_shared = examples_rules.data_pair_shares(series)
    total = int(series.window_steps.sum())
    pairs = [
        f"{series.replicas[r]}–{series.replicas[q]}: {share[r, q]:.0%} at "
        f"{int(steps_shared[r, q])} steps"
        for r in range(series.num_replicas)
        for q in range(r + 1, series.num_replicas)
        if share[r, q] > 0
    ]
    kind = "sampled steps" if getattr(series, "sampled", False) else "steps"
    head = f"  examples ({total} {kind}): shared at the same step by replica pair: "
    return [head + ("; ".join(pairs) if pairs else "none")]


def _rounded(values):
    return [None if v is None else round(v, 6) for v in values]


def _step_time_json(run_data):
    """The `step_time` block of a job in the JSON report (None for a single-worker run)."""
    series = run_data.step_time
    if series is None:
        return None
    return {
        "workers": series.workers,
        "steps": series.steps.tolist(),
        "busy": [[_finite(v) for v in row] for row in series.busy.tolist()],
        "lateness": [[_finite(v) for v in row] for row in series.lateness.tolist()],
        "period": [[_finite(v) for v in row] for row in series.period.tolist()],
        "median_busy": _rounded(step_time_rules.step_time_medians(series)[0]),
        "median_lateness": _rounded(step_time_rules.step_time_medians(series)[1]),
    }


def _finite(value):
    return None if value is None or not np.isfinite(value) else round(float(value), 6)


def _step_time_lines(run_data):
    series = run_data.step_time
    if series is None or not series.steps.size:
        return []
    lines = ["  step time per worker (median over logged steps after the first):"]
    busy, late = step_time_rules.step_time_medians(series)
    for index, worker in enumerate(run_data.workers):
        replicas = ", ".join(str(r) for r in worker["replicas"])
        if busy[index] is None:
            lines.append(f"    {worker['name']} (replicas {replicas}): not enough steps")
            continue
        lines.append(
            f"    {worker['name']} (replicas {replicas}): busy {busy[index]:.3f} s/step, "
            f"arrives {late[index]:.3f} s after the first worker"
        )
    return lines


def load(logdir, run=None, thresholds=None):
    """Reads a log dir into per-run per-replica numpy arrays and findings.

    Args:
      logdir: the log directory (as given to `tensorboard --logdir`).
      run: optional shell-style pattern of run names to keep, e.g. `"*/replicas"`.
      thresholds: `analysis.Thresholds` for the findings (default: `analysis.Thresholds()`).

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
    runs = reader.read_log_dir(logdir, run)
    thresholds = thresholds or analysis.Thresholds()
    findings = {name: analysis.find_run(data, thresholds) for name, data in runs.items()}
    return Report(logdir=logdir, runs=runs, findings=findings, thresholds=thresholds)


def _fmt(value):
    return "—" if value is None else f"{value:.3g}"


def _variables_text(series, thresholds, top=REPORT_TOP):
    """The weight-drift and placement block of one run in `to_text`."""
    if series is None:
        return []
    body = plugin.variables_body(series, thresholds, top=top)
    rows = body["variables"]
    steps = series.steps
    span = f"{int(steps[0])}–{int(steps[-1])} ({steps.size})" if steps.size else "none"
    mirrored = sum(1 for row in rows if row["mirrored"])
    exact = f", exact check at {len(body['exact_steps'])}" if body["exact_steps"] else ""
    lines = [
        f"  variables: {len(rows)} ({mirrored} mirrored on every replica), logged steps "
        f"{span}{exact}; drift of each copy from replica 0 (tolerance relative L2 "
        f"{thresholds.variable_drift_rel_l2:g}):"
    ]
    by_name = {row["name"]: row for row in rows}
    for entry in body["top"]:
        row = by_name[entry["name"]]
        if row["bit_identical"] is None:
            state = "not compared (no copy on another replica)"
        elif row["bit_identical"]:
            state = "bit-identical on every replica"
        else:
            bound = "" if row["max_abs_exact"] else "≥"
            first = row["first_drift_step"]
            state = (
                f"max rel L2 {_fmt(row['max_rel_l2'])}, max |diff| {bound}{_fmt(row['max_abs'])}"
                + (f", above tolerance from step {first}" if first is not None else "")
            )
        lines.append(f"    {entry['name']}: {state}")
    if len(rows) > len(body["top"]):
        lines.append(f"    … {len(rows) - len(body['top'])} more variables (see --json)")
    for row in rows:
        if not row["mirrored"]:
            lines.append(f"    not mirrored: {row['name']} on {', '.join(row['devices'])}")
    return lines
