"""Bad requests, path traversal and hostile names.

The routes are exercised through TensorBoard's own WSGI app (`TensorBoardWSGI`) holding only this
plugin, over a real multiplexer data provider reading the `bad_logs` log dir (probe-written runs
with HTML/JS names, corrupt and truncated event files, a newer schema...), with werkzeug's test
client: no server process is needed for property-based fuzzing. The hostile names are then
rendered by a real `tensorboard` in headless Debian Chromium.
"""

import json
import os
import urllib.parse

import pytest
from bad_logs import (
    BOLD_INPUT,
    BOLD_VARIABLE,
    HOSTILE_GENERATOR,
    HOSTILE_INPUT,
    HOSTILE_RUN,
    HOSTILE_VARIABLE,
    RUNS,
    SCRIPT_RUN,
    wsgi_app,
)
from conftest import TensorBoardServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.test import Client

from tb_replica_plugin import plugin as plugin_module

PREFIX = "/data/plugin/replicas"
STATIC_FILES = sorted(os.listdir(plugin_module.STATIC_DIR))
FUZZ = settings(
    deadline=None,
    derandomize=True,  # the same cases on every CI run
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
NASTY = st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "..",
        "../../etc/passwd",
        "%00",
        "%2e%2e",
        "\\",
        "<script>alert(1)</script>",
        "'\"",
        "NaN",
        "Infinity",
        "-1",
        "1e9",
        "0x10",
        "٣",
        "9" * 400,
        "\u202e",
        "\ufeff",
        "a" * 5000,
    ]
)
RUN_ARG = st.one_of(
    st.sampled_from(RUNS),
    st.sampled_from(RUNS).map(lambda run: run + "/"),
    st.sampled_from(RUNS).map(str.upper),
    TEXT,
    NASTY,
)
MAX_POINTS_ARG = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70).map(str),
    st.integers(2, 100_000).map(str),
    TEXT,
    NASTY,
)
EXTRA_KEYS = st.one_of(TEXT, st.sampled_from(["run", "max_points"]))
EXTRA_ARGS = st.dictionaries(EXTRA_KEYS, TEXT, max_size=3)
METHOD = st.sampled_from(["GET", "POST"])


@pytest.fixture(scope="module")
def client(bad_logs):
    app, _ = wsgi_app(bad_logs)
    return Client(app)


def check_error(response):
    """No 5xx; every 4xx is TensorBoard's plain-text error ("Invalid argument: <message>" for
    400, "Not found: <message>" for 404). Returns the message (the body of a 2xx as is)."""
    assert response.status_code < 500, (response.status_code, response.data[:300])
    if response.status_code >= 400:
        assert response.mimetype == "text/plain", response.mimetype
        text = response.data.decode("utf-8")
        prefix = {400: "Invalid argument: ", 404: "Not found: "}[response.status_code]
        assert text.startswith(prefix) and text[len(prefix) :], text
        return text[len(prefix) :]
    return response.data


def reaches_plugin(path):
    """Whether TensorBoard's router hands `path` to the static route at all.

    It routes on `urlparse(path).path` (which drops tabs and newlines and stops at "?" and "#")
    without one trailing slash; ".../static/" and the like reach no plugin route, and
    TensorBoard itself answers a plain-text 404.
    """
    routed = urllib.parse.urlparse(urllib.parse.unquote(path, errors="replace")).path
    if routed.endswith("/"):
        routed = routed[:-1]
    return routed.startswith(PREFIX + "/static/")


def valid_max_points(raw):
    if raw is None:
        return True
    try:
        return 2 <= int(raw) <= 100_000
    except ValueError:
        return False


def test_fuzz_inputs_route(client):
    cases = []

    @settings(FUZZ, max_examples=450)
    @given(run=st.one_of(st.none(), RUN_ARG), max_points=MAX_POINTS_ARG, method=METHOD)
    def case(run, max_points, method):
        cases.append(1)
        query = {k: v for k, v in (("run", run), ("max_points", max_points)) if v is not None}
        response = client.open(PREFIX + "/inputs", method=method, query_string=query)
        check_error(response)
        if not run:
            assert response.status_code == 400
        elif not valid_max_points(max_points):
            assert response.status_code == 400
            assert "max_points" in check_error(response)
        elif run not in RUNS:
            assert response.status_code == 404
            assert check_error(response) == f"no replica data for run {run!r}"
        else:
            assert response.status_code == 200
            body = json.loads(response.data)
            assert body["run"] == run
            assert len(body["steps"]) == len(body["batch_size"]) <= int(max_points or 2000)

    case()
    assert len(cases) >= 450


def test_fuzz_findings_and_runs_routes(client):
    cases = []

    @settings(FUZZ, max_examples=300)
    @given(run=st.one_of(st.none(), RUN_ARG), extra=EXTRA_ARGS, route=st.sampled_from(["f", "r"]))
    def case(run, extra, route):
        cases.append(1)
        query = dict(extra)
        if run is None:
            query.pop("run", None)
        else:
            query["run"] = run
        path = PREFIX + ("/findings" if route == "f" else "/runs")
        response = client.get(path, query_string=query)
        check_error(response)
        if route == "r":
            assert response.status_code == 200
            assert sorted(r["run"] for r in json.loads(response.data)["runs"]) == sorted(RUNS)
        elif run is None or run in RUNS:
            assert response.status_code == 200
            findings = json.loads(response.data)["findings"]
            assert all(run is None or f["run"] == run for f in findings)
        else:
            assert response.status_code == 404

    case()
    assert len(cases) >= 300


def test_fuzz_raw_query_strings(client):
    # Raw, possibly malformed percent-encoding, repeated and empty keys, odd separators.
    cases = []
    raw_query = st.lists(
        st.one_of(
            st.text(st.sampled_from("run=max_points%&;+2ef0a/.\\<>\"' \x00\x7f"), max_size=20),
            st.sampled_from([f"run={urllib.parse.quote(r)}" for r in RUNS]),
        ),
        max_size=5,
    ).map("&".join)

    @settings(FUZZ, max_examples=200)
    @given(
        route=st.sampled_from(
            [
                "/inputs",
                "/findings",
                "/runs",
                "/step_time",
                "/gradients",
                "/variables",
                "/rng",
                "/data",
            ]
        ),
        query=raw_query,
    )
    def case(route, query):
        cases.append(1)
        check_error(client.get(PREFIX + route + "?" + query))

    case()
    assert len(cases) >= 200


def test_fuzz_family_routes(client):
    """The routes of the gradients, variables, rng, data and step-time families."""
    cases = []

    @settings(FUZZ, max_examples=250)
    @given(
        route=st.sampled_from(["/gradients", "/variables", "/rng", "/data", "/step_time"]),
        run=st.one_of(st.none(), RUN_ARG),
        max_points=MAX_POINTS_ARG,
        extra=st.one_of(st.none(), TEXT),
    )
    def case(route, run, max_points, extra):
        cases.append(1)
        query = {
            k: v
            for k, v in (("run", run), ("max_points", max_points), ("step", extra), ("top", extra))
            if v is not None
        }
        response = client.get(PREFIX + route, query_string=query)
        check_error(response)
        if not run:
            assert response.status_code == 400
        elif run not in RUNS:
            assert response.status_code in (400, 404)

    case()
    assert len(cases) >= 250


def test_fuzz_static_route(client):
    cases = []
    segment = st.one_of(
        TEXT, NASTY, st.sampled_from(STATIC_FILES), st.lists(TEXT, max_size=4).map("/".join)
    )

    @settings(FUZZ, max_examples=250)
    @given(name=segment, quoted=st.booleans())
    def case(name, quoted):
        cases.append(1)
        path = PREFIX + "/static/" + urllib.parse.quote(name, safe="/" if not quoted else "")
        response = client.get(path)
        if not reaches_plugin(path):
            assert response.status_code == 404 and response.data == b"Not found"
            return
        check_error(response)
        if name in STATIC_FILES:
            assert response.status_code == 200
            with open(os.path.join(plugin_module.STATIC_DIR, name), "rb") as handle:
                assert response.data == handle.read()
        else:
            assert response.status_code == 404

    case()
    assert len(cases) >= 250


TRAVERSALS = [
    "/static/../plugin.py",
    "/static/../../tb_replica_plugin/plugin.py",
    "/static/..%2fplugin.py",
    "/static/%2e%2e/plugin.py",
    "/static/%2e%2e%2fplugin.py",
    "/static/%252e%252e%252fplugin.py",
    "/static/..\\plugin.py",
    "/static/..%5cplugin.py",
    "/static/..%5c..%5c..%5cetc%5cpasswd",
    "/static//etc/passwd",
    "/static/%2fetc%2fpasswd",
    "/static/../../../../../../../../etc/passwd",
    "/static/....//....//....//etc/passwd",
    "/static/index.js%00.png",
    "/static/index.js%00",
    "/static/%00",
    "/static/.",
    "/static/..",
    "/static/",
    "/static/C:\\Windows\\win.ini",
    "/static/C:%5cWindows%5cwin.ini",
    "/static/file:///etc/passwd",
    "/static/%c0%ae%c0%ae/plugin.py",
    "/static/..%c0%afplugin.py",
    "/static/index.js/../../plugin.py",
    "/static/./index.js",
    "/static/~/.bashrc",
    "/static/__init__.py",
    "/static/../static/index.js",
    f"/static/{os.path.abspath(__file__)}",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_static_traversal_is_refused(client, path):
    response = client.get(PREFIX + path)
    assert response.status_code == 404
    assert b"root:" not in response.data and b"import " not in response.data
    if reaches_plugin(PREFIX + path):  # else TensorBoard's router answers itself
        assert check_error(response).startswith("no static file")


def test_static_file_is_served(client):
    response = client.get(PREFIX + "/static/index.js")
    assert response.status_code == 200 and response.mimetype == "text/javascript"
    assert len(TRAVERSALS) >= 15


def test_hostile_names_come_back_verbatim_in_json(client):
    runs = json.loads(client.get(PREFIX + "/runs").data)["runs"]
    assert {HOSTILE_RUN, SCRIPT_RUN} <= {r["run"] for r in runs}
    body = json.loads(client.get(PREFIX + "/inputs", query_string={"run": HOSTILE_RUN}).data)
    names = [i["name"] for i in body["shape_events"][0]["inputs"]]
    assert names == [BOLD_INPUT, HOSTILE_INPUT]
    findings = json.loads(client.get(PREFIX + "/findings", query_string={"run": HOSTILE_RUN}).data)
    assert [(f["kind"], f["name"]) for f in findings["findings"]] == [
        ("shape_mismatch", HOSTILE_INPUT),
        ("variable_not_mirrored", BOLD_VARIABLE),
    ]
    query = {"run": HOSTILE_RUN}
    variables = json.loads(client.get(PREFIX + "/variables", query_string=query).data)
    assert [v["name"] for v in variables["variables"]] == [HOSTILE_VARIABLE, BOLD_VARIABLE]
    gradients = json.loads(client.get(PREFIX + "/gradients", query_string=query).data)
    assert gradients["variables"] == [HOSTILE_VARIABLE]
    rng = json.loads(client.get(PREFIX + "/rng", query_string=query).data)
    assert [g["name"] for g in rng["generators"]] == [HOSTILE_GENERATOR]


# ------------------------------------------------------------ headless Chromium


@pytest.fixture(scope="module")
def bad_server(bad_logs):
    server = TensorBoardServer(bad_logs, extra=("--samples_per_plugin", "replicas=0"))
    try:
        server.wait_for(
            PREFIX + "/runs",
            lambda status, body: status == 200 and len(json.loads(body)["runs"]) == len(RUNS),
        )
        yield server
    finally:
        server.stop()


def test_hostile_names_render_as_text_and_bad_data_notes_show(bad_server):
    from browser_tab import CHROMIUM, CHROMIUM_ARGS, open_tab, wait_ready
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        page, frame, errors = open_tab(bad_server, browser)

        options = frame.eval_on_selector_all("#run-select option", "els => els.map(e => e.text)")
        assert HOSTILE_RUN in options and SCRIPT_RUN in options
        frame.select_option("#run-select", HOSTILE_RUN)
        wait_ready(frame)
        shapes = frame.inner_text('[data-view="shapes"]')
        assert HOSTILE_INPUT in shapes and BOLD_INPUT in shapes
        findings = frame.inner_text('[data-view="findings"]')
        assert HOSTILE_INPUT in findings and BOLD_VARIABLE in findings
        # Variable and generator names, in every family's view, as text (textContent: sections
        # below the fold are not laid out, so innerText would skip them).
        placement = frame.text_content('[data-view="placement"] table')
        assert HOSTILE_VARIABLE in placement and BOLD_VARIABLE in placement
        assert HOSTILE_VARIABLE in frame.text_content('[data-view="deviation"]')
        assert HOSTILE_GENERATOR in frame.text_content('[data-view="rng"]')
        # The gradient heatmap's tooltip names the variable under the pointer.
        heatmap = frame.locator('[data-view="gradients"] canvas.layer-heatmap')
        box = heatmap.bounding_box()
        heatmap.hover(position={"x": box["width"] - 10, "y": box["height"] - 6})  # last cell
        assert HOSTILE_VARIABLE in frame.text_content('[data-view="gradients"] .chart-tooltip')
        frame.select_option("#run-select", SCRIPT_RUN)
        wait_ready(frame)
        assert SCRIPT_RUN in frame.inner_text(".run-picker")
        # Nothing ran and nothing was parsed as markup: no <img src=x>, no <b>, no injected script.
        for context in (page, frame):
            assert context.evaluate("window.__xss") is None
        assert frame.evaluate("document.querySelectorAll('img, b, script:not([src])').length") == 0

        expected_notes = {
            "newer_schema/replicas": "schema version 99",
            "replica_change/replicas": "The replica count changes within this run ([2, 3])",
            "bad_payload/replicas": "2 unreadable shapes event(s) skipped.",
        }
        for run, note in expected_notes.items():
            frame.select_option("#run-select", run)
            wait_ready(frame)
            assert note in frame.inner_text(".run-notes")
        assert [e for e in errors if "favicon" not in e] == []
        browser.close()
