"""The TensorBoard plugin: thin HTTP routes over the data provider and the analysis.

Routes are documented in `http_api.md`. No TensorFlow import: TensorBoard may run without it.
"""

import os
import warnings

import numpy as np
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tb_replica_plugin import analysis, metadata, reader
from tb_replica_plugin.families.examples import rules as examples_rules
from tb_replica_plugin.families.gradients import rules as gradients_rules
from tb_replica_plugin.families.rng import rules as rng_rules
from tb_replica_plugin.families.step_time import rules as step_time_rules

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
DEFAULT_MAX_POINTS = 2000
MAX_POINTS_RANGE = (2, 100_000)
_CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".map": "application/json"}


class BadRequestError(ValueError):
    """A request argument is missing or malformed (answered with 400)."""


def _error(request, status, message):
    return http_util.Respond(request, {"error": message}, "application/json", code=status)


def downsample_inputs(series, max_points):
    """The `/inputs` response body for a series, cut to at most `max_points` step buckets.

    Args:
      series: a `reader.InputsSeries`.
      max_points: most buckets on the step axis.

    Returns:
      The JSON-ready dict documented in `http_api.md` (`steps`, `batch_size`, ...).
    """
    steps, sizes = series.steps, series.batch_size
    count = int(steps.size)
    if count > max_points:
        bucket = -(-count // max_points)
        starts = np.arange(0, count, bucket)
        lows = np.minimum.reduceat(sizes, starts, axis=0)
        highs = np.maximum.reduceat(sizes, starts, axis=0)
        steps, sizes = steps[starts], sizes[starts]
    else:
        lows = highs = sizes
    if sizes.size:
        high, low = sizes.max(axis=1), sizes.min(axis=1).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            imbalance = np.where(high == low, 1.0, high / low)
    else:
        imbalance = np.ones(steps.size)
    return {
        "run": series.run,
        "replicas": series.replicas,
        "devices": series.devices,
        "source": series.source,
        "steps": steps.tolist(),
        "batch_size": sizes.tolist(),
        "batch_size_min": lows.tolist(),
        "batch_size_max": highs.tolist(),
        "imbalance": imbalance.tolist(),
        "downsampled": count > max_points,
        "shape_events": [
            {"step": event["step"], "inputs": event["inputs"]} for event in series.shape_events
        ],
        "workers": series.workers,
        "notes": series.notes,
    }


def _pick(count, max_points):
    """Indices of at most `max_points` evenly spaced items of `count` (all when None/fewer)."""
    if max_points is None or count <= max_points:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, max_points).round().astype(np.int64))


def _hex(value):
    return f"{int(value) & 0xFFFFFFFFFFFFFFFF:016x}"


def rng_body(series, max_points=None):
    """The `/rng` response body (documented in `http_api.md`) for a `reader.RngSeries`.

    Fingerprints and states are 64-bit: they are sent as hex strings (JavaScript numbers hold
    53 bits), and per step as stream groups (replicas with equal streams share a group id).

    Args:
      series: the series.
      max_points: most logged steps sent (evenly spaced); None sends every one. The match
        matrices always cover every logged step.
    """
    picked = _pick(series.steps.size, max_points)
    generators = []
    for index, generator in enumerate(series.generators):
        fingerprint = series.fingerprint[:, index]
        state = series.state[:, index, :, : generator["state_size"]]
        equal = fingerprint[:, :, None] == fingerprint[:, None, :]
        last = series.steps.size - 1
        generators.append(
            {
                **generator,
                "match": equal.mean(axis=0).round(6).tolist() if last >= 0 else [],
                "stream_groups": [rng_rules.stream_groups(fingerprint[s]) for s in picked],
                "state_groups": [rng_rules.stream_groups(state[s]) for s in picked],
                "last_fingerprint": [_hex(v) for v in fingerprint[last]] if last >= 0 else [],
                "last_state": [[_hex(w) for w in row] for row in state[last]] if last >= 0 else [],
            }
        )
    return {
        "run": series.run,
        "replicas": series.replicas,
        "devices": series.devices,
        "steps": series.steps[picked].tolist(),
        "logged_steps": int(series.steps.size),
        "downsampled": bool(picked.size < series.steps.size),
        "generators": generators,
        "notes": series.notes,
    }


def data_body(series, max_points=None):
    """The `/data` response body (documented in `http_api.md`) for a `reader.DataSeries`.

    Args:
      series: the series.
      max_points: most logged steps sent (evenly spaced; `duplicate_share` keeps each bucket's
        maximum); None sends every one. Totals and matrices always cover every logged step.
    """
    share, steps_shared = examples_rules.data_pair_shares(series)
    window_distinct = np.diagonal(series.window_shared, axis1=1, axis2=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        dup_share = np.where(
            window_distinct > 0, series.window_duplicated / np.maximum(window_distinct, 1), 0.0
        )
    picked = _pick(series.steps.size, max_points)
    if picked.size < series.steps.size and picked.size:
        dup_share = np.maximum.reduceat(dup_share, picked, axis=0)
    else:
        dup_share = dup_share[picked]
    totals = series.window_shared.sum(axis=0).diagonal()
    last = series.steps.size - 1
    sketch = []
    if last >= 0:
        for row, distinct in zip(series.sketch[last], series.distinct[last], strict=True):
            sketch.append([_hex(v) for v in row[: min(int(distinct), row.size)]])
    return {
        "run": series.run,
        "replicas": series.replicas,
        "steps": series.steps[picked].tolist(),
        "window_steps": series.window_steps[picked].tolist(),
        "logged_steps": int(series.steps.size),
        "total_steps": int(series.window_steps.sum()),
        "sampled": bool(series.sampled),
        "downsampled": bool(picked.size < series.steps.size),
        "batch_size": series.batch_size[picked].tolist(),
        "distinct": series.distinct[picked].tolist(),
        "duplicate_share": dup_share.round(6).tolist(),
        "share": share.round(6).tolist(),
        "steps_shared": steps_shared.tolist(),
        "total_distinct": totals.tolist(),
        "total_duplicated": series.window_duplicated.sum(axis=0).tolist(),
        "last_sketch": sketch,
        "notes": series.notes,
    }


def _bucket_means(values, starts):
    """Mean of each bucket of rows (NaN-aware; an all-NaN bucket stays NaN)."""
    sums = np.add.reduceat(np.nan_to_num(values), starts, axis=0)
    counts = np.add.reduceat(np.isfinite(values).astype(np.int64), starts, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def step_time_body(run_data, max_points):
    """The `/step_time` response body of a multi-worker job (see `http_api.md`).

    Args:
      run_data: a `reader.RunData` (a job; a single-worker run gives empty series).
      max_points: most buckets on the step axis (bucket means beyond).

    Returns:
      The JSON-ready dict: per-worker busy seconds, lateness, period and summary medians.
    """
    series = run_data.step_time
    workers = run_data.workers
    if series is None or not series.steps.size:
        return {
            "run": run_data.run,
            "workers": workers,
            "steps": [],
            "busy": [],
            "lateness": [],
            "period": [],
            "median_busy": [],
            "median_lateness": [],
            "downsampled": False,
        }
    steps, busy, lateness, period = series.steps, series.busy, series.lateness, series.period
    count = int(steps.size)
    downsampled = count > max_points
    if downsampled:
        starts = np.arange(0, count, -(-count // max_points))
        steps = steps[starts]
        busy, lateness, period = (_bucket_means(v, starts) for v in (busy, lateness, period))

    median_busy, median_lateness = step_time_rules.step_time_medians(series)
    return {
        "run": run_data.run,
        "workers": workers,
        "steps": steps.tolist(),
        "busy": busy.tolist(),
        "lateness": lateness.tolist(),
        "period": period.tolist(),
        "median_busy": median_busy,
        "median_lateness": median_lateness,
        "downsampled": downsampled,
    }


DEFAULT_TOP = 5
TOP_RANGE = (1, 1000)


def _nanmax(values, axis=None):
    """`np.nanmax` that gives NaN (not a warning) for all-NaN slices."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(values, axis=axis) if values.size else np.full((), np.nan)


def _floats(values):
    """A nested list of floats with NaN as None (JSON null: 'not measured')."""
    array = np.asarray(values, dtype=np.float64)
    return np.where(np.isnan(array), None, array).tolist()


def variables_body(series, thresholds=None, top=DEFAULT_TOP, max_points=None):
    """The `/variables` response body (and the report's `variables` block) for one run.

    Args:
      series: a `reader.VariablesSeries`, or None (the run recorded no variables).
      thresholds: `analysis.Thresholds` (its `variable_drift_rel_l2` is returned as tolerance).
      top: how many of the most divergent variables get per-step, per-replica series.
      max_points: most buckets on the step axis (None: every logged step); a bucket keeps the
        largest value of each series over its steps.

    Returns:
      The JSON-ready dict documented in `http_api.md`.
    """
    thresholds = thresholds or analysis.Thresholds()
    tolerance = thresholds.variable_drift_rel_l2
    if series is None:
        return {
            "replicas": [],
            "devices": [],
            "steps": [],
            "exact_steps": [],
            "downsampled": False,
            "tolerance": tolerance,
            "variables": [],
            "top": [],
            "notes": [],
        }
    steps = series.steps
    rel, max_abs = series.rel_l2, series.max_abs
    count = int(steps.size)
    downsampled = max_points is not None and count > max_points
    if downsampled:
        bucket = -(-count // max_points)
        starts = np.arange(0, count, bucket)
        rel, max_abs = _bucket_max(rel, starts), _bucket_max(max_abs, starts)
        steps = steps[starts]
    rows = []
    for index, variable in enumerate(series.variables):
        per_variable = series.rel_l2[:, index, :]
        with np.errstate(invalid="ignore"):
            above = np.flatnonzero((per_variable > tolerance).any(axis=1))
        both = series.hash_comparable[index]  # copies of r and 0, hashed alike
        differ = ~series.identical[:, index, :] & both
        compared = int(both[1:].sum())
        rows.append(
            {
                **{k: variable.get(k) for k in ("name", "shape", "dtype", "trainable", "sync")},
                "devices": variable.get("devices", []),
                "mirrored": bool(variable.get("mirrored", True)),
                "present": series.present[index].tolist(),
                "max_rel_l2": _floats(_nanmax(per_variable)),
                "max_abs": _floats(_nanmax(series.max_abs[:, index, :])),
                "max_abs_exact": bool(series.exact.size and series.exact.all()),
                "compared_replicas": compared,
                "bit_identical": None if compared == 0 else not bool(differ.any()),
                "first_drift_step": int(series.steps[above[0]]) if above.size else None,
            }
        )
    candidates = [i for i, v in enumerate(series.variables) if v.get("sync") != "on_read"]
    score = {i: _nanmax(series.rel_l2[:, i, :]) for i in candidates}
    ranked = sorted(
        candidates, key=lambda i: (-(0.0 if np.isnan(score[i]) else float(score[i])), i)
    )
    top_rows = [
        {
            "name": series.variables[i]["name"],
            "index": i,
            "max_rel_l2": _floats(_nanmax(rel[:, i, :], axis=1)),
            "rel_l2": _floats(rel[:, i, :]),
            "max_abs": _floats(max_abs[:, i, :]),
        }
        for i in ranked[:top]
    ]
    return {
        "run": series.run,
        "replicas": series.replicas,
        "devices": series.devices,
        "steps": steps.tolist(),
        "exact_steps": series.steps[series.exact].tolist(),
        "downsampled": bool(downsampled),
        "tolerance": tolerance,
        "variables": rows,
        "top": top_rows,
        "notes": series.notes,
    }


def parse_top(raw):
    """Parses the `top` argument.

    Raises:
      BadRequestError: if it is not an integer in `TOP_RANGE`.
    """
    return _parse_int("top", raw, DEFAULT_TOP, TOP_RANGE)


def _all_steps(run_data):
    """The recorded steps of every family of a run (for its first and last step)."""
    parts = [run_data.inputs.steps]
    if run_data.variables is not None:
        parts.append(run_data.variables.steps)
    if run_data.gradients is not None:
        parts += [run_data.gradients.steps, run_data.gradients.nonfinite_steps]
    return np.concatenate([np.asarray(p, np.int64) for p in parts])


def first_step(run_data):
    """The first step any family recorded (None without any)."""
    steps = _all_steps(run_data)
    return int(steps.min()) if steps.size else None


def last_step(run_data):
    """The last step any family recorded (None without any)."""
    steps = _all_steps(run_data)
    return int(steps.max()) if steps.size else None


def _bucket_max(values, starts):
    """Per bucket (rows starting at `starts`) the max over its rows, NaN only if all are NaN."""
    filled = np.where(np.isnan(values), -np.inf, values)
    result = np.maximum.reduceat(filled, starts, axis=0)
    return np.where(result == -np.inf, np.nan, result)


def gradients_body(series, max_points, step=None):
    """The `/gradients` response body for a `reader.GradientsSeries` (see `http_api.md`).

    Args:
      series: the run's `GradientsSeries`.
      max_points: most buckets on the step axis (norms and ratios: max of the bucket).
      step: the step of the layer × replica matrix: the last logged step at or before it (the
        first logged step if none). None: the logged step with the largest ratio to the median
        (the likeliest outlier), else the last logged step.

    Returns:
      The JSON-ready dict.
    """
    steps, norms, loss = series.steps, series.global_norm, series.loss
    ratio = gradients_rules.ratio_to_median(norms)
    count = int(steps.size)
    if count > max_points:
        bucket = -(-count // max_points)
        starts = np.arange(0, count, bucket)
        steps, loss = steps[starts], loss[starts]
        norms, ratio = _bucket_max(norms, starts), _bucket_max(ratio, starts)
    layer_index = None
    if series.steps.size:
        if step is not None:
            layer_index = max(0, int(np.searchsorted(series.steps, step, side="right")) - 1)
        else:
            full_ratio = gradients_rules.ratio_to_median(series.global_norm)
            finite = np.where(np.isfinite(full_ratio), full_ratio, 0.0)
            peak = finite.max(axis=1) if finite.size else finite
            layer_index = int(np.argmax(peak)) if peak.size and peak.max() > 1.0 else count - 1
    if layer_index is None:
        layer_step, layer_norms, layer_ratio = None, [], []
    else:
        matrix = series.variable_norms[layer_index]
        layer_step = int(series.steps[layer_index])
        layer_norms = matrix.tolist()
        layer_ratio = gradients_rules.ratio_to_median(matrix).tolist()
    return {
        "run": series.run,
        "replicas": series.replicas,
        "variables": series.variables,
        "shapes": series.shapes,
        "has_loss": series.has_loss,
        "scaling": series.scaling,
        "steps": steps.tolist(),
        "global_norm": norms.tolist(),
        "ratio": ratio.tolist(),
        "loss": loss.tolist(),
        "downsampled": count > max_points,
        "layer_step": layer_step,
        "layer_norms": layer_norms,
        "layer_ratio": layer_ratio,
        "nonfinite": [
            {
                "step": int(event_step),
                "grad_nan": counts[0].tolist(),
                "grad_inf": counts[1].tolist(),
                "loss_nan": counts[2].tolist(),
                "loss_inf": counts[3].tolist(),
            }
            for event_step, counts in zip(series.nonfinite_steps, series.nonfinite, strict=True)
        ],
    }


def _parse_int(name, raw, default, bounds=None):
    """An integer query argument: `default` when absent.

    Raises:
      BadRequestError: if it is not an integer, or outside `bounds` (inclusive) when given.
    """
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequestError(f"{name} must be an integer, got {raw!r}") from None
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise BadRequestError(f"{name} must be between {bounds[0]} and {bounds[1]}, got {value}")
    return value


def parse_step(raw):
    """Parses the optional `step` argument (an integer; empty means absent).

    Raises:
      BadRequestError: if it is not an integer.
    """
    return None if raw == "" else _parse_int("step", raw, None)


def parse_max_points(raw):
    """Parses the `max_points` argument.

    Raises:
      BadRequestError: if it is not an integer in `MAX_POINTS_RANGE`.
    """
    return _parse_int("max_points", raw, DEFAULT_MAX_POINTS, MAX_POINTS_RANGE)


class ReplicasPlugin(base_plugin.TBPlugin):
    """The "Replicas" tab: per-replica inputs, charts, heatmaps and findings."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context):
        """Args:
        context: the `base_plugin.TBContext` given by TensorBoard.
        """
        self._provider = context.data_provider

    def get_plugin_apps(self):
        return {
            "/index.js": self._serve_index,
            "/static/*": self._serve_static,
            "/runs": self._serve_runs,
            "/inputs": self._serve_inputs,
            "/findings": self._serve_findings,
            "/rng": self._serve_rng,
            "/data": self._serve_data,
            "/step_time": self._serve_step_time,
            "/variables": self._serve_variables,
            "/gradients": self._serve_gradients,
        }

    def is_active(self):
        return False  # activity comes from data_plugin_names()

    def data_plugin_names(self):
        return (metadata.PLUGIN_NAME,)

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Replicas")

    # ------------------------------------------------------------------ static

    def _static_response(self, request, name):
        # Only plain file names that exist in static/ are served: no path can leave the folder.
        if name not in os.listdir(STATIC_DIR):
            return _error(request, 404, f"no static file {name!r}")
        path = os.path.join(STATIC_DIR, name)
        if not os.path.isfile(path):
            return _error(request, 404, f"no static file {name!r}")
        with open(path, "rb") as handle:
            body = handle.read()
        content_type = _CONTENT_TYPES.get(os.path.splitext(name)[1], "application/octet-stream")
        return http_util.Respond(request, body, content_type)

    @wrappers.Request.application
    def _serve_index(self, request):
        return self._static_response(request, "index.js")

    @wrappers.Request.application
    def _serve_static(self, request):
        prefix = "/static/"
        path = request.path
        name = path[path.index(prefix) + len(prefix) :] if prefix in path else ""
        return self._static_response(request, name)

    # -------------------------------------------------------------------- data

    def _read_runs(self, request, run=None):
        """`{run: reader.RunData}` of every run, or of `run` only.

        Raises:
          reader.RunNotFoundError: if `run` is given and has no data of this plugin.
        """
        from tensorboard import plugin_util

        ctx = plugin_util.context(request.environ)
        experiment_id = plugin_util.experiment_id(request.environ)
        # The workers of a multi-worker job are read and merged as one job named after it.
        return reader.read_runs(self._provider, ctx, experiment_id, run=run)

    @wrappers.Request.application
    def _serve_runs(self, request):
        result = []
        for run, run_data in self._read_runs(request).items():
            series = run_data.inputs
            replicas, devices = series.replicas, series.devices
            variables = run_data.variables
            if variables is not None and not replicas:
                replicas, devices = variables.replicas, variables.devices
            result.append(
                {
                    "run": run,
                    "replicas": replicas,
                    "devices": devices,
                    "source": series.source or getattr(variables, "source", ""),
                    "first_step": first_step(run_data),
                    "last_step": last_step(run_data),
                    "variables": 0 if variables is None else len(variables.variables),
                    "findings": analysis.severity_counts(analysis.find_run(run_data)),
                    "families": ["inputs"] * bool(series.steps.size)
                    + [
                        family
                        for family in ("gradients", "rng", "data", "variables")
                        if getattr(run_data, family, None) is not None
                    ],
                    "notes": run_data.notes,
                    "workers": run_data.workers,
                }
            )
        return http_util.Respond(request, {"runs": result}, "application/json")

    def _one_run(self, request, parsers):
        """The run a route's request names, its `RunData` and its parsed arguments.

        Args:
          request: the werkzeug request; `run` is required.
          parsers: `{argument name: parse function}`, applied in order to the raw values.

        Returns:
          `(run, run_data, {name: parsed value}, None)`, or `(run, None, None, response)` with
          the 400 (missing run, bad argument) or 404 (unknown run) error response to return.
        """
        run = request.args.get("run")
        if not run:
            return run, None, None, _error(request, 400, "missing argument 'run'")
        try:
            parsed = {name: parse(request.args.get(name)) for name, parse in parsers.items()}
            return run, self._read_runs(request, run)[run], parsed, None
        except BadRequestError as error:
            return run, None, None, _error(request, 400, str(error))
        except reader.RunNotFoundError:
            return run, None, None, _error(request, 404, f"no replica data for run {run!r}")

    @wrappers.Request.application
    def _serve_inputs(self, request):
        _, run_data, args, error = self._one_run(request, {"max_points": parse_max_points})
        if error:
            return error
        body = downsample_inputs(run_data.inputs, args["max_points"])
        return http_util.Respond(request, body, "application/json")

    @wrappers.Request.application
    def _serve_variables(self, request):
        parsers = {"max_points": parse_max_points, "top": parse_top}
        run, run_data, args, error = self._one_run(request, parsers)
        if error:
            return error
        body = variables_body(run_data.variables, top=args["top"], max_points=args["max_points"])
        body["run"] = run
        return http_util.Respond(request, body, "application/json")

    @wrappers.Request.application
    def _serve_rng(self, request):
        return self._family_response(request, "rng", rng_body)

    @wrappers.Request.application
    def _serve_data(self, request):
        return self._family_response(request, "data", data_body)

    def _family_response(self, request, family, body):
        run, run_data, args, error = self._one_run(request, {"max_points": parse_max_points})
        if error:
            return error
        series = getattr(run_data, family)
        if series is None:
            # A run without this family answers 200 with no data: the tab asks every run.
            empty = {"run": run, "replicas": [], "steps": [], "logged_steps": 0, "notes": []}
            empty.update({"generators": []} if family == "rng" else {"total_steps": 0})
            return http_util.Respond(request, empty, "application/json")
        return http_util.Respond(request, body(series, args["max_points"]), "application/json")

    @wrappers.Request.application
    def _serve_step_time(self, request):
        _, run_data, args, error = self._one_run(request, {"max_points": parse_max_points})
        if error:
            return error
        body = step_time_body(run_data, args["max_points"])
        return http_util.Respond(request, body, "application/json")

    @wrappers.Request.application
    def _serve_gradients(self, request):
        parsers = {"max_points": parse_max_points, "step": parse_step}
        run, run_data, args, error = self._one_run(request, parsers)
        if error:
            return error
        if run_data.gradients is None:
            return _error(request, 404, f"no gradient data for run {run!r}")
        body = gradients_body(run_data.gradients, args["max_points"], args["step"])
        body["notes"] = run_data.notes
        return http_util.Respond(request, body, "application/json")

    @wrappers.Request.application
    def _serve_findings(self, request):
        run = request.args.get("run")
        try:
            runs = self._read_runs(request, run)
        except reader.RunNotFoundError:
            return _error(request, 404, f"no replica data for run {run!r}")
        findings = [f for run_data in runs.values() for f in analysis.find_run(run_data)]
        body = {"findings": [f.to_json() for f in analysis.sort_findings(findings)]}
        return http_util.Respond(request, body, "application/json")
