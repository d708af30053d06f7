"""The TensorBoard plugin: thin HTTP routes over the data provider and the analysis.

Routes are documented in `http_api.md`: the static files, `/runs`, `/findings`, and one route
per registered family (`Family.route`), whose body comes from the family's present module
(`present.ARGS` parses the arguments, `present.body(run, run_data, args)` builds the JSON).
Errors are exceptions handled in one place (`_handling_errors`): `BadRequestError` → 400,
`reader.RunNotFoundError` and `NotFoundError` → 404. No TensorFlow import: TensorBoard may run
without it.
"""

import functools
import os

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tb_replica_plugin import analysis, metadata, reader, registry
from tb_replica_plugin.core import overview
from tb_replica_plugin.core.args import (
    BadRequestError,
    Download,
    NotFoundError,
    parse_max_points,
    parse_step,
)
from tb_replica_plugin.core.downsample import DEFAULT_MAX_POINTS, MAX_POINTS_RANGE

__all__ = [
    "DEFAULT_MAX_POINTS",
    "MAX_POINTS_RANGE",
    "STATIC_DIR",
    "BadRequestError",
    "NotFoundError",
    "ReplicasPlugin",
    "parse_max_points",
    "parse_step",
]

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
_CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".map": "application/json"}


def _error(request, status, message):
    return http_util.Respond(request, {"error": message}, "application/json", code=status)


def _json(request, body):
    return http_util.Respond(request, body, "application/json")


def _handling_errors(handler):
    """Wraps a route: its errors become JSON answers (400 bad argument, 404 unknown run/data).

    Args:
      handler: `fn(plugin, request) -> response`, which may raise `BadRequestError`,
        `reader.RunNotFoundError` or `NotFoundError`.

    Returns:
      The werkzeug application of the route.
    """

    @functools.wraps(handler)
    def wrapped(self, request):
        try:
            return handler(self, request)
        except BadRequestError as error:
            return _error(request, 400, str(error))
        except reader.RunNotFoundError as error:
            return _error(request, 404, f"no replica data for run {error.args[0]!r}")
        except NotFoundError as error:
            return _error(request, 404, str(error))

    return wrappers.Request.application(wrapped)


class ReplicasPlugin(base_plugin.TBPlugin):
    """The "Replicas" tab: per-replica inputs, charts, heatmaps and findings."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context):
        """Args:
        context: the `base_plugin.TBContext` given by TensorBoard.
        """
        self._provider = context.data_provider

    def get_plugin_apps(self):
        apps = {
            "/index.js": self._serve_index,
            "/static/*": self._serve_static,
            "/runs": self._serve_runs,
            "/findings": self._serve_findings,
        }
        for family in registry.families():
            if family.route:
                apps[family.route] = self._family_app(family)
        return apps

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

    @_handling_errors
    def _serve_runs(self, request):
        return _json(
            request,
            {"runs": [runs_entry(run_data) for run_data in self._read_runs(request).values()]},
        )

    @_handling_errors
    def _serve_findings(self, request):
        runs = self._read_runs(request, request.args.get("run"))
        findings = [f for run_data in runs.values() for f in analysis.find_run(run_data)]
        return _json(request, {"findings": [f.to_json() for f in analysis.sort_findings(findings)]})

    def _family_app(self, family):
        """The route of one family: the run named by `run`, the family's arguments, its body.

        Raises (answered by `_handling_errors`):
          BadRequestError: missing `run` or a malformed argument (400).
          reader.RunNotFoundError: unknown run (404); NotFoundError: no such data (404).
        """

        def serve(self, request):
            run = request.args.get("run")
            if not run:
                raise BadRequestError("missing argument 'run'")
            present = family.present
            parsed = {name: parse(request.args.get(name)) for name, parse in present.ARGS.items()}
            run_data = self._read_runs(request, run)[run]
            result = present.body(run, run_data, parsed)
            if isinstance(result, Download):
                disposition = f'attachment; filename="{result.filename}"'
                return http_util.Respond(
                    request,
                    result.data,
                    result.content_type,
                    headers=[("Content-Disposition", disposition)],
                )
            return _json(request, result)

        serve.__name__ = f"_serve_{family.name}"
        return functools.partial(_handling_errors(serve), self)


def runs_entry(run_data):
    """The `/runs` entry of one run (documented in `http_api.md`).

    Args:
      run_data: a `reader.RunData`.

    Returns:
      The JSON-ready dict: run, replicas, devices, source, first/last step, the fields families
      add (`present.runs_fields`: variables), findings counts, families, notes, workers.
    """
    families = registry.families()
    seen = overview.overview(run_data)
    entry = {
        "run": run_data.run,
        "replicas": seen["replicas"],
        "devices": seen["devices"],
        "source": seen["source"],
        "first_step": overview.first_step(run_data),
        "last_step": overview.last_step(run_data),
    }
    for family in families:
        fields = getattr(family.present, "runs_fields", None)
        if fields is not None:
            entry.update(fields(run_data))
    entry["findings"] = analysis.severity_counts(analysis.find_run(run_data))
    entry["families"] = [family.attribute for family in families if _listed(family, run_data)]
    entry["notes"] = run_data.notes
    entry["workers"] = run_data.workers
    return entry


def _listed(family, run_data):
    listed = getattr(family.present, "listed", None)
    if listed is not None:
        return bool(listed(run_data))
    return getattr(run_data, family.attribute) is not None
