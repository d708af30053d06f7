"""The TensorBoard plugin: thin HTTP routes over the data provider and the analysis.

Routes are documented in `http_api.md`: the static files, `/runs`, `/findings`, `/overview` and
one route per registered family (`Family.route`), whose body comes from the family's present
module (`present.ARGS` parses the arguments, `present.body(run, run_data, args)` builds the JSON).
Reads go one way down: route → `store.RunStore` (a state per run or job, read on incrementally,
answers cached per data version) → `group.GroupState` (the run's new samples, a job's families
merged) → each family's reader and merger. The store reads the log dir's event files itself
when TensorBoard serves one (`store.source_for`), else through TensorBoard's data provider.
Errors are TensorBoard's own exceptions (`tensorboard.errors`): a route raises
`InvalidArgumentError` for a bad argument and `NotFoundError` for an unknown run or missing
data, and TensorBoard's application answers 400 or 404 with the message as plain text. No
TensorFlow import: TensorBoard may run without it.
"""

import functools
import gzip
import json
import logging
import os
import re
import threading
import time

from tensorboard import errors
from tensorboard.backend import http_util, json_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tb_replica_plugin import analysis, metadata, reader, registry, store
from tb_replica_plugin.core.args import Download, parse_max_points, parse_step
from tb_replica_plugin.core.downsample import DEFAULT_MAX_POINTS, MAX_POINTS_RANGE
from tb_replica_plugin.read import judge, overview

__all__ = [
    "DEFAULT_MAX_POINTS",
    "MAX_POINTS_RANGE",
    "STATIC_DIR",
    "ReplicasPlugin",
    "parse_max_points",
    "parse_step",
    "run_view_query",
]

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
# Seconds between two looks at the data provider by the thread computing settled runs ahead.
WARM_SECONDS = 10.0
# Set to "0" to turn that thread off (TensorBoard then computes a run when the tab asks).
WARM_ENV = "TB_REPLICA_WARM"
_CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".map": "application/json"}


# The tab's run view (frontend/src/sections.js: MAX_POINTS, MAX_CELLS, TOP_VARIABLES,
# REPLICA_BLOCKS; views/match_matrix.js: CANVAS_SIDE): at most this many steps, fewer when steps
# × replicas would pass MAX_CELLS; the most divergent variables; match matrices cut to this many
# blocks; per-replica drift and gradient series cut to this many blocks of replicas.
RUN_VIEW_MAX_POINTS = 10000
RUN_VIEW_MAX_CELLS = 262144
RUN_VIEW_TOP = 8
RUN_VIEW_MATRIX_SIDE = 640
RUN_VIEW_REPLICA_BLOCKS = 64


def run_view_query(replicas, family=None):
    """The arguments the tab's run view sends for a run of `replicas` replicas.

    Args:
      replicas: the run's (or job's) number of replicas (its `/runs` entry's `replicas`).
      family: a family's name: its present module's `RUN_VIEW_ARGS` replace these (the rng
        view asks 2 steps); None: the arguments common to the view.

    Returns:
      `{"max_points", "top", "matrix_side", "replica_blocks"}` (strings):
      `RUN_VIEW_MAX_POINTS` steps, or fewer so that steps × replicas stay within
      `RUN_VIEW_MAX_CELLS` (at least 2), `RUN_VIEW_TOP` variables, match matrices cut to
      `RUN_VIEW_MATRIX_SIDE` blocks and per-replica series to `RUN_VIEW_REPLICA_BLOCKS` blocks.

    Example:
      >>> run_view_query(2048)
      {'max_points': '128', 'top': '8', 'matrix_side': '640', 'replica_blocks': '64'}
      >>> run_view_query(2048, "rng")["max_points"]
      '2'
    """
    points = max(2, min(RUN_VIEW_MAX_POINTS, RUN_VIEW_MAX_CELLS // max(1, int(replicas))))
    query = {
        "max_points": str(points),
        "top": str(RUN_VIEW_TOP),
        "matrix_side": str(RUN_VIEW_MATRIX_SIDE),
        "replica_blocks": str(RUN_VIEW_REPLICA_BLOCKS),
    }
    if family is not None:
        query.update(registry.family(family).present.run_view_args)
    return query


def _json(request, body):
    return http_util.Respond(request, body, "application/json")


# A JSON string (left as is) or a bare non-finite number of `json.dumps(allow_nan=True)`.
_NON_FINITE = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')


def encode_json(body):
    """`body` as gzip-compressed JSON bytes, encoded the way `http_util.Respond` encodes it
    (non-finite floats as the strings "NaN", "Infinity", "-Infinity"), so a cached answer is
    neither serialised nor compressed again."""
    try:
        # json's C encoder writes non-finite floats as bare tokens; they are quoted after, which
        # gives Cleanse's text without walking every number in Python (9 s on a 2048-replica
        # job's answers).
        text = json.dumps(body, ensure_ascii=True, allow_nan=True)
    except TypeError:  # bytes or sets: Cleanse turns them into strings and sorted lists
        text = json.dumps(json_util.Cleanse(body, "utf-8"), ensure_ascii=True)
    else:
        if "NaN" in text or "Infinity" in text:
            text = _NON_FINITE.sub(lambda m: f'"{m[1]}"' if m[1] else m[0], text)
    return gzip.compress(text.encode("utf-8"), compresslevel=3, mtime=0)


def _encoded_json(request, encoded):
    return http_util.Respond(request, encoded, "application/json", content_encoding="gzip")


class ReplicasPlugin(base_plugin.TBPlugin):
    """The "Replicas" tab: per-replica inputs, charts, heatmaps and findings."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context, warm=None):
        """Args:
        context: the `base_plugin.TBContext` given by TensorBoard.
        warm: whether a daemon thread computes the findings of settled runs and jobs ahead
          (`RunStore.warm`, every `WARM_SECONDS`), so the tab opens without reading them.
          None: when TensorBoard's server made the context (it has `flags`) and the
          environment variable `TB_REPLICA_WARM` is not "0".
        """
        self._provider = context.data_provider
        hint = (getattr(context, "sampling_hints", None) or {}).get(metadata.PLUGIN_NAME)
        downsample = store.downsample_from_hint(hint)
        flags = getattr(context, "flags", None)
        source = store.source_for(
            context.data_provider, getattr(context, "logdir", None), downsample, flags
        )
        # One state per run and job, read on as its runs grow; answers cached per version.
        self.store = store.RunStore(
            context.data_provider, downsample=downsample, run_view=self._run_view, source=source
        )
        if warm is None:
            warm = getattr(context, "flags", None) is not None
            warm = warm and os.environ.get(WARM_ENV, "1") != "0"
        self.stop_warming = threading.Event()
        if warm:
            threading.Thread(target=self._warm, name="tb_replica_warm", daemon=True).start()

    def _warm(self):
        """The warming thread: `RunStore.warm` every `WARM_SECONDS` until `stop_warming`.

        A failure is logged once and the thread goes on (a request computes what it needs).
        """
        from tensorboard import context as context_lib

        ctx, seen, warmed, failed = context_lib.RequestContext(), {}, {}, False
        while not self.stop_warming.wait(WARM_SECONDS):
            errors = []
            try:
                seen = self.store.warm(ctx, "", runs_entry, seen, warmed, errors=errors)
            except Exception as error:  # noqa: BLE001 - never stop TensorBoard for this
                errors.append(("", error))
            if errors and not failed:
                failed = True
                name, error = errors[0]
                logging.getLogger(__name__).warning(
                    "tb_replica_plugin: computing %r ahead failed (%s: %s); the tab computes "
                    "it when it asks",
                    name or "the runs",
                    type(error).__name__,
                    error,
                )

    def get_plugin_apps(self):
        apps = {
            "/index.js": self._serve_index,
            "/static/*": self._serve_static,
            "/runs": self._serve_runs,
            "/findings": self._serve_findings,
            "/overview": self._serve_overview,
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
        """The file `name` of static/.

        Raises:
          errors.NotFoundError: if static/ holds no such plain file (404).
        """
        # Only plain file names that exist in static/ are served: no path can leave the folder.
        path = os.path.join(STATIC_DIR, name)
        if name not in os.listdir(STATIC_DIR) or not os.path.isfile(path):
            raise errors.NotFoundError(f"no static file {name!r}")
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

    @staticmethod
    def _request_context(request):
        from tensorboard import plugin_util

        return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)

    def _summaries(self, request, run=None):
        """`{name: {"entry", "findings"}}` of every run and job (or of `run`), from the cache.

        Raises:
          errors.NotFoundError: if `run` is given and has no data of this plugin.
        """
        ctx, experiment_id = self._request_context(request)
        # The workers of a multi-worker job are read and merged as one job named after it.
        return self.store.summaries(ctx, experiment_id, runs_entry, run=run, make_live=live_entry)

    @wrappers.Request.application
    def _serve_runs(self, request):
        summaries = self._summaries(request).values()
        return _json(request, {"runs": [summary["entry"] for summary in summaries]})

    @wrappers.Request.application
    def _serve_findings(self, request):
        summaries = self._summaries(request, request.args.get("run")).values()
        findings = [f for summary in summaries for f in summary["findings"]]
        return _json(request, {"findings": [f.to_json() for f in analysis.sort_findings(findings)]})

    @wrappers.Request.application
    def _serve_overview(self, request):
        entries = [summary["entry"] for summary in self._summaries(request).values()]
        return _json(request, {"runs": overview.worst_first(entries)})

    @staticmethod
    def _make_body(run, family, parsed):
        """`fn(run_data)`: a family route's answer (JSON encoded, or a `Download`)."""

        def make_body(run_data):
            result = family.present.body(run, run_data, parsed)
            return result if isinstance(result, Download) else encode_json(result)

        return make_body

    def _run_view(self, run, run_data):
        """The family routes the tab's run view asks for `run`, with the tab's arguments.

        Args:
          run: the run or job name.
          run_data: its `reader.RunData` (its replicas set the view's `max_points`).

        Returns:
          `[(family name, parsed arguments, make_body)]` (`store.RunStore`'s `run_view`).
        """
        replicas = len(overview.overview(run_data)["replicas"])
        view = []
        for family in registry.families():
            if family.route and not family.live:
                query = run_view_query(replicas, family.name)
                arguments = family.present.args.items()
                parsed = {name: parse(query.get(name)) for name, parse in arguments}
                view.append((family.name, parsed, self._make_body(run, family, parsed)))
        return view

    def _live_body(self, ctx, experiment_id, run, family, parsed):
        """A live family's route body, computed now from its cached read (`RunStore.live_data`).

        Raises:
          errors.NotFoundError: unknown run (404).
        """
        run_data = self.store.live_data(ctx, experiment_id, run).get(run)
        if run_data is None:  # a run without the family's data: its empty body
            run_data = reader.RunData(run)
        return family.present.body(run, run_data, parsed)

    def _family_app(self, family):
        """The route of one family: the run named by `run`, the family's arguments, its body.

        Raises (answered by TensorBoard's application):
          errors.InvalidArgumentError: missing `run` or a malformed argument (400).
          errors.NotFoundError: unknown run, or no such data (404).
        """

        def serve(self, request):
            run = request.args.get("run")
            if not run:
                raise errors.InvalidArgumentError("missing argument 'run'")
            present = family.present
            parsed = {name: parse(request.args.get(name)) for name, parse in present.args.items()}
            ctx, experiment_id = self._request_context(request)
            if family.live:
                return _json(request, self._live_body(ctx, experiment_id, run, family, parsed))
            make_body = self._make_body(run, family, parsed)
            # The answer is kept, encoded, until the run has new data.
            answer = self.store.body(ctx, experiment_id, run, family.name, parsed, make_body)
            if isinstance(answer, Download):
                disposition = f'attachment; filename="{answer.filename}"'
                return http_util.Respond(
                    request,
                    answer.data,
                    answer.content_type,
                    headers=[("Content-Disposition", disposition)],
                )
            return _encoded_json(request, answer)

        serve.__name__ = f"_serve_{family.name}"
        return functools.partial(wrappers.Request.application(serve), self)


def live_entry(run_data, now=None):
    """The live families' part of a run's `/runs` entry and findings, at time `now`.

    Args:
      run_data: the run's `RunData` holding the live families (`RunStore.live_data`).
      now: `time.time()` when None.

    Returns:
      `(fields, findings)`: each live family's `Presenter.live_fields` merged, and the findings
      of its rules at `now`.
    """
    now = time.time() if now is None else now
    fields = {}
    for family in registry.families():
        if family.live and family.present.live_fields is not None:
            fields.update(family.present.live_fields(run_data, now))
    return fields, judge.find_run(run_data, live=True, now=now)


def runs_entry(run_data, findings=None):
    """The `/runs` entry of one run (documented in `http_api.md`).

    Args:
      run_data: a `reader.RunData`.
      findings: its findings (`judge.find_run(run_data)`) if already computed.

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
        if family.present.runs_fields is not None:
            entry.update(family.present.runs_fields(run_data))
    if findings is None:
        findings = judge.find_run(run_data)
    entry["findings"] = analysis.severity_counts(findings)
    entry["families"] = [family.attribute for family in families if _listed(family, run_data)]
    entry["notes"] = run_data.notes
    entry["workers"] = run_data.workers
    return entry


def _listed(family, run_data):
    if family.present.listed is not None:
        return bool(family.present.listed(run_data))
    return run_data.series.get(family.attribute) is not None
