"""The tab and the report at job scale: a synthetic multi-worker job on a real `tensorboard`.

Writes a job of `--workers` workers × `--replicas` replicas × `--steps` logged steps, then, for
each loader (TensorBoard's Python loader and RustBoard, `--load_fast=true`), starts a real
`tensorboard --samples_per_plugin replicas=0` on it, waits until it has loaded the data (every
worker run listed and the server idle; by default idle again after the plugin has had time to
compute settled runs ahead, which `--cold` turns off), and times what the tab asks:
`/overview`, then the run view of the job (`/findings` and every family route with the tab's
arguments for its replicas, `plugin.run_view_query`; 6 at a time and gzip accepted, like a
browser). With `--live_steps N`, every worker then appends N logged steps and a heartbeat each
(`benchmarks.live_job`, as a running job does) and the run view is timed again once TensorBoard
has reloaded. With `--live_period S`, every worker then keeps appending a step every S seconds
(a job that never settles) while the run view is opened afresh and reloaded. Then
`tb-replica report --json` on the job as written (the appended steps cut off again).
Prints one JSON line (and each loader's figures on stderr as they come).

The job: worker 0 is written by the real write path, a Keras `fit` with `ReplicaCallback`
(every family: inputs, step time, gradients, rng from a Dropout layer, examples, variables; the
default `update_freq="epoch"`, one step per epoch so every step is a logged step) on `--replicas`
logical CPU devices, with the worker's identity of a multi-worker job. The other workers' runs
are copies of worker 0's events with their own identity (worker index, global replica ids,
devices): a 2-core machine cannot run hundreds of workers, and the readers cost the same.

    python -m benchmarks.job_scale --workers 256 --replicas 8 --steps 1000

Figures: `first_load_s` / `cached_load_s` (wall seconds of the requests, first and repeated,
this client's decompression and JSON parsing included: `first_parse_s` / `cached_parse_s` are
its CPU seconds over the requests, a browser's own parsing differs) and
`first_load_cpu_s` / `cached_load_cpu_s` (CPU seconds of the tensorboard processes meanwhile),
`tensorboard_load_s` / `tensorboard_load_cpu_s` (until loaded and idle, what the plugin
computed ahead included), `refresh_load_s` / `refresh_load_cpu_s` (the run view after the new
steps), `live_first_load_s` / `live_load_s` (the growing job's view opened, then reloaded),
`peak_rss_mb` (high-water mark of the tensorboard process and its data server), and for the
report `report_s`, `report_cpu_s` and `report_peak_rss_mb`. A loader that fails (TensorBoard
exits, e.g. killed when out of memory, or a request fails) gives the figures it reached and
`error`; a failed report gives `report_error`.
"""

import argparse
import concurrent.futures
import contextlib
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from benchmarks import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PLUGIN = "/data/plugin/replicas"
# What the tab's run view asks (frontend/src/sections.js; the arguments: plugin.run_view_query).
RUN_VIEW = (
    "/findings?run={run}",
    "/inputs?run={run}&max_points={max_points}&replica_blocks={replica_blocks}",
    "/step_time?run={run}&max_points={max_points}&replica_blocks={replica_blocks}",
    "/gradients?run={run}&max_points={max_points}&replica_blocks={replica_blocks}",
    "/rng?run={run}&max_points={max_points}&matrix_side={matrix_side}",
    "/data?run={run}&max_points={max_points}&matrix_side={matrix_side}",
    "/variables?run={run}&max_points={max_points}&top={top}&replica_blocks={replica_blocks}",
)
JOB = "job"
RELOAD_S = 5  # TensorBoard's --reload_interval (its default)
LIVE_LOADS = 5  # run views timed while the job grows (`--live_period`)


def write_worker0(logdir, workers, replicas, steps):
    """Worker 0's run `logdir/job/worker_0`, by `ReplicaCallback` in a Keras fit."""
    import numpy as np
    import tensorflow as tf

    from benchmarks.common import mlp_model
    from demo.scenarios import configure_devices
    from tb_replica_plugin import ReplicaCallback
    from tb_replica_plugin.core import distribute

    devices = configure_devices(replicas)
    strategy = tf.distribute.MirroredStrategy(devices)
    identity = {
        "task_type": "worker",
        "task_index": 0,
        "worker": 0,
        "num_workers": workers,
        "job": "bench",
    }
    distribute.worker_info = lambda strategy: dict(identity)  # this process plays worker 0
    model = mlp_model(strategy, dropout=0.1)
    rng = np.random.default_rng(0)
    batch = 4 * replicas
    x = rng.normal(size=(batch * 64, 64)).astype("float32")
    y = rng.normal(size=(batch * 64, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(batch * 64).batch(batch).repeat()
    model.fit(
        data,
        steps_per_epoch=1,
        epochs=steps,
        verbose=0,
        callbacks=[ReplicaCallback(logdir, run_name=JOB)],
    )
    return os.path.join(logdir, JOB, "worker_0")


def _retarget(value, worker, replicas):
    """A JSON value of worker 0 with worker `worker`'s identity, global ids and devices."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "worker" and isinstance(item, dict):
                out[key] = {**item, "task_index": worker, "worker": worker}
            elif key == "replicas" and isinstance(item, list):
                out[key] = [r + worker * replicas if isinstance(r, int) else r for r in item]
            else:
                out[key] = _retarget(item, worker, replicas)
        return out
    if isinstance(value, list):
        return [_retarget(item, worker, replicas) for item in value]
    if isinstance(value, str):
        return re.sub(
            r"/job:[^/]+/replica:0/task:0/", f"/job:worker/replica:0/task:{worker}/", value
        )
    return value


def worker0_records(source_dir):
    """`{file name: [(serialized event, [string tensor values] or None)]}` of worker 0's run."""
    import tensorflow as tf
    from tensorboard.compat.proto import event_pb2

    files = {}
    for name in sorted(os.listdir(source_dir)):
        if "tfevents" not in name:
            continue
        records = []
        for raw in tf.compat.v1.io.tf_record_iterator(os.path.join(source_dir, name)):
            event = event_pb2.Event.FromString(raw)
            strings = [list(v.tensor.string_val) for v in event.summary.value]
            records.append((raw, event if any(strings) else None))
        files[name] = records
    return files


def copy_worker(records, target_dir, worker, replicas):
    """Writes worker 0's events (`worker0_records`) into `target_dir` as worker `worker`'s."""
    import tensorflow as tf

    os.makedirs(target_dir, exist_ok=True)
    for name, events in records.items():
        with tf.io.TFRecordWriter(os.path.join(target_dir, name)) as writer:
            for raw, event in events:
                if event is None:  # no string tensor: the same bytes on every worker
                    writer.write(raw)
                    continue
                copy = type(event)()
                copy.CopyFrom(event)
                for value in copy.summary.value:
                    strings = value.tensor.string_val
                    for i, text in enumerate(strings):
                        try:
                            document = json.loads(text)
                        except (UnicodeDecodeError, ValueError):
                            continue
                        strings[i] = json.dumps(_retarget(document, worker, replicas)).encode()
                writer.write(copy.SerializeToString())


def write_job(logdir, workers, replicas, steps):
    """The job's worker runs; returns the seconds spent writing worker 0 and copying."""
    start = time.perf_counter()
    source = write_worker0(logdir, workers, replicas, steps)
    written = time.perf_counter() - start
    records = worker0_records(source)
    for worker in range(1, workers):
        copy_worker(records, os.path.join(logdir, JOB, f"worker_{worker}"), worker, replicas)
    return written, time.perf_counter() - start - written


# ------------------------------------------------------------------------------- processes


def _tree(pid):
    """`pid` and its descendants (from /proc)."""
    pids = [pid]
    for current in pids:
        try:
            threads = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for thread in threads:  # a child started by any thread (RustBoard's data server)
            try:
                with open(f"/proc/{current}/task/{thread}/children") as handle:
                    pids.extend(int(child) for child in handle.read().split())
            except OSError:
                pass
    return pids


def _cpu_s(pid):
    """User + system CPU seconds of `pid` and its descendants."""
    total = 0
    for current in _tree(pid):
        try:
            with open(f"/proc/{current}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid):
    """Sum of the peak resident sets (VmHWM) of `pid` and its descendants, in MiB."""
    total = 0
    for current in _tree(pid):
        try:
            with open(f"/proc/{current}/status") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _get(url, timeout=3600):
    """`(document, seconds)`: the JSON answer of `url` (gzip accepted, as a browser asks) and the
    CPU seconds this client's thread spent decompressing and parsing it."""
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
        compressed = response.headers.get("Content-Encoding") == "gzip"
    start = time.thread_time()
    document = json.loads(gzip.decompress(body) if compressed else body)
    return document, time.thread_time() - start


def _wait_loaded(url, process, workers, timeout, settle_s=0.0):
    """Waits until TensorBoard lists every worker run and is idle (a second with almost no CPU
    used); with `settle_s`, waits that long more and until it is idle again."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"tensorboard exited with status {process.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError("tensorboard did not load the job in time")
        try:
            runs, _ = _get(url + "/data/runs", timeout=30)
            if sum(run.startswith(JOB + "/worker_") for run in runs) >= workers:
                break
        except OSError:
            pass
        time.sleep(0.5)
    _wait_idle(process, deadline)
    if settle_s:
        time.sleep(settle_s)
        _wait_idle(process, deadline)


def _wait_idle(process, deadline):
    """Waits for a second in which the process (and RustBoard's data server) used almost no CPU
    (RustBoard's own reloads of a loaded log dir leave most seconds idle)."""
    previous = _cpu_s(process.pid)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = _cpu_s(process.pid)
        if now - previous < 0.05:
            return
        previous = now
    raise TimeoutError("tensorboard kept loading")


def _family_of(path):
    """The name of the family whose route `path` asks (None for `/findings`)."""
    from tb_replica_plugin import registry

    route = path.split("?")[0]
    return next((f.name for f in registry.families() if f.route == route), None)


def _run_view(url):
    """`/overview`, then the job's run view (6 requests at a time); checks what they answer.

    Returns:
      `(the job's overview entry, the route bodies, CPU seconds spent parsing them all)`.
    """
    from tb_replica_plugin.plugin import run_view_query

    overview, parse_s = _get(url + PLUGIN + "/overview")
    names = [entry["run"] for entry in overview["runs"]]
    if names != [JOB]:
        raise RuntimeError(f"/overview lists {names}, not the job")
    replicas = len(overview["runs"][0]["replicas"])
    paths = [
        PLUGIN + path.format(run=JOB, **run_view_query(replicas, _family_of(path)))
        for path in RUN_VIEW
    ]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda path: _get(url + path), paths))
    return overview["runs"][0], [body for body, _ in answers], parse_s + sum(s for _, s in answers)


def measure_tensorboard(
    logdir,
    workers,
    load_fast,
    timeout,
    warm=True,
    live_steps=0,
    known=None,
    keep_all=True,
    live_period=0.0,
    live_wait=None,
):
    """The figures of one loader: load, first and cached run view, peak RSS.

    `warm`: the plugin computes settled runs ahead (its default); once TensorBoard is idle, the
    load waits two of the plugin's `WARM_SECONDS` (the versions seen twice) and until it is
    idle again, so `tensorboard_load_s` includes that work. False sets `TB_REPLICA_WARM=0`: the
    first load computes the job.

    `live_steps`: after the cached run view, every worker appends that many logged steps (and a
    heartbeat each, `live_job.append_steps`; `known` is its cache of the workers' last steps);
    once TensorBoard has reloaded (`RELOAD_S`) and is idle, the run view again: `refresh_load_s`
    / `refresh_load_cpu_s`, and `refresh_steps_served` (the inputs' steps it shows).

    `live_period`: then every worker appends a logged step (and a heartbeat) every that many
    seconds, a job that never settles, while the run view is timed once after `live_wait`
    seconds and `LIVE_LOADS` times more (`_live_loads`).

    `keep_all`: TensorBoard keeps every sample of the plugin's tensors
    (`--samples_per_plugin replicas=0`); False: its default sample (the plugin reads the event
    files itself either way).
    """
    from tb_replica_plugin import plugin

    process, url = common.start_tensorboard(
        logdir,
        f"--load_fast={'true' if load_fast else 'false'}",
        *(("--samples_per_plugin", "replicas=0") if keep_all else ()),
        *("--reload_interval", str(RELOAD_S)),
        env={**os.environ, plugin.WARM_ENV: "1" if warm else "0"},
    )
    figures = {"warm": warm, "keep_all_samples": keep_all}
    try:
        start = time.perf_counter()
        settle_s = 2 * plugin.WARM_SECONDS + 1 if warm else 0.0
        _wait_loaded(url, process, workers, timeout, settle_s=settle_s)
        loaded_s = time.perf_counter() - start
        figures["tensorboard_load_s"] = round(loaded_s, 2)
        figures["tensorboard_load_cpu_s"] = round(_cpu_s(process.pid), 2)
        _first_and_cached(url, process, figures)
        if live_steps:
            figures.update(_refresh(url, process, logdir, live_steps, known, timeout))
        if live_period:
            figures.update(_live_loads(url, process, logdir, live_period, known, live_wait))
        figures["peak_rss_mb"] = round(_peak_rss_mb(process.pid), 1)
        return figures
    except (OSError, RuntimeError, TimeoutError) as error:  # a failure is a figure too
        process.poll()
        died = process.returncode is not None and process.returncode < 0
        cause = f" (killed by signal {-process.returncode}: out of memory?)" if died else ""
        return {**figures, "error": f"{type(error).__name__}: {error}{cause}"}
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def _first_and_cached(url, process, figures):
    """Adds to `figures` the run view's first and cached loads (wall, CPU, parse seconds; each
    as soon as it is measured) and what the last one served."""
    for name in ("first", "cached"):
        cpu, wall = _cpu_s(process.pid), time.perf_counter()
        entry, bodies, parse_s = _run_view(url)
        figures[f"{name}_load_s"] = round(time.perf_counter() - wall, 3)
        figures[f"{name}_parse_s"] = round(parse_s, 6)  # a tiny job parses in well under 1 ms
        figures[f"{name}_load_cpu_s"] = round(_cpu_s(process.pid) - cpu, 3)
    figures["replicas_served"] = len(entry["replicas"])
    figures["workers_served"] = len(entry["workers"])
    figures["steps_served"] = len(bodies[1]["steps"])
    figures["findings"] = entry["findings"]


def _refresh(url, process, logdir, steps, known, timeout):
    """Every worker appends `steps` logged steps; the run view once TensorBoard has them."""
    from benchmarks import live_job

    start = time.perf_counter()
    appended = live_job.append_steps(os.path.join(logdir, JOB), steps, known=known)
    figures = {"live_steps": steps, "appended_values": appended}
    figures["append_s"] = round(time.perf_counter() - start, 2)
    time.sleep(RELOAD_S + 1)  # TensorBoard's loader reads them at its next reload
    _wait_idle(process, time.monotonic() + timeout)
    cpu, wall = _cpu_s(process.pid), time.perf_counter()
    _, bodies, parse_s = _run_view(url)
    figures["refresh_load_s"] = round(time.perf_counter() - wall, 3)
    figures["refresh_parse_s"] = round(parse_s, 6)
    figures["refresh_load_cpu_s"] = round(_cpu_s(process.pid) - cpu, 3)
    figures["refresh_steps_served"] = len(bodies[1]["steps"])
    return figures


def _live_loads(url, process, logdir, period, known, wait=None, loads=LIVE_LOADS):
    """The run view of a job that keeps growing: a thread appends a logged step (and a
    heartbeat) to every worker every `period` seconds, so its data version changes between the
    plugin's looks and it never settles.

    First, after `wait` seconds (default: the plugin's `VIEWED_SECONDS` and a look, so it no
    longer keeps this view current: the tab is opened afresh on a job the plugin has been
    reading), the run view once: `live_first_load_s`. Then, as an open tab reloads, `loads`
    times `period` apart: `live_load_s`.

    Returns:
      `live_first_load_s` / `live_first_load_cpu_s`, `live_load_s` / `live_load_cpu_s` (each
      load's wall and TensorBoard CPU seconds), `live_load_median_s`, `live_steps_appended`
      (steps per worker meanwhile), and `live_last_step_served` (the job's last step in
      `/overview` at the first and the last load: the job grew).
    """
    from benchmarks import live_job
    from tb_replica_plugin import plugin, store

    job_dir, stop, appended = os.path.join(logdir, JOB), threading.Event(), [0]

    def append():
        while not stop.is_set():
            start = time.monotonic()
            live_job.append_steps(job_dir, 1, known=known)
            appended[0] += 1
            stop.wait(max(0.0, period - (time.monotonic() - start)))

    def timed():
        cpu, wall = _cpu_s(process.pid), time.perf_counter()
        entry, _, _ = _run_view(url)
        return round(time.perf_counter() - wall, 3), round(_cpu_s(process.pid) - cpu, 3), entry

    thread = threading.Thread(target=append, name="live_job", daemon=True)
    thread.start()
    walls, cpus = [], []
    try:
        time.sleep(store.VIEWED_SECONDS + plugin.WARM_SECONDS if wait is None else wait)
        first_wall, first_cpu, entry = timed()
        first_step = entry["last_step"]
        for _ in range(loads):
            time.sleep(period)
            wall, cpu, entry = timed()
            walls.append(wall)
            cpus.append(cpu)
    finally:
        stop.set()
        thread.join(timeout=120)
    return {
        "live_period_s": period,
        "live_first_load_s": first_wall,
        "live_first_load_cpu_s": first_cpu,
        "live_load_s": walls,
        "live_load_cpu_s": cpus,
        "live_load_median_s": sorted(walls)[len(walls) // 2],
        "live_steps_appended": appended[0],
        "live_last_step_served": [first_step, entry["last_step"]],
    }


def measure_report(logdir):
    """`tb-replica report --json` on the log dir: wall and CPU seconds, peak RSS, its job."""
    command = [os.path.join(os.path.dirname(sys.executable), "tb-replica"), "report", "--json"]
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(
            [*command, logdir], stdout=out, stderr=subprocess.DEVNULL, env=os.environ.copy()
        )
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        text = out.read().decode()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):  # 1: findings at or above --fail-on
        cause = f" (killed by signal {-code}: out of memory?)" if code < 0 else ""
        return {
            "report_error": f"tb-replica report exited with status {code}{cause}",
            "report_s": round(wall, 2),
            "report_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        }
    report = json.loads(text)
    runs = report["runs"] if isinstance(report, dict) else report
    job = runs[JOB] if isinstance(runs, dict) else next(r for r in runs if r["run"] == JOB)
    return {
        "report_s": round(wall, 2),
        "report_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "report_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "report_replicas": len(job.get("replicas", [])),
    }


def _parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1000, help="logged steps")
    parser.add_argument(
        "--loaders", default="python,rust", help='python, rust, both, or "" (the report alone)'
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to load, per loader")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="TB_REPLICA_WARM=0: the tab's first load computes the job (no work ahead)",
    )
    parser.add_argument(
        "--sampled",
        action="store_true",
        help="no --samples_per_plugin replicas=0: TensorBoard keeps its default sample of the "
        "plugin's tensors (the plugin reads the event files itself)",
    )
    parser.add_argument(
        "--live_steps",
        type=int,
        default=0,
        help="after the cached load, every worker appends this many steps: the refresh's figures",
    )
    parser.add_argument(
        "--live_period",
        type=float,
        default=0.0,
        help="then every worker appends a step every this many seconds while the run view is "
        f"timed once, then {LIVE_LOADS} times: a job that never settles (live_*_load_s)",
    )
    parser.add_argument(
        "--live_wait",
        type=float,
        help="with --live_period: seconds before the first view of the growing job (default: "
        "the plugin's VIEWED_SECONDS and a look, so the view is opened afresh)",
    )
    parser.add_argument(
        "--logdir",
        help="keep the job here and reuse it when already written (default: a temporary dir)",
    )
    common.add_record_argument(parser)
    return parser


def loaders(text):
    """The loaders `--loaders` names, in order: `"python,rust"`, `"both"` (the same), `"rust"`,
    `""` (none: the report alone).

    Raises:
      ValueError: a name that is not a loader.
    """
    names = ["python", "rust"] if text.strip() == "both" else [n.strip() for n in text.split(",")]
    names = [n for n in names if n]
    unknown = sorted(set(names) - {"python", "rust"})
    if unknown:
        raise ValueError(f'--loaders: unknown {unknown}; use python, rust, both or ""')
    return list(dict.fromkeys(names))


def record_key(args, loader):
    """The results file's entry of one loader's run: `default_rust`, `cold_rust`,
    `cold_live_rust` (`--cold --live_steps`), `keep_all_python` (without `--sampled`)..."""
    if not args.sampled:
        return f"keep_all_{loader}"
    if args.cold:
        return f"cold_live_{loader}" if args.live_steps else f"cold_{loader}"
    return f"default_{loader}"


def recorded_figures(result, loader):
    """One loader's figures as the results file keeps them (sizes in GB)."""
    figures = result[loader]

    def gb(mb):
        return None if mb is None else round(mb / 1024, 2)

    kept = {k: result[k] for k in ("workers", "replicas", "steps")}
    kept["logdir_gb"] = round(result["logdir_mb"] / 1024, 1)
    for key in ("first_load_s", "cached_load_s", "refresh_load_s", "refresh_load_cpu_s"):
        kept[key] = figures.get(key)
    kept["live_first_load_s"] = figures.get("live_first_load_s")
    if figures.get("live_load_s"):
        walls = figures["live_load_s"]
        kept["live_load_s"] = {
            "median": figures["live_load_median_s"],
            "min": min(walls),
            "max": max(walls),
        }
    kept["peak_rss_gb"] = gb(figures.get("peak_rss_mb"))
    kept["report_s"] = result.get("report_s")
    kept["report_peak_rss_gb"] = gb(result.get("report_peak_rss_mb"))
    return kept


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        args.loaders = loaders(args.loaders)
    except ValueError as error:
        parser.error(str(error))
    if (
        args.record
        and not args.cold
        and args.sampled
        and not (args.live_steps and args.live_period)
    ):
        parser.error("--record in the default mode needs --live_steps and --live_period")

    with tempfile.TemporaryDirectory() as scratch:
        logdir = args.logdir or scratch
        job_dir = os.path.join(logdir, JOB)
        if args.logdir and os.path.isdir(job_dir) and len(os.listdir(job_dir)) == args.workers:
            write_s = copy_s = 0.0  # the job written by an earlier run with the same --logdir
        else:
            write_s, copy_s = write_job(logdir, args.workers, args.replicas, args.steps)
        result = {
            "benchmark": "job_scale",
            "workers": args.workers,
            "replicas": args.replicas,
            "steps": args.steps,
            "write_worker0_s": round(write_s, 1),
            "copy_workers_s": round(copy_s, 1),
            "logdir_mb": round(sum(common.file_sizes(logdir).values()) / 2**20, 1),
        }
        known = {}  # the workers' last steps, parsed once (`live_job.append_steps`)
        with _appends_undone(job_dir):  # the job as written, for the report and the next run
            _measure_tensorboard(args, logdir, known, result)
        result.update(measure_report(logdir))
    print(json.dumps(result))
    if args.record:
        runs = {record_key(args, n): recorded_figures(result, n) for n in args.loaders}
        common.record_results("job_scale", runs, argv)
    return result


def _measure_tensorboard(args, logdir, known, result):
    """Each loader's TensorBoard figures into `result`."""
    for loader in args.loaders:  # none: the report alone
        figures = measure_tensorboard(
            logdir,
            args.workers,
            load_fast=loader == "rust",
            timeout=args.timeout,
            warm=not args.cold,
            live_steps=args.live_steps,
            known=known,
            keep_all=not args.sampled,
            live_period=args.live_period,
            live_wait=args.live_wait,
        )
        result[loader] = figures
        print(json.dumps({loader: figures}), file=sys.stderr, flush=True)  # kept if later fails


@contextlib.contextmanager
def _appends_undone(job_dir):
    """Cuts every event file of `job_dir` back to its size on entry when the block ends: the
    steps the live phases appended are removed from a kept `--logdir`."""
    sizes = common.file_sizes(job_dir)
    try:
        yield
    finally:
        for path, size in sizes.items():
            if os.path.exists(path) and os.path.getsize(path) > size:
                os.truncate(path, size)


if __name__ == "__main__":
    main()
