"""`pip install .` into a fresh venv serves the plugin from the installed package.

The fresh venv gets this package with its dependencies, which name no TensorFlow: TensorFlow
(600 MB) is not needed to serve the tab or to report (the read side imports none), and its absence
there proves it; the write side then refuses with an error that says what to install. The package
is built from a copy of the sources, so a static file missing from `package_data` would be missing
here. (Installing into a user's TensorFlow is `.ci/window.py`'s part.)
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, TensorBoardServer, http_get

from tb_replica_plugin import requirements


def pip(venv, *args):
    command = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pip_install_into_fresh_venv_serves_plugin(tmp_path, unit_logs, monkeypatch):
    # The installed copy must be what runs, not a checkout on PYTHONPATH.
    monkeypatch.delenv("PYTHONPATH", raising=False)
    source = tmp_path / "src"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "node_modules", "__pycache__", "*.egg-info", "demo_logs", "build"
        ),
    )
    venv = str(tmp_path / "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    pip(venv, str(source))
    probe = subprocess.run(
        [
            os.path.join(venv, "bin", "python"),
            "-c",
            "import tb_replica_plugin.plugin as p, sys; print(p.__file__); "
            "print('tensorflow' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=str(tmp_path),
    )
    installed_file, tensorflow_imported = probe.stdout.split()
    assert installed_file.startswith(venv)
    assert tensorflow_imported == "False"
    _assert_write_side_refuses_without_tensorflow(venv, str(tmp_path))

    server = TensorBoardServer(unit_logs, tensorboard=os.path.join(venv, "bin", "tensorboard"))
    try:
        body = server.wait_for(
            "/data/plugins_listing", lambda status, body: status == 200 and b"replicas" in body
        )
        assert json.loads(body)["replicas"]["enabled"] is True
        status, module, content_type = http_get(server.url + "/data/plugin/replicas/index.js")
        with open(os.path.join(REPO, "tb_replica_plugin", "static", "index.js"), "rb") as f:
            assert (status, module) == (200, f.read())
        assert "javascript" in content_type
        runs = server.wait_for(
            "/data/plugin/replicas/runs",
            lambda status, body: status == 200 and len(json.loads(body)["runs"]) == 4,
        )
        assert "fit_17_8/replicas" in {r["run"] for r in json.loads(runs)["runs"]}
    finally:
        server.stop()


def _assert_write_side_refuses_without_tensorflow(venv, cwd):
    """No TensorFlow in the venv: the write side's import says so and what to install, and
    `tb-replica inspect` exits 2 with the same words."""
    python = os.path.join(venv, "bin", "python")
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, timeout=120
    )
    names = {package["name"].lower() for package in json.loads(listed.stdout)}
    assert not {n for n in names if n.startswith(("tensorflow", "tf-", "tf_", "keras"))}, names
    for name in ("ReplicaCallback", "ReplicaProbe", "inspect_dataset"):
        result = subprocess.run(
            [python, "-c", f"import tb_replica_plugin; tb_replica_plugin.{name}"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=cwd,
        )
        assert result.returncode == 1
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("tb_replica_plugin.requirements.TensorFlowRequirementError: ")
        assert "need TensorFlow 2.16-2.21; none is installed for " + python in last
        assert "pip install 'tensorflow>=2.16,<2.22'" in last
    inspect = subprocess.run(
        [os.path.join(venv, "bin", "tb-replica"), "inspect", "pipeline.py:make", "--logdir", cwd],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert inspect.returncode == 2
    assert inspect.stderr.startswith("tb-replica: error: tb_replica_plugin's ReplicaCallback")
    assert "none is installed" in inspect.stderr


@pytest.mark.parametrize(
    ("version", "outcome"),
    [
        ("2.16.2", None),
        ("2.21.0", None),
        ("2.19.0rc1", None),
        ("2.22.0-dev20260101", "newer"),
        ("3.0.0", "newer"),
        ("2.15.1", "older"),
        ("1.15.5", "older"),
        ("unknown", "older"),
    ],
)
def test_tensorflow_version_window(version, outcome):
    """Inside the window: nothing; newer: a warning's text; older or unreadable: an ImportError
    naming what was found and what to install."""
    if outcome == "older":
        with pytest.raises(ImportError) as raised:
            requirements.check_version(version, "TensorFlow (tensorflow-cpu, /x)")
        message = str(raised.value)
        assert f"found TensorFlow (tensorflow-cpu, /x) {version!r}" in message
        assert "need TensorFlow 2.16-2.21" in message
        assert "pip install 'tensorflow>=2.16,<2.22'" in message
        assert "tb_replica_plugin[tf]" in message
    elif outcome == "newer":
        message = requirements.check_version(version)
        assert message.startswith(f"tb_replica_plugin: TensorFlow {version} is newer than")
        assert "(2.16-2.21)" in message
    else:
        assert requirements.check_version(version) is None


def test_write_side_finds_this_processes_tensorflow():
    """The running TensorFlow passes the check and is the module returned."""
    import tensorflow as tf

    assert requirements.require_tensorflow() is tf
    assert requirements.parse_version(tf.__version__) <= requirements.NEWEST
