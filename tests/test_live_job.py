"""A job that keeps training while a real TensorBoard serves it: the plugin reads only what its
workers append, and answers what a from-scratch read of the same files answers."""

import json
import os
import subprocess
import sys
import threading
import time
import types
import urllib.request

from conftest import REPO, free_port

from tb_replica_plugin import registry

PLUGIN = "/data/plugin/replicas"
NOW = 2_000_000_000.0  # the status family's clock in both servers (its state depends on it)


def _write_job(logdir, workers=2):
    """`benchmarks.job_scale`'s job (worker 0 by ReplicaCallback in a Keras fit, every family;
    the others copies with their own identity), `workers` × 2 replicas × 4 logged steps."""
    code = "import sys; from benchmarks.job_scale import write_job; "
    code += "write_job(sys.argv[1], int(sys.argv[2]), 2, 4)"
    done = subprocess.run(
        [sys.executable, "-c", code, logdir, str(workers)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _paths(replicas):
    from tb_replica_plugin.plugin import run_view_query

    paths = ["/runs", "/overview", "/findings?run=job"]
    for family in registry.families():
        if family.route:
            query = run_view_query(replicas, family.name)
            args = "&".join(f"{key}={value}" for key, value in sorted(query.items()))
            paths.append(f"{family.route}?run=job&{args}")
    return paths


def _answers(get, paths):
    return {path: get(path) for path in paths}


def test_a_growing_job_is_read_on_and_answers_as_a_fresh_read(tmp_path, monkeypatch):
    from tensorboard import program
    from test_store import get_json, serve

    from benchmarks import live_job
    from tb_replica_plugin import plugin as plugin_lib
    from tb_replica_plugin.families.status import present as status_present

    logdir = str(tmp_path)
    _write_job(logdir)
    clock = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if n[0] != "_"})
    clock.time = lambda: NOW
    monkeypatch.setattr(plugin_lib, "time", clock)
    monkeypatch.setattr(status_present, "time", clock)
    monkeypatch.setenv(plugin_lib.WARM_ENV, "0")  # only the requests read (counted below)
    plugins = []
    original = plugin_lib.ReplicasPlugin.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        plugins.append(self)

    monkeypatch.setattr(plugin_lib.ReplicasPlugin, "__init__", recording)
    board = program.TensorBoard()
    board.configure(
        argv=[
            None,
            *("--logdir", logdir, "--host", "127.0.0.1", "--port", str(free_port())),
            # One load, in this thread, before serving: TensorBoard's reload thread has no way
            # to stop it (a `while True` loop), so none is started. The plugin reads what the
            # workers append from the event files itself; the loader only lists the run.
            *("--load_fast=false", "--reload_interval", "0", "--reload_task", "blocking"),
        ]
    )
    # `launch()`, keeping the server to shut it down.
    server = board._make_server()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = server.get_url().rstrip("/")

    def get(path):
        try:
            with urllib.request.urlopen(url + PLUGIN + path, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    try:
        deadline = time.monotonic() + 60
        while [r["run"] for r in get("/runs")[1].get("runs", [])] != ["job"]:
            assert time.monotonic() < deadline, get("/runs")
            time.sleep(0.3)
        paths = _paths(4)
        before = _answers(get, paths)
        assert all(status == 200 for status, _ in before.values()), before
        assert before["/inputs?" + paths[3].split("?")[1]][1]["steps"] == [0, 1, 2, 3]
        (store,) = [p.store for p in plugins]
        state = store._states[("", "job")]
        read_first, full_reads = state.values_read, state.full_reads

        appended = live_job.append_steps(os.path.join(logdir, "job"), 3, now=NOW - 1)
        after = _answers(get, paths)
        # Only the appended values were read, without reading the job again.
        assert state.values_read - read_first == appended > 0
        assert state.full_reads == full_reads == 1
        assert after[paths[3]][1]["steps"] == list(range(7))
        # What a new plugin answers from reading the same files from their start.
        fresh, _, _, _ = serve(logdir)
        assert after == _answers(lambda path: get_json(fresh, path), paths)
    finally:
        server.shutdown()
        server.server_close()
