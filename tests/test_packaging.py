"""`pip install .` into a fresh venv serves the plugin from the installed package.

The fresh venv gets TensorBoard from PyPI and this package with `--no-deps`: TensorFlow (600 MB)
is not needed to serve the tab (the plugin imports no TensorFlow), and leaving it out proves that.
The package is built from a copy of the sources, so a static file missing from `package_data`
would be missing here.
"""

import json
import os
import shutil
import subprocess
import sys

from conftest import REPO, TensorBoardServer, http_get


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
    pip(venv, "tensorboard==2.21.*")
    pip(venv, "--no-deps", str(source))
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
