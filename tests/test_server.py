"""The plugin on a real `tensorboard` process (Python loader and RustBoard), and the CLI."""

import json
import subprocess
import sys

import pytest
from conftest import REPO, TensorBoardServer, http_get, run_cli

PLUGIN = "/data/plugin/replicas"


@pytest.fixture(scope="module", params=[False, True], ids=["python_loader", "rustboard"])
def server(request, unit_logs):
    tb = TensorBoardServer(unit_logs, load_fast=request.param)
    try:
        # Wait until every run is loaded (RustBoard loads asynchronously).
        tb.wait_for(
            PLUGIN + "/runs",
            lambda status, body: status == 200 and len(json.loads(body)["runs"]) == 4,
        )
        yield tb
    finally:
        tb.stop()


def get_json(server, path):
    status, body, content_type = http_get(server.url + path)
    assert content_type.startswith("application/json"), (path, status, content_type)
    return status, json.loads(body)


def test_plugin_listed_with_es_module(server):
    status, listing = get_json(server, "/data/plugins_listing")
    assert status == 200
    entry = listing["replicas"]
    assert entry["enabled"] is True
    assert entry["tab_name"] == "Replicas"
    assert entry["loading_mechanism"] == {
        "type": "IFRAME",
        "module_path": PLUGIN + "/index.js",
    }
    status, body, content_type = http_get(server.url + PLUGIN + "/index.js")
    assert status == 200 and "javascript" in content_type
    assert b"render" in body


def test_runs_route(server):
    _, body = get_json(server, PLUGIN + "/runs")
    runs = {r["run"]: r for r in body["runs"]}
    assert sorted(runs) == [
        "dict_mismatch/replicas",
        "fit_17_8/replicas",
        "inspect_7/inspect_dataset",
        "loop_15_7/replicas",
    ]
    fit = runs["fit_17_8/replicas"]
    assert (fit["source"], fit["replicas"], fit["first_step"], fit["last_step"]) == (
        "fit",
        [0, 1],
        0,
        2,
    )
    assert fit["findings"] == {"error": 0, "warning": 1, "info": 0}


def test_inputs_route_fit_17_8(server):
    status, body = get_json(server, PLUGIN + "/inputs?run=fit_17_8/replicas")
    assert status == 200
    assert body["steps"] == [0, 1, 2]
    assert body["batch_size"] == [[4, 4], [4, 4], [1, 0]]
    assert body["imbalance"] == [1.0, 1.0, "Infinity"]
    assert body["downsampled"] is False
    assert [e["step"] for e in body["shape_events"]] == [0, 2]
    assert body["shape_events"][1]["inputs"][0]["shapes"] == [[1, 3], [0, 3]]


def test_inputs_route_custom_loop_and_mismatch(server):
    _, loop = get_json(server, PLUGIN + "/inputs?run=loop_15_7/replicas")
    assert loop["batch_size"] == [[4, 3], [4, 3], [1, 0]]
    _, mismatch = get_json(server, PLUGIN + "/inputs?run=dict_mismatch/replicas")
    features = mismatch["shape_events"][0]["inputs"][0]
    assert (features["name"], features["mismatch"], features["mismatch_dims"]) == (
        "features",
        True,
        [1],
    )


def test_inputs_route_downsamples_with_extremes(server):
    _, body = get_json(server, PLUGIN + "/inputs?run=fit_17_8/replicas&max_points=2")
    assert body["downsampled"] is True
    assert body["steps"] == [0, 2]
    assert body["batch_size_min"] == [[4, 4], [1, 0]]
    assert body["batch_size_max"] == [[4, 4], [1, 0]]


def test_findings_route(server):
    _, body = get_json(server, PLUGIN + "/findings?run=inspect_7/inspect_dataset")
    kinds = [f["kind"] for f in body["findings"]]
    assert kinds == ["first_batch_uneven", "uneven_batch", "empty_shard"]
    assert body["findings"][0]["severity"] == "error"
    _, everything = get_json(server, PLUGIN + "/findings")
    assert len(everything["findings"]) == 1 + 3 + 3 + 1


def test_gradients_route_fit_17_8(server):
    # update_freq="epoch": the norms of the last step (2) are written at the epoch end; replica
    # 1 got an empty batch there, so its gradient is 0.
    status, body = get_json(server, PLUGIN + "/gradients?run=fit_17_8/replicas")
    assert status == 200
    assert body["steps"] == [2] and body["replicas"] == [0, 1]
    assert len(body["variables"]) == 2 and body["shapes"] == [[3, 1], [1]]
    assert body["scaling"] == "replica_loss" and body["has_loss"] is True
    assert body["global_norm"][0][0] > 0 and body["global_norm"][0][1] == 0
    assert body["ratio"][0] == ["Infinity", 0.0]
    assert body["layer_step"] == 2 and len(body["layer_norms"]) == 2
    assert body["nonfinite"] == []
    _, runs = get_json(server, PLUGIN + "/runs")
    families = {r["run"]: r["families"] for r in runs["runs"]}
    # fit's steps are timed (each replica's ready time: step_time); a custom loop without
    # `probe.step()` has none.
    assert families["fit_17_8/replicas"][:3] == ["inputs", "step_time", "gradients"]
    assert "gradients" not in families["loop_15_7/replicas"]
    assert "step_time" not in families["loop_15_7/replicas"]


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/gradients", 400, "missing argument 'run'"),
        ("/gradients?run=fit_17_8/replicas&step=x", 400, "step must be an integer"),
        ("/gradients?run=nope", 404, "no replica data for run 'nope'"),
        ("/gradients?run=loop_15_7/replicas", 404, "no gradient data"),
        ("/inputs", 400, "missing argument 'run'"),
        ("/inputs?run=", 400, "missing argument 'run'"),
        ("/inputs?run=nope", 404, "no replica data for run 'nope'"),
        ("/inputs?run=fit_17_8/replicas&max_points=x", 400, "max_points must be an integer"),
        ("/inputs?run=fit_17_8/replicas&max_points=1", 400, "max_points must be between"),
        ("/findings?run=nope", 404, "no replica data"),
        ("/static/..%2f..%2fplugin.py", 404, "no static file"),
        ("/static/nothing.js", 404, "no static file"),
    ],
)
def test_bad_requests_answer_tensorboards_errors(server, path, status, message):
    got_status, body, content_type = http_get(server.url + PLUGIN + path)
    assert (got_status, content_type.split(";")[0]) == (status, "text/plain")
    prefix = {400: "Invalid argument: ", 404: "Not found: "}[status]
    assert body.decode().startswith(prefix) and message in body.decode()


def test_event_bytes_decide_the_reader(tmp_path):
    """The report reads small log dirs with TensorBoard's TF stub (no TensorFlow import) and
    larger ones with TensorFlow's reader: the stub checks CRCs in Python."""
    from tb_replica_plugin import cli

    (tmp_path / "run_a").mkdir()
    (tmp_path / "run_a" / "events.out.tfevents.1").write_bytes(b"x" * 300)
    (tmp_path / "run_a" / "notes.txt").write_bytes(b"x" * 5000)
    (tmp_path / "events.out.tfevents.2").write_bytes(b"x" * 200)
    assert cli._event_bytes(str(tmp_path), limit=10_000) == 500
    assert cli._event_bytes(str(tmp_path), limit=250) > 250  # stops counting past the limit


def test_report_json(unit_logs):
    result = run_cli("report", unit_logs, "--json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1  # compact when piped (json's C encoder)
    report = json.loads(result.stdout)
    runs = {r["run"]: r for r in report["runs"]}
    fit = runs["fit_17_8/replicas"]
    assert fit["steps"] == [0, 1, 2]
    assert fit["batch_size"] == [[4, 4], [4, 4], [1, 0]]
    assert fit["num_replicas"] == 2
    assert [f["kind"] for f in fit["findings"]] == ["empty_shard"]
    assert runs["loop_15_7/replicas"]["batch_size"] == [[4, 3], [4, 3], [1, 0]]
    assert runs["loop_15_7/replicas"]["gradients"] is None
    gradients = fit["gradients"]
    assert gradients["steps"] == [2] and gradients["global_norm"][0][1] == 0
    assert gradients["ratio_to_median"] == [["Infinity", 0.0]]
    assert len(gradients["variable_norms"][0]) == 2
    assert report["summary"] == {"error": 3, "warning": 5, "info": 0}


def test_report_text_fail_on_and_bad_arguments(unit_logs, tmp_path):
    text = run_cli("report", unit_logs, "--run", "fit_*")
    assert text.returncode == 0
    assert "run fit_17_8/replicas" in text.stdout
    assert "Replica 1 got 0 examples at step 2" in text.stdout
    assert "gradients (gradient of each replica's own loss), 1 logged step(s) 2–2" in text.stdout
    assert "loop_15_7" not in text.stdout
    assert run_cli("report", unit_logs, "--fail-on", "error").returncode == 1
    assert run_cli("report", unit_logs, "--run", "fit_*", "--fail-on", "error").returncode == 0
    missing = run_cli("report", str(tmp_path / "missing"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert run_cli("report").returncode == 2
    assert run_cli("report", unit_logs, "--fail-on", "fatal").returncode == 2


def test_cli_inspect_runs_a_dataset_function(tmp_path):
    script = tmp_path / "pipeline.py"
    script.write_text(
        "import tensorflow as tf\n"
        "def make_dataset():\n"
        "    return tf.data.Dataset.range(15).batch(7)\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tb_replica_plugin.cli",
            "inspect",
            f"{script}:make_dataset",
            "--logdir",
            str(tmp_path / "logs"),
            "--replicas",
            "2",
            "--steps",
            "3",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["batch_sizes"] == [[4, 3], [4, 3], [1, 0]]
    assert body["findings"][0]["kind"] == "first_batch_uneven"
    bad = run_cli("inspect", f"{script}:nothing", "--logdir", str(tmp_path))
    assert bad.returncode == 2 and "not a function" in bad.stderr


def test_encoded_answers_equal_tensorboards_cleansed_json():
    """`encode_json` quotes non-finite numbers as TensorBoard's `Cleanse` does (JSON.parse
    rejects bare NaN), leaves strings that spell them alone, and falls back to `Cleanse` for
    bytes and sets."""
    import gzip

    from tensorboard.backend import json_util

    from tb_replica_plugin import plugin

    body = {
        "values": [1.5, float("nan"), float("inf"), -float("inf"), 0, -2, 1e-300],
        "nested": ({"a": [float("nan"), "NaN"]}, ['say "Infinity" \\', "-Infinity", "é"]),
        "ok": True,
        "none": None,
        3: "int key",
    }
    for case in (body, dict(body, raw=b"bytes", tags={"b", "a"})):
        expected = json.dumps(json_util.Cleanse(case, "utf-8"), ensure_ascii=True)
        assert gzip.decompress(plugin.encode_json(case)).decode() == expected
    text = gzip.decompress(plugin.encode_json(body)).decode()
    assert '"values": [1.5, "NaN", "Infinity", "-Infinity", 0, -2, 1e-300]' in text
