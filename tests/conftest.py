"""Shared test set-up: one TensorFlow per process, 4 logical CPU replicas, logs trained once.

Logical devices can be configured only once per process, so this module configures them at
import, before any test touches TensorFlow, and every test shares them. Strategies are cached per
device set: two MirroredStrategy objects over the same devices reuse collective keys and clash.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.environ.get("TB_REPLICA_INSTALLED_COPY") == "1":
    # `.ci/window.py`: the package installed into this venv is the one under test; the checkout
    # only lends `demo` (appended, so the installed `tb_replica_plugin` comes first).
    sys.path.append(REPO)
else:
    sys.path.insert(0, REPO)

from demo import scenarios  # noqa: E402

DEVICES = scenarios.configure_devices(4)  # the unit tests use 2 of them, the demo all 4
VENV_BIN = os.path.dirname(sys.executable)
_STRATEGIES = {}


def mirrored(num_replicas):
    """The process-wide MirroredStrategy over the first `num_replicas` logical CPUs."""
    import tensorflow as tf

    if _STRATEGIES and num_replicas not in _STRATEGIES:
        raise RuntimeError(
            "one MirroredStrategy size per test process: collective group keys of a second "
            "strategy clash with the first (run it in a subprocess, as demo_logs does)"
        )
    if num_replicas not in _STRATEGIES:
        _STRATEGIES[num_replicas] = tf.distribute.MirroredStrategy(DEVICES[:num_replicas])
    return _STRATEGIES[num_replicas]


def small_model(strategy, features, outputs=1):
    import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(outputs)])
        model.compile(optimizer="sgd", loss="mse")
    return model


def custom_loop_inputs(strategy, run_dir, batches, update_freq=1):
    """Runs `ReplicaProbe.observe_inputs` inside `strategy.run` for each distributed batch."""
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    probe = ReplicaProbe(run_dir, strategy, update_freq=update_freq)

    @tf.function
    def step(batch):
        def step_fn(inputs):
            probe.observe_inputs(inputs)
            return tf.constant(0.0)

        return strategy.run(step_fn, args=(batch,))

    for batch in batches:
        step(batch)
    probe.close()
    return probe


def write_loop_15_7(strategy, logdir, examples, global_batch):
    """The run `loop_15_7/replicas` (a custom loop over zeros): `examples` examples in global
    batches of `global_batch`; a later call appends to it."""
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices(
        {"x": np.zeros((examples, 2), "float32"), "y": np.zeros((examples,), "int64")}
    ).batch(global_batch)
    custom_loop_inputs(
        strategy,
        os.path.join(logdir, "loop_15_7", "replicas"),
        strategy.experimental_distribute_dataset(data),
    )


def build_unit_logs(logdir):
    """The runs the value tests read back (2 replicas each)."""
    import tensorflow as tf

    from tb_replica_plugin import ReplicaCallback, inspect_dataset

    strategy = mirrored(2)
    # fit: 17 examples, global batch 8 → [4, 4], [4, 4], [1, 0].
    x = np.arange(17 * 3, dtype="float32").reshape(17, 3)
    y = np.ones((17, 1), "float32")
    model = small_model(strategy, 3)
    model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
        epochs=1,
        verbose=0,
        callbacks=[ReplicaCallback(os.path.join(logdir, "fit_17_8"))],
    )
    # custom loop: 15 examples, global batch 7 → [4, 3], [4, 3], [1, 0].
    write_loop_15_7(strategy, logdir, examples=15, global_batch=7)
    # pre-flight inspector on the batch-7 dataset.
    inspect_dataset(
        strategy,
        tf.data.Dataset.from_tensor_slices(np.zeros((15, 2), "float32")).batch(7),
        os.path.join(logdir, "inspect_7"),
        steps=5,
    )

    # dict inputs whose per-replica shapes differ (replica 1 gets 5 features, not 4).
    def make_inputs(context):
        width = 4 + context.replica_id_in_sync_group
        return {
            "features": tf.ones([3, width]),
            "ids": tf.zeros([3], tf.int32),
        }

    custom_loop_inputs(
        strategy,
        os.path.join(logdir, "dict_mismatch", "replicas"),
        [strategy.experimental_distribute_values_from_function(make_inputs) for _ in range(2)],
    )


@pytest.fixture(scope="session")
def unit_logs(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("unit_logs"))
    build_unit_logs(logdir)
    return logdir


@pytest.fixture(scope="session")
def bad_logs(tmp_path_factory):
    """Hostile names and bad data (tests/bad_logs.py), written once per session (2 replicas)."""
    import bad_logs as builder

    logdir = str(tmp_path_factory.mktemp("bad_logs"))
    builder.build_bad_logs(logdir, mirrored(2))
    return logdir


@pytest.fixture(scope="session")
def demo_logs(tmp_path_factory):
    """The demo, trained by its own entry point in a subprocess (4 replicas).

    A subprocess because collective group keys are allocated per MirroredStrategy: a 4-replica
    strategy and the 2-replica one of the other tests cannot share a process.
    """
    logdir = str(tmp_path_factory.mktemp("demo_logs"))
    result = subprocess.run(
        [sys.executable, "-m", "demo.train", logdir, "--replicas", "4"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return logdir


def run_cli(*args):
    """Runs this venv's `tb-replica` with `args` (in the checkout); the CompletedProcess."""
    return subprocess.run(
        [os.path.join(VENV_BIN, "tb-replica"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url, timeout=10):
    """GET `url`: `(status, body bytes, content type)`; HTTP errors are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get("Content-Type", "")


class TensorBoardServer:
    """A real `tensorboard` process on a free localhost port, stopped by `stop()`."""

    def __init__(self, logdir, load_fast=False, tensorboard=None, extra=()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            tensorboard or os.path.join(VENV_BIN, "tensorboard"),
            "--logdir",
            logdir,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            f"--load_fast={'true' if load_fast else 'false'}",
            "--reload_interval",
            "1",
            *extra,
        ]
        self.log = open(os.path.join(logdir, f".tb_{self.port}.log"), "w")  # noqa: SIM115
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_for(self, path, predicate, timeout=120):
        """Polls `path` until `predicate(status, body)` holds; returns the last body."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.flush()
                with open(self.log.name, errors="replace") as log:
                    tail = log.read()[-3000:]
                raise RuntimeError(f"tensorboard exited with {self.process.returncode}:\n{tail}")
            try:
                status, body, _ = http_get(self.url + path, timeout=5)
                last = (status, body)
                if predicate(status, body):
                    return body
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{path} not ready after {timeout}s, last answer {last!r}")

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="module")
def demo_server(demo_logs):
    """TensorBoard serving the demo log dir as `demo/run.sh` does (TensorBoard keeps its default
    sample; the plugin reads the event files itself), once it lists every run and job (for the
    browser tests, `tests/browser_tab.py`)."""
    from browser_tab import DEMO_JOBS

    server = TensorBoardServer(demo_logs)
    try:
        server.wait_for(
            "/data/plugin/replicas/runs",
            # Every run, and the multi-worker jobs with both of their workers.
            lambda status, body: (
                status == 200
                and len(json.loads(body)["runs"]) >= 17
                and sum(len(r["workers"]) == 2 for r in json.loads(body)["runs"]) == len(DEMO_JOBS)
            ),
        )
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium, through Playwright."""
    from browser_tab import CHROMIUM, CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), "Debian chromium missing: run .ci/setup.sh"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()
