"""The core subset, run on every stack of the supported window (docs/compatibility.md).

In the full suite it runs on the newest stack; `.ci/window.py` runs it again in one venv per
older TensorFlow (the user's TensorFlow pre-installed, then this package installed with its
dependencies), where `TB_REPLICA_WINDOW_EXPECT` names the versions that venv must hold and
`TB_REPLICA_INSTALLED_COPY=1` makes the installed copy, not the checkout, the one imported.

What it runs: `fit` and a custom loop with every family the write side records on one worker,
under Keras 3 and tf_keras (`tests/window_child.py`, one process per flavour), read back by
`load`, by `tb-replica report` and by a real `tensorboard` with each loader; and, on an
in-process `ParameterServerStrategy` cluster (`tests/pss_child.py`), tf_keras `fit` and a custom
loop through `probe.schedule` (TensorFlow's and tf_keras's private names they rely on).
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, TensorBoardServer, http_get, run_cli

import tb_replica_plugin
from tb_replica_plugin import requirements

FLAVOURS = ("keras3", "tf_keras")
CHILD = os.path.join(REPO, "tests", "window_child.py")
PLUGIN = "/data/plugin/replicas"
RUNS = ["keras3/fit", "keras3/loop", "tf_keras/fit", "tf_keras/loop"]
FIT_BATCHES = [[4, 4], [4, 4], [1, 0]]  # 17 examples, global batch 8, 2 replicas
LOOP_BATCHES = [[4, 3], [4, 3], [1, 0]]  # 15 examples, global batch 7
# Findings of the fit run: Keras 3's Dropout draws one mask on every replica, tf_keras's does
# not (and its draws are not from a generator the rng family sees).
FIT_FINDINGS = {
    "keras3": [("identical_rng_streams", [0, 1], 0), ("empty_shard", [1], 2)],
    "tf_keras": [("empty_shard", [1], 2)],
}
LOOP_FINDINGS = [
    ("first_batch_uneven", [1], 0),
    ("uneven_batch", [1], 0),
    ("rng_desync", [1], 1),
    ("empty_shard", [1], 2),
]


@pytest.fixture(scope="module")
def window_logs(tmp_path_factory):
    """Both flavours trained once: `(logdir, {flavour: facts})`; runs `<flavour>/fit|loop`."""
    logdir = tmp_path_factory.mktemp("window")
    facts = {}
    for flavour in FLAVOURS:
        result = subprocess.run(
            [sys.executable, CHILD, str(logdir / flavour), "--flavour", flavour],
            cwd=str(logdir),  # not the checkout: the child imports the installed package
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        facts[flavour] = json.loads(result.stdout.strip().splitlines()[-1])
    return str(logdir), facts


def _major_minor(version):
    return requirements.parse_version(version)


def test_the_stack_is_the_expected_one(window_logs):
    """Both processes ran on one stack inside the window; tf_keras of TensorFlow's minor."""
    _, facts = window_logs
    keras3, tf_keras = facts["keras3"], facts["tf_keras"]
    for key in ("python", "tensorflow", "numpy", "tensorboard", "plugin_file"):
        assert keras3[key] == tf_keras[key], key
    tf_version = _major_minor(keras3["tensorflow"])
    assert requirements.OLDEST <= tf_version <= requirements.NEWEST
    assert (keras3["keras_module"], _major_minor(keras3["keras"])[0]) == ("keras", 3)
    assert tf_keras["keras_module"] == "tf_keras"
    assert _major_minor(tf_keras["keras"]) == tf_version
    assert keras3["tf_keras_is_keras"] and tf_keras["tf_keras_is_keras"]
    assert _major_minor(keras3["tensorboard"]) >= requirements.OLDEST
    expected = json.loads(os.environ.get("TB_REPLICA_WINDOW_EXPECT", "{}"))
    if expected:
        assert keras3["tensorflow"] == expected["tensorflow"]
        assert tf_keras["keras"] == expected["tf_keras"]
        assert keras3["python"].startswith(expected["python"] + ".")
    if os.environ.get("TB_REPLICA_INSTALLED_COPY") == "1":
        assert keras3["plugin_file"].startswith(sys.prefix + os.sep), keras3["plugin_file"]
        assert tb_replica_plugin.__file__.startswith(sys.prefix + os.sep)


def _run(window_logs, flavour, run):
    logdir, facts = window_logs
    assert facts[flavour]["warnings"] == []
    report = tb_replica_plugin.load(os.path.join(logdir, flavour))
    assert sorted(report.runs) == ["fit", "loop"]
    findings = [(f.kind, f.replicas, f.first_step) for f in report.findings[run]]
    return report.runs[run], findings, facts[flavour]


def _watched_shapes(watch, name):
    value = watch.values[name]
    return [(e["step"], [leaf["shapes"] for leaf in e["leaves"]]) for e in value.shape_events]


def _assert_common_families(data, batches):
    """inputs, data and variables: the same expectations for both runs."""
    inputs = data.inputs
    assert inputs.steps.tolist() == [0, 1, 2]
    assert inputs.batch_size.tolist() == batches
    assert [i["name"] for i in inputs.shape_events[0]["inputs"]] == ["x", "y"]
    examples = data.data
    assert examples.steps.tolist() == [0, 1, 2]
    assert examples.batch_size.tolist() == batches
    assert examples.duplicated.tolist() == [[0, 0]] * 3  # a sharded pipeline
    variables = data.variables
    assert variables.steps.tolist() == [0, 1, 2]
    assert variables.identical.all()  # every copy bit-identical to replica 0's
    assert all(v["mirrored"] for v in variables.variables)


def _assert_local_gradients(gradients, variables, scaling):
    """Norms of each replica's local gradients; replica 1's empty last batch gives 0."""
    assert gradients.steps.tolist() == [0, 1, 2]
    assert (gradients.scaling, gradients.has_loss, len(gradients.variables)) == (
        scaling,
        True,
        variables,
    )
    norms = gradients.global_norm
    assert (norms[:2] > 0).all() and norms[2, 0] > 0 and norms[2, 1] == 0
    assert gradients.nonfinite_steps.size == 0


# Per run: source, batch sizes, gradient variables and scaling, the generators seen (per flavour)
# and the one whose streams must differ per replica, the watched value and its shape events.
EXPECTED = {
    "fit": {
        "source": "fit",
        "batches": FIT_BATCHES,
        "gradients": (4, "replica_loss"),
        "generators": {"keras3": ["dropout", "augment"], "tf_keras": ["augment"]},
        "own_streams": "augment",  # created under the scope: each replica its own stream
        "watched": ("outputs", [(0, [[[4, 1], [4, 1]]]), (2, [[[1, 1], [0, 1]]])]),
    },
    "loop": {
        "source": "custom_loop",
        "batches": LOOP_BATCHES,
        "gradients": (2, "as_given"),
        "generators": {"keras3": ["noise"], "tf_keras": ["noise"]},
        "own_streams": "noise",
        "watched": ("logits", [(0, [[[4, 1], [3, 1]]]), (2, [[[1, 1], [0, 1]]])]),
    },
}


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("run", ["fit", "loop"])
def test_every_family_recorded(window_logs, run, flavour):
    """`fit` (ReplicaCallback) and the custom loop (ReplicaProbe): every family, its values."""
    data, findings, facts = _run(window_logs, flavour, run)
    expected = EXPECTED[run]
    assert data.inputs.source == expected["source"] and facts[f"{run}_iterations"] == 3
    _assert_common_families(data, expected["batches"])
    variables, scaling = expected["gradients"]
    _assert_local_gradients(data.gradients, variables=variables, scaling=scaling)
    names = [g["name"] for g in data.rng.generators]
    assert names == expected["generators"][flavour]
    own = names.index(expected["own_streams"])
    assert (data.rng.fingerprint[:, own, 0] != data.rng.fingerprint[:, own, 1]).all()
    name, shapes = expected["watched"]
    assert _watched_shapes(data.watch, name) == shapes
    assert findings == (FIT_FINDINGS[flavour] if run == "fit" else LOOP_FINDINGS)


def test_report_reads_every_run(window_logs):
    logdir, _ = window_logs
    result = run_cli("report", logdir, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = {run["run"]: run for run in json.loads(result.stdout)["runs"]}
    assert sorted(runs) == RUNS
    for flavour in FLAVOURS:
        assert runs[f"{flavour}/fit"]["batch_size"] == FIT_BATCHES
        assert runs[f"{flavour}/loop"]["batch_size"] == LOOP_BATCHES
        kinds = [f["kind"] for f in runs[f"{flavour}/loop"]["findings"]]
        assert sorted(kinds) == sorted(kind for kind, _, _ in LOOP_FINDINGS)
    # The loop's first_batch_uneven is an error: --fail-on error exits 1.
    assert run_cli("report", logdir, "--fail-on", "error").returncode == 1


@pytest.mark.parametrize("load_fast", [False, True], ids=["python_loader", "rustboard"])
def test_tensorboard_serves_every_run(window_logs, load_fast):
    logdir, _ = window_logs
    server = TensorBoardServer(logdir, load_fast=load_fast)
    try:
        body = server.wait_for(
            PLUGIN + "/runs",
            lambda status, body: status == 200 and len(json.loads(body)["runs"]) == 4,
        )
        runs = {run["run"]: run for run in json.loads(body)["runs"]}
        assert sorted(runs) == RUNS
        for run in RUNS:
            assert set(runs[run]["families"]) >= {"inputs", "gradients", "rng", "data"}
            assert runs[run]["findings"]["warning"] >= 1
        for run, batches in (("keras3/fit", FIT_BATCHES), ("tf_keras/loop", LOOP_BATCHES)):
            status, inputs, _ = http_get(f"{server.url}{PLUGIN}/inputs?run={run}")
            assert status == 200
            assert json.loads(inputs)["batch_size"] == batches
    finally:
        server.stop()


def test_parameter_server_fit_and_custom_loop(tmp_path):
    """tf_keras `fit` and `probe.schedule` on a 2-worker, 2-ps cluster (a child process): each
    worker recorded, worker 1's batches of 2 named."""
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "pss_child.py"), str(tmp_path),
         str(tmp_path / "results.json"), "fit_tf_keras", "uneven_inputs"],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    for name in ("fit_tf_keras", "uneven_inputs"):
        assert "error" not in results[name], results[name]["error"]
        assert results[name]["warnings"] == [], results[name]["warnings"]
        report = tb_replica_plugin.load(str(tmp_path / name))
        ((run, data),) = report.runs.items()
        assert data.inputs.strategy == "ParameterServerStrategy"
        steps = data.inputs.steps.tolist()
        assert steps and data.inputs.batch_size.tolist() == [[8, 2]] * len(steps)
        assert [(f.kind, f.replicas) for f in report.findings[run]] == [("uneven_batch", [1])]
    assert results["fit_tf_keras"]["facts"]["iterations"] == 16
