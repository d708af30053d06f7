"""A real MultiWorkerMirroredStrategy job on localhost: 2 worker processes with `TF_CONFIG`.

`python -m demo.multiworker LOGDIR [--workers 2] [--timeout 300]` picks free ports, starts one
process per worker (`python -m demo.multiworker LOGDIR --worker I`, with `TF_CONFIG` in its
environment), waits for all of them with a bounded timeout and always stops them. Each worker
runs every scenario of `SCENARIOS` in sequence (one strategy per process) and its probe writes
its own run, `LOGDIR/<scenario>/replicas/worker_<i>`; the tab shows the workers of a scenario as
one job. The public MultiWorkerMirroredStrategy gives each worker one CPU device, so 2 workers
are 2 global replicas.

- `mw_clean`: custom loop with `ReplicaProbe`, 64 examples, global batch 8 → [4, 4] on every
  step, the workers in step: no findings.
- `mw_straggler`: the same, but worker 1 sleeps `STRAGGLER_SLEEP` seconds on the host before
  each step (as a slow input pipeline or a busy host would): worker 1 is reported as the
  straggler. Its step function is a `probe.step()` block (each replica's ready time; the
  other custom loops call the families without one).
- `mw_uneven_shard`: each worker builds its own input pipeline
  (`distribute_datasets_from_function`) and worker 1 batches 3 examples instead of 4: global
  replica 1, on worker 1, gets fewer examples at every step.
- `mw_unsharded`: each worker builds its own input pipeline (`distribute_datasets_from_function`)
  but its `dataset_fn` ignores the input context (no `shard`): both workers are fed the same 4
  examples at every step, seen from the example sketches each worker writes.
- `mw_fit_tf_keras`: tf_keras (`TF_USE_LEGACY_KERAS=1`) `model.fit` with `ReplicaCallback`, 64
  examples, global batch 8, 2 epochs → [4, 4] at each of 16 steps. The model adds input noise
  drawn from a `tf.random.Generator` created under the scope (observed through the callback's
  `generators`): one stream per global replica.
- `mw_drift`: like `mw_clean`, but after each update worker 1 adds `PERTURBATION` to its own
  copy of the kernel (as a corrupted all-reduce result on one worker would): cross-worker weight
  drift on worker 1's replica only, seen from the fingerprints each worker writes.

Not in `SCENARIOS` (run on its own by tests/test_multiworker.py):

- `mw_halt`: tf_keras `fit` with `ReplicaCallback(halt_on="error")`; worker 1's data holds one
  NaN example at step 5. The fault flag is all-reduced in the step, so both workers stop after
  step 5; each writes what stopped it to `LOGDIR/mw_halt/stopped_worker_<i>.json`.
- `mw_stall` (custom loop) and `mw_fit_stall` (tf_keras `fit`): worker 1 stops before step
  `STALL_STEP` (it waits in `wait_for_a_lock` for `$TB_REPLICA_DEMO_STALL_SECONDS`, default 20),
  then exits without any cleanup (`os._exit`, as a process the OOM killer ends); worker 0 enters
  that step and waits in its all-reduce until TensorFlow's coordination service gives up on
  worker 1 and raises `UnavailableError`. Their probes heartbeat every second and write every
  thread's stack after 5 s without progress. Both workers exit with an error (launched with
  `allow_failure=True`). The demo runs `mw_stall`; tests/test_status_jobs.py runs both, reads
  them while they hang, and kills worker 1 itself.
- `mw_interrupt` (custom loop): worker 1 sends itself SIGINT before step `STALL_STEP` (Ctrl-C:
  `os.kill(os.getpid(), SIGINT)`, its KeyboardInterrupt not caught), so its process ends
  "interrupted"; worker 0 waits inside that step at the all-reduce until TensorFlow's
  coordination service gives up on worker 1 (`UnavailableError`). tests/test_status_jobs.py
  runs it: the job's root cause is worker 1's interruption.
- `mw_halt_loop`: the same fault in a custom loop with `ReplicaProbe(halt_on="error")` that
  calls `observe_gradients` in cross-replica context, on what `strategy.run` returned, and
  `probe.faults()` after each step (`LOGDIR/mw_halt_loop/stopped_worker_<i>.json`).
- `mw_halt_overflow`: tf_keras `fit` under `mixed_float16` with a `LossScaleOptimizer` whose
  initial scale (2**40) overflows the float16 gradients at every step (expected, not a
  stopping fault), and `ReplicaCallback(halt_on="error", update_freq=1)`; a second model
  output without a loss passes input column 4 through, NaN at step 0 on both workers: a
  `nonfinite_values` error every worker sees at its step-0 check
  (`LOGDIR/mw_halt_overflow/stopped_worker_<i>.json`).

Every custom-loop scenario records, at every step, each replica's example fingerprints
(`observe_examples`), its local gradients before the all-reduce (`observe_gradients`) and every
variable's per-copy fingerprints after the update (`observe_variables`), so the clean jobs show
no duplicated examples and 0 cross-worker drift.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SCENARIOS = (
    "mw_clean",
    "mw_straggler",
    "mw_uneven_shard",
    "mw_unsharded",
    "mw_drift",
    "mw_fit_tf_keras",
)
HALT_SCENARIOS = ("mw_halt", "mw_halt_loop", "mw_halt_overflow")
# Each ends its job with an error, on purpose.
STALL_SCENARIOS = ("mw_stall", "mw_fit_stall", "mw_interrupt")
EXTRA_SCENARIOS = HALT_SCENARIOS + STALL_SCENARIOS
# `mw_stall`, `mw_fit_stall`: worker 1 stops before this step, for this long (seconds), then dies.
STALL_STEP = 5
STALL_SECONDS_ENV = "TB_REPLICA_DEMO_STALL_SECONDS"
DEFAULT_STALL_SECONDS = 20.0
# Their probes: a heartbeat every second, the stacks after 5 s without progress.
STALL_PROBE = {"flush_secs": 1.0, "stall_secs": 5.0}
# The step and local example of worker 1's NaN in `mw_halt` (global batch 8, 4 per worker).
HALT_STEP = 5
HALT_EXAMPLE = 1
# The workers run with `tf.keras` = tf_keras (Keras 2): Keras 3 `fit` cannot run under
# MultiWorkerMirroredStrategy, tf_keras `fit` can. The custom loops import Keras 3 directly.
WORKER_ENV = {"TF_USE_LEGACY_KERAS": "1"}
STRAGGLER_SLEEP = 0.4
# Added by the perturbed worker of `mw_drift` to each of its kernel's copies after every update.
PERTURBATION = 1e-3
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------- launcher


def free_ports(count):
    """`count` distinct free localhost ports (bound together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def stop_worker(process):
    """Ends a worker process started here (SIGTERM, then SIGKILL after 10 s) and reaps it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def start_workers(logdir, scenarios, logs, env=None):
    """Starts one worker process per log file of `logs` (free localhost ports, `TF_CONFIG`).

    Args:
      logdir: the log dir every worker writes to.
      scenarios: scenario names each worker runs, in order.
      logs: one open file per worker, for its stdout and stderr.
      env: extra environment variables for the workers (default `WORKER_ENV`).

    Returns:
      The `subprocess.Popen` of each worker; the caller stops them (`stop_worker`).
    """
    ports = free_ports(len(logs))
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    for index, log in enumerate(logs):
        worker_env = dict(os.environ, **(WORKER_ENV if env is None else env))
        worker_env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}
        )
        worker_env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        worker_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (REPO, worker_env.get("PYTHONPATH")) if p
        )
        command = [sys.executable, "-m", "demo.multiworker", os.fspath(logdir)]
        command += ["--worker", str(index), "--scenarios", ",".join(scenarios)]
        processes.append(
            subprocess.Popen(
                command, cwd=REPO, env=worker_env, stdout=log, stderr=subprocess.STDOUT
            )
        )
    return processes


def launch(logdir, num_workers=2, timeout=300, scenarios=SCENARIOS, env=None, allow_failure=False):
    """Runs a `num_workers`-worker job on localhost and waits for it.

    Args:
      logdir: the log dir every worker writes to (one run per worker and scenario).
      num_workers: worker processes to start.
      timeout: seconds the whole job may take; then every worker is killed.
      scenarios: scenario names to run, in order.
      env: extra environment variables for the workers (default `WORKER_ENV`).
      allow_failure: wait for every worker to exit even when some fail (`mw_stall`): only a
        timeout raises.

    Returns:
      The seconds the job took.

    Raises:
      RuntimeError: if a worker fails (unless `allow_failure`) or the job times out (with the
        tail of each worker's log and `pids`, the worker processes, all stopped and reaped by
        then).
    """
    processes, logs = [], []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tb_replica_mw_") as log_root:
        try:
            for index in range(num_workers):
                log = open(os.path.join(log_root, f"worker_{index}.log"), "w+")  # noqa: SIM115
                logs.append(log)
            processes.extend(start_workers(logdir, scenarios, logs, env))
            deadline = start + timeout
            failed = None
            while any(p.poll() is None for p in processes):
                if time.monotonic() > deadline:
                    failed = f"timed out after {timeout}s"
                    break
                if not allow_failure and any(p.poll() not in (None, 0) for p in processes):
                    failed = "a worker failed"
                    break
                time.sleep(0.2)
            codes = [p.poll() for p in processes]
            if failed is None and not allow_failure and any(code != 0 for code in codes):
                failed = "a worker failed"
            if failed:
                tails = []
                for index, log in enumerate(logs):
                    log.flush()
                    log.seek(0)
                    tails.append(f"--- worker {index} (exit {codes[index]}):\n{log.read()[-3000:]}")
                error = RuntimeError(f"multi-worker job {failed}\n" + "\n".join(tails))
                error.pids = [p.pid for p in processes]
                raise error
        finally:
            for process in processes:
                stop_worker(process)
            for log in logs:
                log.close()
    return time.monotonic() - start


# ------------------------------------------------------------------------------------ worker


def _data(count, features=4):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(count, features)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) * 0.1).astype("float32")


def custom_loop(
    strategy,
    run_dir,
    dataset,
    global_batch,
    epochs=1,
    before_step=None,
    after_step=None,
    probe_options=None,
    step_scope=False,
):
    """A custom training loop under `strategy` with a `ReplicaProbe` writing `run_dir`.

    Inputs, example fingerprints and local gradients are observed in the step; every
    variable's copies after each update.
    `before_step()` runs on the host before each step, `after_step(model)` after each update;
    `probe_options` are more arguments of the probe. With `step_scope`, the step function's
    calls are one `with probe.step():` block (one transfer per replica and each replica's
    ready time, as README's custom loop); without, each family's next call begins a step.
    """
    import keras
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    probe = ReplicaProbe(run_dir, strategy, update_freq=1, **(probe_options or {}))

    @tf.function
    def train_step(batch):
        def step_fn(features, labels):
            if not step_scope:
                return observed_step(features, labels)
            with probe.step():
                return observed_step(features, labels)

        def observed_step(features, labels):
            probe.observe_inputs({"x": features, "y": labels})
            probe.observe_examples({"x": features, "y": labels})
            with tf.GradientTape() as tape:
                error = model(features) - labels
                loss = tf.reduce_sum(error * error) / global_batch
            grads = tape.gradient(loss, model.trainable_variables)
            # The loss is a share of the global batch's: scale 1/R records each replica's own.
            probe.observe_gradients(
                grads, model.trainable_variables, loss=loss, scale=1 / strategy.num_replicas_in_sync
            )
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.run(step_fn, args=batch)

    for _ in range(epochs):
        for batch in dataset:
            if before_step is not None:
                before_step()
            train_step(batch)
            if after_step is not None:
                after_step(model)
            probe.observe_variables(model.variables + optimizer.variables)
    probe.close()
    return probe


def fit_tf_keras(strategy, run_dir, x, y, epochs=2):
    """tf_keras (Keras 2) `fit` with `ReplicaCallback` (needs `TF_USE_LEGACY_KERAS=1`).

    Keras 3 `fit` cannot run under MultiWorkerMirroredStrategy (it fails inside Keras before
    training); tf_keras `fit` can.
    """
    import tensorflow as tf
    import tf_keras

    from tb_replica_plugin import ReplicaCallback

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    with strategy.scope():
        # Created under the scope: TensorFlow folds the global replica id into its key, so
        # every replica of the job draws its own noise.
        noise = tf.random.Generator.from_seed(7)
        model = tf_keras.Sequential(
            [
                tf_keras.Input((4,)),
                tf_keras.layers.Lambda(lambda t: t + 0.01 * noise.normal(tf.shape(t))),
                tf_keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=tf_keras.optimizers.SGD(0.01), loss="mse")
    # ReplicaCallback(log_dir, run_name): each worker writes run_dir/worker_<i>.
    callback = ReplicaCallback(
        os.path.dirname(run_dir),
        os.path.basename(run_dir),
        update_freq=1,
        generators={"noise": noise},
    )
    model.fit(dataset, epochs=epochs, verbose=0, callbacks=[callback])


def fit_halt(strategy, logdir, x, y):
    """`mw_halt`: tf_keras `fit` with `halt_on="error"`, a NaN in worker 1's batch at step 5."""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from tb_replica_plugin import ReplicaCallback

    task = strategy.cluster_resolver.task_id
    x = x.copy()
    if task == 1:
        # Every worker reads its own copy of the data (`_unsharded`): only worker 1's holds it.
        x[HALT_STEP * 4 + HALT_EXAMPLE, 2] = np.nan
    dataset = _unsharded(tf, x, y)
    with strategy.scope():
        model = tf_keras.Sequential(
            [
                tf_keras.Input((4,)),
                tf_keras.layers.Dense(4, activation="relu"),
                tf_keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=tf_keras.optimizers.SGD(0.01), loss="mse")
    callback = ReplicaCallback(os.path.join(logdir, "mw_halt"), update_freq=1, halt_on="error")
    start = time.monotonic()
    model.fit(dataset, epochs=1, verbose=0, callbacks=[callback])
    result = {
        "iterations": int(model.optimizer.iterations.numpy()),
        "seconds": time.monotonic() - start,
        "stopped_by": [
            {"kind": f.kind, "replicas": f.replicas, "first_step": f.first_step}
            for f in callback.stopped_by
        ],
    }
    with open(os.path.join(logdir, "mw_halt", f"stopped_worker_{task}.json"), "w") as out:
        json.dump(result, out)


def wait_for_a_lock(seconds):
    """Where worker 1 of `mw_stall` stops: a wait its stack shows (then it dies)."""
    threading.Event().wait(seconds)
    os._exit(3)  # no cleanup, as a process ended by the OOM killer


def stall_seconds():
    """How long worker 1 of the stall scenarios waits before it dies (`STALL_SECONDS_ENV`)."""
    return float(os.environ.get(STALL_SECONDS_ENV, DEFAULT_STALL_SECONDS))


def stall_before(step):
    """`before_step` of worker 1 of `mw_stall`: stops before step `step` (counted here)."""
    counter = iter(range(1 << 30))

    def before_step():
        if next(counter) == step:
            wait_for_a_lock(stall_seconds())

    return before_step


def interrupt_before(step):
    """`before_step` of worker 1 of `mw_interrupt`: Ctrl-C to its own process before `step`."""
    counter = iter(range(1 << 30))

    def before_step():
        if next(counter) == step:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5.0)  # the KeyboardInterrupt is raised here, at the next bytecode

    return before_step


def fit_stall(strategy, run_dir, x, y):
    """`mw_fit_stall`: tf_keras `fit` whose worker 1 stops before step `STALL_STEP`."""
    import tensorflow as tf
    import tf_keras

    from tb_replica_plugin import ReplicaCallback

    class StopBeforeStep(tf_keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == STALL_STEP:
                wait_for_a_lock(stall_seconds())

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(1)])
        model.compile(optimizer=tf_keras.optimizers.SGD(0.01), loss="mse")
    callbacks = [
        ReplicaCallback(
            os.path.dirname(run_dir), os.path.basename(run_dir), update_freq=1, **STALL_PROBE
        )
    ]
    if strategy.cluster_resolver.task_id == 1:
        callbacks.append(StopBeforeStep())
    model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks)


def _unsharded(tf, x, y, global_batch=8):
    """`(x, y)` in global batches, auto-sharding off: every worker reads its own copy of the
    data, rebatched to its local batch of 4, so its step s is rows 4s..4s+3."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).with_options(options)


def _write_stopped(logdir, scenario, task, steps, found):
    """Writes `LOGDIR/<scenario>/stopped_worker_<task>.json`: steps run and the findings."""
    result = {
        "steps": steps,
        "stopped_by": [
            {"kind": f.kind, "replicas": f.replicas, "first_step": f.first_step} for f in found
        ],
    }
    with open(os.path.join(logdir, scenario, f"stopped_worker_{task}.json"), "w") as out:
        json.dump(result, out)


def loop_halt(strategy, logdir, x, y):
    """`mw_halt_loop`: `observe_gradients` in cross-replica context with `halt_on="error"`, a
    NaN in worker 1's batch at step 5; `probe.faults()` after each step."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    task = strategy.cluster_resolver.task_id
    x = x.copy()
    if task == 1:
        x[HALT_STEP * 4 + HALT_EXAMPLE, 2] = np.nan
    dataset = strategy.experimental_distribute_dataset(_unsharded(tf, x, y))
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    run_dir = os.path.join(logdir, "mw_halt_loop", "replicas")
    probe = ReplicaProbe(run_dir, strategy, update_freq=1, halt_on="error")

    @tf.function
    def train_step(batch):
        def step_fn(features, labels):
            probe.observe_inputs({"x": features, "y": labels})  # the job is known by its inputs
            with tf.GradientTape() as tape:
                error = model(features) - labels
                loss = tf.reduce_sum(error * error) / 8
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return grads, loss

        grads, loss = strategy.run(step_fn, args=batch)
        # Cross-replica context, on what `strategy.run` returned (plain tensors with one
        # device per worker, PerReplica values with more) and the PerReplica batch.
        probe.observe_gradients(grads, model.trainable_variables, loss=loss, batch=batch)

    steps, found = 0, []
    for batch in dataset:
        train_step(batch)
        steps += 1
        found = probe.faults()
        if found:
            break
    probe.close()
    _write_stopped(logdir, "mw_halt_loop", task, steps, found)


def fit_halt_overflow(strategy, logdir, x, y):
    """`mw_halt_overflow`: loss-scale overflows at every step and, at step 0, a NaN in an output
    without a loss on both workers (`nonfinite_values`, a check-time error)."""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from tb_replica_plugin import ReplicaCallback

    task = strategy.cluster_resolver.task_id
    x = np.concatenate([x, np.zeros((len(x), 1), "float32")], axis=1)
    x[:4, 4] = np.nan  # step 0 of every worker
    previous = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            inputs = tf_keras.Input((5,))
            hidden = tf_keras.layers.Dense(4)(tf_keras.layers.Lambda(lambda t: t[:, :4])(inputs))
            fitted = tf_keras.layers.Dense(1, dtype="float32", name="fitted")(hidden)
            passed = tf_keras.layers.Lambda(lambda t: t[:, 4:], dtype="float32", name="passed")(
                inputs
            )
            model = tf_keras.Model(inputs, {"fitted": fitted, "passed": passed})
            optimizer = tf_keras.mixed_precision.LossScaleOptimizer(
                tf_keras.optimizers.SGD(0.01), initial_scale=2.0**40
            )
            model.compile(optimizer=optimizer, loss={"fitted": "mse"})
        callback = ReplicaCallback(
            os.path.join(logdir, "mw_halt_overflow"), update_freq=1, halt_on="error"
        )
        model.fit(_unsharded(tf, x, {"fitted": y}), epochs=1, verbose=0, callbacks=[callback])
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)
    steps = callback.probe.next_step() if callback.probe is not None else None
    _write_stopped(logdir, "mw_halt_overflow", task, steps, callback.stopped_by)


def run_scenario(name, logdir, strategy):
    """Runs one scenario on this worker (every worker runs the same scenarios in order)."""
    run_dir = os.path.join(logdir, name, "replicas")
    x, y = _data(64)
    loops = {"mw_clean", "mw_straggler", "mw_drift", "mw_stall", "mw_interrupt"}
    loops |= {"mw_uneven_shard", "mw_unsharded"}
    fits = {
        "mw_fit_tf_keras": lambda: fit_tf_keras(strategy, run_dir, x, y),
        "mw_halt": lambda: fit_halt(strategy, logdir, x, y),
        "mw_fit_stall": lambda: fit_stall(strategy, run_dir, x, y),
        "mw_halt_loop": lambda: loop_halt(strategy, logdir, x, y),
        "mw_halt_overflow": lambda: fit_halt_overflow(strategy, logdir, x, y),
    }
    if name in loops:
        _loop_scenario(name, strategy, run_dir, x, y)
    elif name in fits:
        fits[name]()
    else:
        raise ValueError(
            f"unknown scenario {name!r}; expected one of {SCENARIOS + EXTRA_SCENARIOS}"
        )


def _loop_scenario(name, strategy, run_dir, x, y):
    """The custom-loop scenarios: `custom_loop` on this worker's pipeline, with its fault."""
    task = strategy.cluster_resolver.task_id
    if name == "mw_uneven_shard":
        dataset = _uneven_shards(strategy, x, y)
    elif name == "mw_unsharded":
        dataset = _unsharded_pipelines(strategy, x, y)
    else:
        dataset = _global_batches(strategy, x, y)
    options = {}
    if name == "mw_straggler":
        options["step_scope"] = True  # the other loops call the families without one
        if task == 1:
            options["before_step"] = lambda: time.sleep(STRAGGLER_SLEEP)
    elif name == "mw_drift" and task == 1:
        options["after_step"] = _perturb
    elif name == "mw_stall":
        options["probe_options"] = STALL_PROBE
        if task == 1:
            options["before_step"] = stall_before(STALL_STEP)
    elif name == "mw_interrupt":
        options["probe_options"] = STALL_PROBE
        if task == 1:
            options["before_step"] = interrupt_before(STALL_STEP)
    custom_loop(strategy, run_dir, dataset, 8, **options)


def _perturb(model):
    """`mw_drift`'s worker 1: `PERTURBATION` added to its own copies of the kernel."""
    import tensorflow as tf

    kernel = model.trainable_variables[0]
    for copy in kernel.value.values:  # this worker's own copies only
        copy.assign_add(tf.fill(copy.shape, PERTURBATION))


def _global_batches(strategy, x, y):
    """`(x, y)` in global batches of 8, distributed (auto-sharded) by `strategy`."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    return strategy.experimental_distribute_dataset(dataset)


def _uneven_shards(strategy, x, y):
    """Each worker's own sharded pipeline; worker 1's is misconfigured: 3 examples per step
    instead of 4."""
    import tensorflow as tf

    def dataset_fn(context):
        per_replica = 3 if context.input_pipeline_id == 1 else 4
        shard = tf.data.Dataset.from_tensor_slices((x, y)).shard(
            context.num_input_pipelines, context.input_pipeline_id
        )
        return shard.batch(per_replica).take(4)

    return strategy.distribute_datasets_from_function(dataset_fn)


def _unsharded_pipelines(strategy, x, y):
    """Each worker's own pipeline, the bug: the input context ignored (no shard), so every
    worker reads the same data."""
    import tensorflow as tf

    def dataset_fn(context):
        del context
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(4).take(4)

    return strategy.distribute_datasets_from_function(dataset_fn)


def worker_main(logdir, scenarios):
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    for name in scenarios:
        start = time.perf_counter()
        run_scenario(name, logdir, strategy)
        print(f"worker: {name} done in {time.perf_counter() - start:.1f}s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--worker", type=int, default=None, help="(internal) run as this worker")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    if args.worker is not None:
        worker_main(args.logdir, scenarios)
        return
    seconds = launch(args.logdir, args.workers, args.timeout, scenarios)
    print(f"multi-worker demo: {args.workers} workers done in {seconds:.1f}s", flush=True)


if __name__ == "__main__":
    main()
