"""The TensorBoard plugin: thin HTTP routes over the data provider and the analysis.

Routes are documented in `http_api.md`. No TensorFlow import: TensorBoard may run without it.
"""

import os

import numpy as np
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tb_replica_plugin import analysis, metadata, reader

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
        "notes": series.notes,
    }


def parse_max_points(raw):
    """Parses the `max_points` argument.

    Raises:
      BadRequestError: if it is not an integer in `MAX_POINTS_RANGE`.
    """
    if raw is None:
        return DEFAULT_MAX_POINTS
    low, high = MAX_POINTS_RANGE
    try:
        value = int(raw)
    except ValueError:
        raise BadRequestError(f"max_points must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise BadRequestError(f"max_points must be between {low} and {high}, got {value}")
    return value


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
        runs = reader.list_runs(self._provider, ctx, experiment_id)
        if run is not None:
            if run not in runs:
                raise reader.RunNotFoundError(run)
            runs = {run: runs[run]}
        return {
            name: reader.read_run(self._provider, ctx, experiment_id, name, tags)
            for name, tags in runs.items()
        }

    @wrappers.Request.application
    def _serve_runs(self, request):
        result = []
        for run, run_data in self._read_runs(request).items():
            series = run_data.inputs
            result.append(
                {
                    "run": run,
                    "replicas": series.replicas,
                    "devices": series.devices,
                    "source": series.source,
                    "first_step": int(series.steps[0]) if series.steps.size else None,
                    "last_step": int(series.steps[-1]) if series.steps.size else None,
                    "findings": analysis.severity_counts(analysis.find_run(run_data)),
                    "notes": run_data.notes,
                }
            )
        return http_util.Respond(request, {"runs": result}, "application/json")

    @wrappers.Request.application
    def _serve_inputs(self, request):
        run = request.args.get("run")
        if not run:
            return _error(request, 400, "missing argument 'run'")
        try:
            max_points = parse_max_points(request.args.get("max_points"))
            body = downsample_inputs(self._read_runs(request, run)[run].inputs, max_points)
        except BadRequestError as error:
            return _error(request, 400, str(error))
        except reader.RunNotFoundError:
            return _error(request, 404, f"no replica data for run {run!r}")
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
