"""What the benchmarks share: the machine line, ratio ranges, the results files, and for the `fit`
benchmarks the MLP, its data, and variants timed in alternation.

The model is the performance issue's MLP (64 → 256 → 256 → 1, Adam, MSE) on a cached dataset
of global batch 256; each round fits every variant once (A B C … A B C …) so drift of the
machine hits them alike, and the first epoch of each fit (tracing) is not timed.
"""

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import sys
import time

GLOBAL_BATCH = 256
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# The distributions whose versions a results file names (the first installed of each tuple).
VERSIONED = {
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tf-nightly"),
    "keras": ("keras",),
    "tf_keras": ("tf-keras", "tf_keras"),
    "tensorboard": ("tensorboard",),
    "numpy": ("numpy",),
}


def machine():
    """The machine line every benchmark prints: architecture, cores, Python version."""
    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}"


def machine_info():
    """The machine a run measured on: `{"arch", "cores", "cpu_model", "gpu"}` (`gpu`: None, the
    benchmarks run on logical CPU devices)."""
    model = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            names = [
                line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
            ]
        model = names[0] if names else model
    except OSError:
        pass
    return {"arch": platform.machine(), "cores": os.cpu_count(), "cpu_model": model, "gpu": None}


def versions():
    """`{"python", "tensorflow", "keras", "tf_keras", "tensorboard", "numpy"}`: the installed
    versions (None: not installed), read from the distributions' metadata without importing them."""
    found = {"python": platform.python_version()}
    for key, distributions in VERSIONED.items():
        found[key] = None
        for distribution in distributions:
            try:
                found[key] = importlib.metadata.version(distribution)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return found


def add_record_argument(parser):
    """Adds `--record` to a benchmark's command line (see `record_results`)."""
    parser.add_argument(
        "--record",
        action="store_true",
        help="write the figures to benchmarks/results/<name>.json (then run "
        "`python -m benchmarks.tables` to update README and docs)",
    )


def check_record(parser, args):
    """Refuses `--record` with `--quick` (reduced sizes say nothing of the speed), through
    `parser.error` (exit status 2)."""
    if getattr(args, "record", False) and getattr(args, "quick", False):
        parser.error("--record: a --quick run's figures are not results; run at full size")


def record_results(name, runs, argv=None, results_dir=None, module=None):
    """Writes a run's figures into `results_dir/<name>.json`, the one source of every figure that
    README and docs state (`python -m benchmarks.tables` renders them).

    Each entry of the file's `runs` is one kind of run (e.g. a loader and mode): a recorded run
    replaces the entries it names and keeps the others.

    Args:
      name: the benchmark's name (`fit_overhead`, ...).
      runs: `{key: figures}`; `figures` is a JSON-able dict (numbers, or `{"median", "min",
        "max"}` ranges).
      argv: the command line's arguments (default `sys.argv[1:]`), recorded as the command.
      results_dir: default `RESULTS_DIR`.
      module: the module the command ran (default `benchmarks.<name>`).

    Returns:
      The path written.
    """
    results_dir = results_dir or RESULTS_DIR
    path = os.path.join(results_dir, f"{name}.json")
    document = {"benchmark": name, "runs": {}}
    if os.path.exists(path):
        with open(path) as handle:
            document = json.load(handle)
    args = sys.argv[1:] if argv is None else list(argv)
    command = shlex.join(["python", "-m", module or f"benchmarks.{name}", *args])
    now = datetime.datetime.now(datetime.timezone.utc)
    for key, figures in runs.items():
        document["runs"][key] = {
            "source": "measured",
            "command": command,
            "date": now.strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine_info(),
            "load_average": round(os.getloadavg()[0], 2),
            "versions": versions(),
            "figures": figures,
        }
    os.makedirs(results_dir, exist_ok=True)
    with open(path, "w") as handle:
        json.dump(document, handle, indent=1, ensure_ascii=False)
        handle.write("\n")
    print(f"figures written to {path}", file=sys.stderr)
    return path


def ratio_range(variant, baseline):
    """Median, min and max (4 decimals) of the pairwise ratios `variant[i] / baseline[i]`.

    Args:
      variant, baseline: equal-length sequences of positive figures, paired by index.

    Returns:
      `{"median": m, "min": lo, "max": hi}`.

    Example:
      >>> ratio_range([2.0, 3.0, 6.0], [1.0, 2.0, 3.0])
      {'median': 2.0, 'min': 1.5, 'max': 2.0}
    """
    ratios = [v / b for v, b in zip(variant, baseline, strict=True)]
    return {
        "median": round(statistics.median(ratios), 4),
        "min": round(min(ratios), 4),
        "max": round(max(ratios), 4),
    }


def median_seconds(function, repeats):
    """The median wall seconds of `repeats` calls of `function()`."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def mlp_dataset(steps_per_epoch, seed=0):
    """`tf.data.Dataset` of `steps_per_epoch` batches of GLOBAL_BATCH (x [64], y [1]), cached."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(GLOBAL_BATCH * steps_per_epoch, 64)).astype("float32")
    y = rng.normal(size=(GLOBAL_BATCH * steps_per_epoch, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).cache().prefetch(2)


def mlp_model(strategy, dropout=None, keras_module=None, hidden_layers=2):
    """The compiled MLP under `strategy.scope()`; `dropout`: a Dropout rate after layer 1;
    `keras_module`: the Keras to build it with (default `keras`, Keras 3; `tf.keras` for tf_keras);
    `hidden_layers`: its hidden Dense layers of 256 units (>= 1; 2 trainable variables each, 2 more
    for the output layer).
    """
    if keras_module is None:
        import keras
    else:
        keras = keras_module

    with strategy.scope():
        layers = [keras.Input((64,)), keras.layers.Dense(256, activation="relu")]
        if dropout is not None:
            layers.append(keras.layers.Dropout(dropout))
        layers += [keras.layers.Dense(256, activation="relu") for _ in range(hidden_layers - 1)]
        layers.append(keras.layers.Dense(1))
        model = keras.Sequential(layers)
        model.compile(optimizer="adam", loss="mse")
    return model


def epoch_timer():
    """A Keras callback keeping the wall (`times`) and process CPU (`cpu_times`) seconds of every
    epoch; no per-batch hooks, so it adds no per-step host work."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times, self.cpu_times = [], []

        def on_epoch_begin(self, epoch, logs=None):
            self._start = (time.perf_counter(), time.process_time())

        def on_epoch_end(self, epoch, logs=None):
            self.times.append(time.perf_counter() - self._start[0])
            self.cpu_times.append(time.process_time() - self._start[1])

    return EpochTimer()


def alternate_fits(model, dataset, variants, *, rounds, epochs, steps_per_epoch, workdir):
    """Fits `model` once per variant per round, 1 + `epochs` epochs each, variants alternated.

    Args:
      variants: `{name: make_callbacks(log_dir) -> list of callbacks}`.

    Returns:
      `(wall, cpu)`: `{name: [seconds per step of each timed epoch]}` each.
    """
    wall = {name: [] for name in variants}
    cpu = {name: [] for name in variants}
    for round_index in range(rounds):
        for name, make_callbacks in variants.items():
            timer = epoch_timer()
            log_dir = os.path.join(workdir, f"{name}_{round_index}")
            model.fit(
                dataset,
                epochs=1 + epochs,
                verbose=0,
                callbacks=[*make_callbacks(log_dir), timer],
            )
            wall[name].extend(t / steps_per_epoch for t in timer.times[1:])
            cpu[name].extend(t / steps_per_epoch for t in timer.cpu_times[1:])
    return wall, cpu


def file_sizes(directory):
    """`{path: bytes}` of every file under `directory`."""
    return {
        os.path.join(root, name): os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(directory)
        for name in names
    }


def start_tensorboard(logdir, *flags, env=None):
    """`(process, url)`: this environment's `tensorboard` serving `logdir` on a free local port
    with `flags` (its output discarded; stop it with `terminate`).

    Args:
      logdir: the log directory.
      *flags: more command-line flags, e.g. `"--load_fast=false"`.
      env: the process's environment (None: this one's).
    """
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    tensorboard = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    command = [tensorboard, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port), *flags]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    return process, f"http://127.0.0.1:{port}"
