"""Faults in the training process: training always completes, one clear warning per cause, and
nothing recorded is lost (flushed at train end, on an exception or KeyboardInterrupt escaping
`fit`, at most `flush_secs` on SIGKILL).

Real parts only: MirroredStrategy on 2 logical CPUs (conftest), Keras `fit`, real event files
read back through TensorBoard's data provider; the full-disk and SIGKILL cases run a real
training subprocess (`reliability_child.py`). The README "Reliability" table counts the
scenarios here (`SCENARIOS`).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, mirrored, small_model

import tb_replica_plugin
from tb_replica_plugin import ReplicaCallback, ReplicaProbe, group
from tb_replica_plugin.core import nest
from tb_replica_plugin.families.inputs import record as inputs_collector

CHILD = os.path.join(REPO, "tests", "reliability_child.py")
NEVER = 3600.0  # flush_secs that keeps the background flush out of a test


def plugin_warnings(caught):
    return [str(w.message) for w in caught if "tb_replica_plugin" in str(w.message)]


def read_run(run_dir):
    """The one run of this plugin in `run_dir`'s parent log dir, read from disk now."""
    report = tb_replica_plugin.load(os.path.dirname(run_dir))
    return report.runs[os.path.basename(run_dir)].inputs


def xy(examples, features=3):
    x = np.arange(examples * features, dtype="float32").reshape(examples, features) / 100
    return x, np.zeros((examples, 1), "float32")


def fit(model, logdir, examples=16, batch=8, epochs=1, callbacks=(), flush_secs=NEVER, **kw):
    """Fits with a ReplicaCallback writing `logdir/replicas`; returns the callback and warnings."""
    callback = ReplicaCallback(logdir, flush_secs=flush_secs, **kw)
    x, y = xy(examples, model.inputs[0].shape[-1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(
            x,
            y,
            batch_size=batch,
            epochs=epochs,
            verbose=0,
            shuffle=False,
            callbacks=[*callbacks, callback],
        )
    return callback, plugin_warnings(caught)


# ----------------------------------------------------------- faults: training completes


def test_collector_raising_while_tracing_warns_once(tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("collector bug")

    monkeypatch.setattr(inputs_collector.InputsStats, "__init__", broken)
    model = small_model(mirrored(2), 3)
    _, caught = fit(model, str(tmp_path), examples=32, epochs=2)
    assert int(model.optimizer.iterations.numpy()) == 8
    # Once per family using the broken class: inputs, and the model outputs (watch family).
    assert len(caught) == 2 and "could not record inputs" in caught[0]
    assert "could not record watched values" in caught[1]
    assert all("RuntimeError: collector bug" in message for message in caught)


def test_batch_naming_raising_in_the_wrapped_step_warns_once(tmp_path, monkeypatch):
    def broken(data):
        raise TypeError("cannot name this batch")

    monkeypatch.setattr(nest, "name_fit_batch", broken)
    model = small_model(mirrored(2), 3)
    _, caught = fit(model, str(tmp_path), examples=32)
    assert int(model.optimizer.iterations.numpy()) == 4
    assert len(caught) == 1 and "cannot name this batch" in caught[0]


def test_log_dir_blocked_by_a_file_warns_once(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    model = small_model(mirrored(2), 3)
    _, caught = fit(model, str(blocker / "logs"), examples=32, epochs=2)
    assert int(model.optimizer.iterations.numpy()) == 8
    assert len(caught) == 1 and "cannot write summaries" in caught[0]


def test_log_dir_removed_while_training_warns_once_and_training_goes_on(tmp_path):
    run_dir = tmp_path / "replicas"

    class RemoveLogDir(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                shutil.rmtree(run_dir)

    model = small_model(mirrored(2), 3)
    callback, caught = fit(model, str(tmp_path), examples=32, epochs=3, callbacks=[RemoveLogDir()])
    assert int(model.optimizer.iterations.numpy()) == 12
    assert len(caught) == 1, caught
    assert "was removed or replaced while training" in caught[0]
    assert callback.probe.disabled_reason.startswith("the log dir")
    assert not run_dir.exists()  # recording stopped: nothing re-created behind the user's back


def test_full_disk_in_a_real_subprocess_warns_once_and_trains_every_step(tmp_path):
    # RLIMIT_FSIZE makes the kernel refuse writes past 16 KB (EFBIG), as a full disk would.
    result = subprocess.run(
        [sys.executable, CHILD, "fsize", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["iterations"] == 399  # 3 fits x 133 steps: every step trained
    assert len(outcome["warnings"]) == 1
    assert "File too large" in outcome["warnings"][0]
    assert outcome["file_sizes"] == [16 * 1024]
    assert outcome["disabled_reason"].startswith("could not write summaries")


def test_model_without_optimizer_and_custom_train_step_records(tmp_path):
    class NoOptimizer(keras.Model):
        def train_step(self, data):
            x, _ = data
            return {"mean": tf.reduce_mean(self(x))}

    strategy = mirrored(2)
    with strategy.scope():
        inputs = keras.Input((3,))
        model = NoOptimizer(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer=None)
    assert model.optimizer is None
    _, caught = fit(model, str(tmp_path), examples=24)
    assert caught == []
    series = read_run(str(tmp_path / "replicas"))
    assert series.batch_size.tolist() == [[4, 4]] * 3


def test_frozen_layers_and_mixed_precision_record_without_warnings(tmp_path):
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(4, trainable=False, dtype="mixed_float16"),
                keras.layers.Dense(1, dtype="float32"),
            ]
        )
        model.compile(optimizer="sgd", loss="mse")
    _, caught = fit(model, str(tmp_path), examples=16)
    assert caught == []
    assert read_run(str(tmp_path / "replicas")).batch_size.tolist() == [[4, 4]] * 2


def test_jit_compile_is_turned_off_with_one_warning(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    _, caught = fit(model, str(tmp_path), examples=16)
    assert len(caught) == 1 and "XLA" in caught[0]
    assert model.jit_compile is True  # restored after fit
    assert read_run(str(tmp_path / "replicas")).batch_size.tolist() == [[8], [8]]


def test_ragged_and_sparse_inputs_are_recorded_without_warnings(tmp_path):
    strategy = mirrored(2)
    probe = ReplicaProbe(str(tmp_path / "replicas"), strategy, update_freq=1, flush_secs=NEVER)
    ragged = tf.ragged.constant([[1, 2], [3], [4, 5, 6], [7]])
    sparse = tf.sparse.SparseTensor([[0, 1], [2, 0], [2, 3]], [1.0, 2.0, 3.0], [3, 4])
    seen = []

    @tf.function
    def step(ids, features):
        def step_fn(ids, features):
            probe.observe_inputs({"ids": ids, "features": features})
            return tf.reduce_sum(ids.flat_values)

        return strategy.run(step_fn, args=(ids, features))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            seen.append(strategy.reduce("SUM", step(ragged, sparse), axis=None).numpy())
        probe.close()
    assert seen == [56, 56, 56]  # the step ran every time (28 per replica)
    assert plugin_warnings(caught) == []
    series = group.read_log_dir(str(tmp_path))["replicas"].inputs
    # The same ragged batch on both replicas (passed to strategy.run as it is): 4 rows each.
    assert series.batch_size.tolist() == [[3, 3]] * 3  # features (sorted first): dense_shape[0]
    (event,) = series.shape_events
    features, ids = event["inputs"]
    assert ids["kinds"] == ["ragged", "ragged"] and ids["shapes"] == [[4, -1], [4, -1]]
    assert ids["structure"] == [[7, 1, 3], [7, 1, 3]]  # values, shortest, longest row
    assert features["kinds"] == ["sparse", "sparse"] and features["shapes"] == [[3, 4], [3, 4]]
    assert features["structure"] == [[3, -1, -1], [3, -1, -1]]  # nnz


def test_closed_probe_inside_a_traced_step_writes_nothing_and_fails_nothing(tmp_path):
    strategy = mirrored(2)
    probe = ReplicaProbe(str(tmp_path / "replicas"), strategy, update_freq=1)
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.range(40).batch(4))

    @tf.function
    def step(batch):
        def step_fn(x):
            probe.observe_inputs({"x": x})
            return tf.reduce_sum(x)

        return strategy.run(step_fn, args=(batch,))

    iterator = iter(dataset)
    for _ in range(3):
        step(next(iterator))
    probe.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in iterator:  # the traced step keeps its probe ops: gated off, no error
            step(batch)
    assert plugin_warnings(caught) == []
    series = read_run(str(tmp_path / "replicas"))
    assert series.steps.tolist() == [0, 1, 2]


# ------------------------------------------------------------------ nothing lost


def test_flushed_at_train_end_without_close(tmp_path):
    model = small_model(mirrored(2), 3)
    fit(model, str(tmp_path), examples=17, batch=8, epochs=2, update_freq=1)
    series = read_run(str(tmp_path / "replicas"))
    assert series.batch_size.tolist() == [[4, 4], [4, 4], [1, 0]] * 2
    assert series.dense_steps.tolist() == list(range(6))


def test_evaluate_and_predict_with_the_callback_begin_no_run_and_fit_then_does(tmp_path):
    # Keras calls the callback's set_model for evaluate/predict too: the probe is built, but a
    # run begins only with a fit, so a notebook that evaluated shows no phantom "running" run.
    model = small_model(mirrored(2), 3)
    x, y = xy(16)
    callback = ReplicaCallback(str(tmp_path), flush_secs=NEVER)
    model.evaluate(x, y, batch_size=8, verbose=0, callbacks=[callback])
    model.predict(x, batch_size=8, verbose=0, callbacks=[callback])
    callback._probe.flush()
    assert tb_replica_plugin.load(str(tmp_path)).runs == {}
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[callback])
    status = tb_replica_plugin.load(str(tmp_path)).runs["replicas"].status
    assert [e["type"] for e in status.events] == ["start", "end"]
    assert (status.start["source"], status.start["how"]) == ("fit", "fit")
    assert (status.end["state"], status.end["how"], status.end["step"]) == ("finished", "fit", 1)


def test_exception_escaping_fit_restores_the_model_and_flushes(tmp_path):
    # The 41st example is NaN: check_numerics fails in the input pipeline at step 5 or 6.
    x, y = xy(64)
    x[40, 0] = np.nan
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .map(lambda a, b: (tf.debugging.check_numerics(a, "bad example"), b))
        .batch(8)
    )
    model = small_model(mirrored(2), 3)
    callback = ReplicaCallback(str(tmp_path), flush_secs=NEVER)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bad example"):
        model.fit(dataset, epochs=1, verbose=0, callbacks=[callback])
    # Keras skipped on_train_end; the failing step restored the model and flushed.
    assert "train_step" not in model.__dict__
    assert "make_train_function" not in model.__dict__
    assert model.train_function is None
    # Every step before the failing one is on disk. Which ops of the failing step itself ran
    # (the optimizer's counter, the probe's state) depends on the replicas' threads.
    trained = int(model.optimizer.iterations.numpy())
    assert 5 <= trained < 8
    series = read_run(str(tmp_path / "replicas"))
    recorded = len(series.steps)
    assert trained - 1 <= recorded <= trained
    assert series.steps.tolist() == list(range(recorded))
    assert series.batch_size.tolist() == [[4, 4]] * recorded


def test_dataset_of_unknown_length_ends_epochs_without_unwrapping(tmp_path):
    # The train function signals the end of such a dataset with StopIteration at every epoch:
    # not a failure, the next epochs must still be recorded.
    x, y = xy(24)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(8)
    assert dataset.cardinality() == tf.data.UNKNOWN_CARDINALITY
    model = small_model(mirrored(2), 3)
    callback = ReplicaCallback(str(tmp_path), flush_secs=NEVER)
    model.fit(dataset, epochs=3, verbose=0, callbacks=[callback])
    assert "train_step" not in model.__dict__
    series = read_run(str(tmp_path / "replicas"))
    assert series.steps.tolist() == list(range(9))
    assert series.batch_size.tolist() == [[4, 4]] * 9


def test_keyboard_interrupt_in_a_step_restores_and_flushes(tmp_path):
    # A real SIGINT, sent from inside the third step: Python raises KeyboardInterrupt in the main
    # thread when the step returns, as for Ctrl-C during training.
    calls = []

    def interrupt():
        calls.append(1)
        if len(calls) == 2 * 3:  # 2 replicas call it once per step
            os.kill(os.getpid(), signal.SIGINT)
        return np.float32(0.0)

    class Interrupted(keras.Model):
        def train_step(self, data):
            tf.py_function(interrupt, [], tf.float32)
            return super().train_step(data)

    strategy = mirrored(2)
    with strategy.scope():
        inputs = keras.Input((3,))
        model = Interrupted(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="sgd", loss="mse")
    x, y = xy(80)
    callback = ReplicaCallback(str(tmp_path), update_freq=1, flush_secs=NEVER)
    assert threading.current_thread() is threading.main_thread()
    # Python's own handler, even when the test runner was started with SIGINT ignored (a
    # background job of a non-interactive shell, nohup): then SIGINT would do nothing here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "train_step" not in model.__dict__ and model.train_function is None
    series = read_run(str(tmp_path / "replicas"))
    assert series.dense_steps.tolist() == [0, 1, 2]
    assert series.batch_size.tolist() == [[4, 4]] * 3


def test_next_fit_after_another_callback_raised_runs_the_original_step(tmp_path):
    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("user callback failed")

    model = small_model(mirrored(2), 3)
    with pytest.raises(RuntimeError, match="user callback failed"):
        fit(model, str(tmp_path), examples=16, callbacks=[Boom()])
    # Keras skipped on_train_end and the step did not fail: the model is still instrumented...
    assert "train_step" in model.__dict__
    # ...until the next fit asks for its train function: the original comes back, flushed.
    x, y = xy(16)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert "train_step" not in model.__dict__ and "make_train_function" not in model.__dict__
    assert int(model.optimizer.iterations.numpy()) == 4
    series = read_run(str(tmp_path / "replicas"))
    assert series.steps.tolist() == [0, 1]  # the second fit recorded nothing


@pytest.mark.parametrize("after", ["evaluate", "predict"])
def test_evaluate_after_a_fit_that_stopped_without_returning_restores_the_model(tmp_path, after):
    """A callback raises between two steps, the script catches it, then evaluates (or predicts)
    with the same `ReplicaCallback`: the model comes back as it was and that fit's stretch is
    recorded as stopped, saying what came next. Fit's own validation keeps the instrumentation
    (the fit that validates records every step and ends finished)."""

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise ValueError("stop here")

    model = small_model(mirrored(2), 3)
    x, y = xy(64)
    callback = ReplicaCallback(str(tmp_path), flush_secs=NEVER)
    with pytest.raises(ValueError, match="stop here"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[callback, Boom()])
    assert "train_step" in model.__dict__  # on_train_end never ran
    if after == "evaluate":
        model.evaluate(x, y, batch_size=8, verbose=0, callbacks=[callback])
    else:
        model.predict(x, batch_size=8, verbose=0, callbacks=[callback])
    assert "train_step" not in model.__dict__ and "make_train_function" not in model.__dict__
    status = tb_replica_plugin.load(str(tmp_path)).runs["replicas"].status
    assert (status.end["state"], status.end["how"], status.end["step"]) == ("crashed", after, 2)
    assert status.end["exception"]["message"] == (
        "fit stopped at step 2 without returning (on_train_end never ran): an exception left "
        f"fit and the script caught it, then began {after} with the callback"
    )
    # A fit with validation (evaluate inside fit, fit's callbacks): instrumented to its end.
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback], validation_split=0.25)
    assert "train_step" not in model.__dict__
    series = read_run(str(tmp_path / "replicas"))
    assert series.steps.tolist() == list(range(3)) + list(range(3, 15))  # 6 steps per epoch
    status = tb_replica_plugin.load(str(tmp_path)).runs["replicas"].status
    assert (status.end["state"], status.end["how"], status.end["step"]) == ("finished", "fit", 14)


def test_background_flush_writes_without_close(tmp_path):
    strategy = mirrored(2)
    probe = ReplicaProbe(str(tmp_path / "replicas"), strategy, update_freq=1, flush_secs=0.2)
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.range(12).batch(4))
    for step, batch in enumerate(dataset):
        probe.observe_inputs(batch, step=step)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        run = tb_replica_plugin.load(str(tmp_path)).runs.get("replicas")
        series = run.inputs if run is not None else None
        if series is not None and series.dense_steps.tolist() == [0, 1, 2]:
            break
        time.sleep(0.1)
    assert series.dense_steps.tolist() == [0, 1, 2]
    assert series.batch_size.tolist() == [[2, 2]] * 3
    probe.close()


def test_sigkill_loses_at_most_the_flush_interval(tmp_path):
    from reliability_child import FLUSH_SECS

    child = subprocess.Popen(
        [sys.executable, CHILD, "kill", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    seen = []  # (monotonic time the parent read it, step)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            assert line, "the child stopped before it was killed"
            if line.startswith("step "):
                seen.append((time.monotonic(), int(line.split()[1])))
                if len(seen) >= 2 and seen[-1][0] - seen[0][0] > 4 * FLUSH_SECS + 1:
                    break
        killed_at = time.monotonic()
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    series = read_run(str(tmp_path / "replicas"))
    on_disk = int(series.dense_steps.max())
    # Every step done more than one flush interval (+ 0.5 s for the flush itself and the pipe)
    # before the kill is on disk, and nothing is invented.
    must_have = max(step for t, step in seen if t <= killed_at - FLUSH_SECS - 0.5)
    assert must_have <= on_disk <= seen[-1][1] + 5
    assert series.dense_steps.tolist() == list(range(on_disk + 1))
    assert series.batch_size[-1].tolist() == [2]


# ------------------------------------------------------------------------ bad data


@pytest.fixture(scope="module")
def bad_client(bad_logs):
    from bad_logs import wsgi_app
    from werkzeug.test import Client

    app, _ = wsgi_app(bad_logs)
    return Client(app)


def get_inputs(client, run):
    response = client.get("/data/plugin/replicas/inputs", query_string={"run": run})
    assert response.status_code == 200, response.data[:300]
    return json.loads(response.data)


def test_corrupt_and_truncated_event_files_serve_what_is_readable(bad_client):
    from bad_logs import CORRUPT_STEPS

    good = get_inputs(bad_client, "good/replicas")
    assert good["steps"] == list(range(CORRUPT_STEPS + 1))
    assert good["batch_size"] == [[2, 2]] * CORRUPT_STEPS + [[1, 0]]
    truncated = get_inputs(bad_client, "truncated/replicas")
    count = len(truncated["steps"])
    # Everything before the cut is served as written.
    assert count >= 10, count
    assert truncated["steps"] == good["steps"][:count]
    assert truncated["batch_size"] == good["batch_size"][:count]
    # The corrupted records half-way through fail their CRC: skipped (TensorBoard's loaders stop
    # there), the rest of the file read on; no value of theirs is served.
    corrupt = get_inputs(bad_client, "corrupt/replicas")
    assert corrupt["steps"] == good["steps"]
    assert corrupt["batch_size"] == good["batch_size"]


def test_newer_schema_is_skipped_with_a_note(bad_client):
    from bad_logs import NOTE_NEWER

    body = get_inputs(bad_client, "newer_schema/replicas")
    assert any(note.startswith(NOTE_NEWER) for note in body["notes"])
    assert "upgrade tb_replica_plugin" in " ".join(body["notes"])
    assert body["shape_events"] == []
    assert (body["steps"], body["batch_size"]) == ([0, 1, 2], [[4, 4]] * 3)  # dense series only


def test_unreadable_payloads_are_skipped_with_notes(bad_client):
    from bad_logs import NOTE_LAYOUT, NOTE_PAYLOAD

    body = get_inputs(bad_client, "bad_payload/replicas")
    assert NOTE_PAYLOAD in body["notes"] and NOTE_LAYOUT in body["notes"]
    assert [e["step"] for e in body["shape_events"]] == [0]
    assert body["batch_size"] == [[4, 4]] * 3


def test_replica_count_change_keeps_the_larger_count_with_a_note(bad_client):
    from bad_logs import NOTE_REPLICAS

    body = get_inputs(bad_client, "replica_change/replicas")
    assert any(note.startswith(NOTE_REPLICAS) for note in body["notes"])
    assert body["replicas"] == [0, 1, 2]
    assert (body["steps"], body["batch_size"]) == ([3, 4], [[3, 3, 2]] * 2)
    runs = json.loads(bad_client.get("/data/plugin/replicas/runs").data)["runs"]
    notes = {r["run"]: r["notes"] for r in runs}
    assert notes["replica_change/replicas"] == body["notes"]
    assert notes["good/replicas"] == []


# ----------------------------------------------------------------- concurrent use


def test_routes_polled_while_a_probe_trains_and_flushes(tmp_path):
    """TensorBoard reading (reload + routes, another thread) while a custom loop writes."""
    from bad_logs import wsgi_app
    from werkzeug.test import Client

    strategy = mirrored(2)
    run_dir = str(tmp_path / "live" / "replicas")
    probe = ReplicaProbe(run_dir, strategy, update_freq=1, flush_secs=0.2)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.range(8 * 400).batch(8).repeat()
    )

    @tf.function
    def step(batch):
        def step_fn(x):
            probe.observe_inputs({"x": x})
            return tf.reduce_sum(x)

        return strategy.run(step_fn, args=(batch,))

    iterator = iter(dataset)
    step(next(iterator))
    probe.flush()
    app, multiplexer = wsgi_app(str(tmp_path))
    client = Client(app)
    done = threading.Event()
    seen, failures = [], []

    def poll():
        while not done.is_set() or not seen:
            multiplexer.Reload()
            for path, query in (
                ("/runs", {}),
                ("/inputs", {"run": "live/replicas"}),
                ("/findings", {"run": "live/replicas"}),
            ):
                response = client.get("/data/plugin/replicas" + path, query_string=query)
                if response.status_code != 200:
                    failures.append((path, response.status_code, response.data[:200]))
                elif path == "/inputs":
                    seen.append(len(json.loads(response.data)["steps"]))

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for _ in range(150):
            step(next(iterator))
            time.sleep(0.005)
    finally:
        done.set()
        poller.join(timeout=60)
    probe.close()
    multiplexer.Reload()
    final = json.loads(
        client.get("/data/plugin/replicas/inputs", query_string={"run": "live/replicas"}).data
    )
    assert failures == []
    assert len(seen) >= 3
    assert seen == sorted(seen), "the served steps never shrink"
    assert seen[0] < 151 and len(final["steps"]) == 151 > seen[0]
    assert final["batch_size"] == [[4, 4]] * 151
