"""Collection end to end in-process: real MirroredStrategy on logical CPUs, real Keras fit,
summaries read back through TensorBoard's data provider (`tb_replica_plugin.load`)."""

import json
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored, small_model

import tb_replica_plugin
from tb_replica_plugin import ReplicaCallback, ReplicaProbe


def only_run(logdir):
    report = tb_replica_plugin.load(logdir)
    assert len(report.runs) == 1, list(report.runs)
    (name,) = report.runs
    return report.runs[name].inputs, report.findings[name]


def test_fit_17_examples_batch_8_on_2_replicas(unit_logs):
    series, findings = only_run(os.path.join(unit_logs, "fit_17_8"))
    assert series.steps.tolist() == [0, 1, 2]
    assert series.batch_size.tolist() == [[4, 4], [4, 4], [1, 0]]
    assert series.source == "fit"
    assert series.replicas == [0, 1]
    assert series.devices == [
        "/job:localhost/replica:0/task:0/device:CPU:0",
        "/job:localhost/replica:0/task:0/device:CPU:1",
    ]
    first = series.shape_events[0]["inputs"]
    assert [(i["name"], i["dtypes"], i["shapes"]) for i in first] == [
        ("x", ["float32", "float32"], [[4, 3], [4, 3]]),
        ("y", ["float32", "float32"], [[4, 1], [4, 1]]),
    ]
    assert [(f.kind, f.replicas, f.first_step, f.count) for f in findings] == [
        ("empty_shard", [1], 2, 1)
    ]


def test_custom_loop_15_examples_batch_7(unit_logs):
    series, findings = only_run(os.path.join(unit_logs, "loop_15_7"))
    assert series.batch_size.tolist() == [[4, 3], [4, 3], [1, 0]]
    assert series.source == "custom_loop"
    assert [i["name"] for i in series.shape_events[0]["inputs"]] == ["x", "y"]
    assert series.shape_events[0]["inputs"][1]["dtypes"] == ["int64", "int64"]
    kinds = [f.kind for f in findings]
    assert kinds == ["first_batch_uneven", "uneven_batch", "empty_shard"]
    uneven = findings[1]
    assert (uneven.first_step, uneven.last_step, uneven.count, uneven.replicas) == (0, 1, 2, [1])
    assert "replica 1 got 3 examples, replica 0 got 4" in uneven.message.lower()
    assert "global batch 7 is not divisible by 2 replicas" in uneven.message


def test_inspector_explains_why_fit_would_fail(unit_logs):
    series, findings = only_run(os.path.join(unit_logs, "inspect_7"))
    assert series.source == "inspect_dataset"
    assert series.batch_size.tolist() == [[4, 3], [4, 3], [1, 0]]
    first = findings[0]
    assert first.kind == "first_batch_uneven" and first.severity == "error"
    assert "model.fit fails" in first.message
    assert "AddN" in first.message
    assert "multiple of 2" in first.message and "drop_remainder=True" in first.message


def test_inspector_returns_batch_sizes_and_findings(tmp_path):
    result = tb_replica_plugin.inspect_dataset(
        mirrored(2), tf.data.Dataset.range(15).batch(7), str(tmp_path), steps=2
    )
    assert result.batch_sizes == [[4, 3], [4, 3]]
    assert result.findings[0].kind == "first_batch_uneven"
    with pytest.raises(ValueError, match="steps"):
        tb_replica_plugin.inspect_dataset(mirrored(2), tf.data.Dataset.range(3), tmp_path, 0)


def test_dict_inputs_with_different_shapes_are_flagged(unit_logs):
    series, findings = only_run(os.path.join(unit_logs, "dict_mismatch"))
    event = series.shape_events[0]
    by_name = {i["name"]: i for i in event["inputs"]}
    assert by_name["features"]["shapes"] == [[3, 4], [3, 5]]
    assert by_name["features"]["mismatch"] is True
    assert by_name["features"]["mismatch_dims"] == [1]
    assert by_name["ids"]["mismatch"] is False
    assert [(f.kind, f.name, f.replicas, f.count) for f in findings] == [
        ("shape_mismatch", "features", [0], 2)
    ] or [(f.kind, f.name, f.count) for f in findings] == [("shape_mismatch", "features", 2)]
    assert "strategy.gather would fail" in findings[0].message


def _fit(strategy, logdir, examples=16, batch=8, epochs=1, **fit_kwargs):
    x = np.random.default_rng(0).normal(size=(examples, 3)).astype("float32")
    y = np.zeros((examples, 1), "float32")
    callback = fit_kwargs.pop("callback", None) or ReplicaCallback(logdir)
    model = fit_kwargs.pop("model", None) or small_model(strategy, 3)
    model.fit(
        x,
        y,
        batch_size=batch,
        epochs=epochs,
        verbose=0,
        shuffle=False,
        callbacks=[*fit_kwargs.pop("callbacks", []), callback],
        **fit_kwargs,
    )
    return model, callback


def test_default_strategy_one_replica(tmp_path):
    _fit(tf.distribute.get_strategy(), str(tmp_path), examples=20, batch=8)
    series, _ = only_run(str(tmp_path))
    assert series.batch_size.tolist() == [[8], [8], [4]]
    assert series.replicas == [0]
    assert series.devices[0].endswith("device:CPU:0")


def test_one_device_strategy(tmp_path):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:1")
    _fit(strategy, str(tmp_path), examples=12, batch=8)
    series, _ = only_run(str(tmp_path))
    assert series.batch_size.tolist() == [[8], [4]]
    assert series.devices == ["/job:localhost/replica:0/task:0/device:CPU:1"]


def test_steps_per_execution_under_default_strategy_records_every_step(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
    _fit(None, str(tmp_path), examples=20, batch=4, model=model)
    series, _ = only_run(str(tmp_path))
    assert series.steps.tolist() == [0, 1, 2, 3, 4]
    assert series.batch_size.tolist() == [[4]] * 5


def test_validation_data_and_keras_tensorboard_in_same_log_dir(tmp_path):
    logdir = str(tmp_path)
    x_val = np.zeros((6, 3), "float32")
    y_val = np.zeros((6, 1), "float32")
    _fit(
        mirrored(2),
        logdir,
        examples=24,
        batch=8,
        epochs=2,
        validation_data=(x_val, y_val),
        callbacks=[keras.callbacks.TensorBoard(logdir, update_freq=1)],
    )
    assert {"train", "validation", "replicas"} <= set(os.listdir(logdir))
    series, findings = only_run(logdir)
    assert series.steps.tolist() == list(range(6))
    assert series.batch_size.tolist() == [[4, 4]] * 6
    assert findings == []


def test_update_freq_every_n_steps_keeps_window_extremes(tmp_path):
    # 3 epochs of 17 examples in batches of 8: the odd [1, 0] batch lands at steps 2, 5, 8.
    _fit(
        mirrored(2),
        str(tmp_path),
        examples=17,
        batch=8,
        epochs=3,
        callback=ReplicaCallback(str(tmp_path), update_freq=4),
    )
    series, findings = only_run(str(tmp_path))
    assert series.batch_size.tolist() == [[4, 4], [4, 4], [1, 0]] * 3
    # Dense series at steps 0, 4, 8 and the end of training; window min/max keep [1, 0].
    assert series.dense_steps.tolist() == [0, 4, 8]
    assert series.dense[1].tolist() == [[4, 4], [1, 0], [4, 4]]  # steps 1-4
    assert series.dense[2].tolist() == [[1, 0], [1, 0], [4, 4]]  # steps 5-8
    assert findings[0].kind == "empty_shard" and findings[0].count == 3


def test_overridden_train_step_and_model_restored_after_fit(tmp_path):
    seen = []

    class CustomModel(keras.Model):
        def train_step(self, data):
            seen.append(True)
            return super().train_step(data)

    strategy = mirrored(2)
    with strategy.scope():
        inputs = keras.Input((3,))
        model = CustomModel(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="sgd", loss="mse")
    _fit(strategy, str(tmp_path / "a"), examples=16, batch=8, model=model)
    assert seen, "the user's train_step must still run"
    assert "train_step" not in model.__dict__
    assert model.train_function is None
    # A second fit with a new callback continues the step axis (optimizer iterations).
    _fit(strategy, str(tmp_path / "b"), examples=16, batch=8, model=model)
    series, _ = only_run(str(tmp_path / "b"))
    assert series.steps.tolist() == [2, 3]
    assert series.batch_size.tolist() == [[4, 4], [4, 4]]


def test_train_step_traced_once_per_model_across_two_fits(tmp_path):
    traces = []

    class Counting(keras.Model):
        def train_step(self, data):
            traces.append(1)  # Python: runs only while the step is traced, once per replica
            return super().train_step(data)

    strategy = mirrored(2)
    with strategy.scope():
        inputs = keras.Input((3,))
        model = Counting(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="sgd", loss="mse")
    callback = ReplicaCallback(str(tmp_path))
    _fit(strategy, str(tmp_path), examples=32, batch=8, epochs=2, model=model, callback=callback)
    assert len(traces) == 2  # one trace: the step runs once per replica while tracing
    assert "train_step" not in model.__dict__ and model.train_function is None
    _fit(strategy, str(tmp_path), examples=32, batch=8, epochs=1, model=model, callback=callback)
    assert len(traces) == 2  # the second fit reuses the instrumented train function
    series, _ = only_run(str(tmp_path))
    assert series.steps.tolist() == list(range(12))
    assert series.batch_size.tolist() == [[4, 4]] * 12
    # A fit without the callback gets a train function without the probe (one more trace).
    x = np.zeros((16, 3), "float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
    assert len(traces) == 4
    assert only_run(str(tmp_path))[0].steps.tolist() == list(range(12))


def test_probe_in_cross_replica_context_eagerly(tmp_path):
    strategy = mirrored(2)
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.range(10).batch(6))
    with ReplicaProbe(str(tmp_path), strategy, update_freq=1) as probe:
        for step, batch in enumerate(dataset):
            probe.observe_inputs(batch, step=step * 10)
    series, _ = only_run(str(tmp_path))
    assert series.steps.tolist()[0] == 0 and series.steps.tolist()[-1] == 10
    assert series.batch_size[0].tolist() == [3, 3]
    assert series.batch_size[-1].tolist() == [2, 2]
    assert series.shape_events[0]["inputs"][0]["name"] == "input"


def test_probe_rejects_bad_options_and_survives_unwritable_log_dir(tmp_path):
    with pytest.raises(ValueError, match="update_freq"):
        ReplicaProbe(str(tmp_path), update_freq=0)
    with pytest.raises(ValueError, match="update_freq"):
        ReplicaCallback(str(tmp_path), update_freq="sometimes")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = _fit(mirrored(2), str(blocker / "logs"), examples=16, batch=8)
    messages = [str(w.message) for w in caught if "tb_replica_plugin" in str(w.message)]
    assert len(messages) == 1 and "cannot write summaries" in messages[0]
    assert int(model.optimizer.iterations.numpy()) == 2  # training went on


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda d: ReplicaProbe(d, update_freq=0),
            "`update_freq` must be an integer >= 1 or None. Received: 0",
        ),
        (
            lambda d: ReplicaProbe(d, update_freq=True),
            "`update_freq` must be an integer >= 1 or None. Received: True",
        ),
        (
            lambda d: ReplicaProbe(d, update_freq="epoch"),
            "`update_freq` must be an integer >= 1 or None. Received: 'epoch'",
        ),
        (
            lambda d: ReplicaCallback(d, update_freq="sometimes"),
            "`update_freq` must be 'epoch', 'batch' or a positive integer. "
            "Received: update_freq='sometimes'",
        ),
        (
            lambda d: ReplicaCallback(d, update_freq=None),
            "`update_freq` must be 'epoch', 'batch' or a positive integer. "
            "Received: update_freq=None",
        ),
        (
            lambda d: ReplicaCallback(d, update_freq=2.0),
            "`update_freq` must be 'epoch', 'batch' or a positive integer. "
            "Received: update_freq=2.0",
        ),
        (lambda d: ReplicaProbe(d, flush_secs=0), "`flush_secs` must be a number > 0. Received: 0"),
        (
            lambda d: ReplicaProbe(d, flush_secs=float("nan")),
            "`flush_secs` must be a number > 0. Received: nan",
        ),
        (
            lambda d: ReplicaCallback(d, flush_secs=True),
            "`flush_secs` must be a number > 0. Received: True",
        ),
        (
            lambda d: ReplicaCallback(d, flush_secs="5"),
            "`flush_secs` must be a number > 0. Received: '5'",
        ),
    ],
)
def test_update_freq_and_flush_secs_are_refused_with_these_words(tmp_path, make, message):
    with pytest.raises(ValueError) as error:
        make(str(tmp_path))
    assert str(error.value) == message


def test_update_freq_and_flush_secs_accepted_as_given(tmp_path):
    probe = ReplicaProbe(str(tmp_path), update_freq=None, flush_secs=1)
    assert (probe.update_freq, probe.flush_secs) == (None, 1.0)
    assert ReplicaCallback(str(tmp_path), update_freq="batch").update_freq == 1
    callback = ReplicaCallback(str(tmp_path), update_freq=3, flush_secs=0.5)
    assert (callback.update_freq, callback.flush_secs) == (3, 0.5)
    assert ReplicaCallback(str(tmp_path)).update_freq == "epoch"


def test_shapes_json_formats_every_replica_in_one_layout_or_replica_by_replica():
    from tb_replica_plugin.families.inputs.record import InputsStats

    uniform = InputsStats.of_leaves(
        ["x", "w"], [[tf.zeros([4, 3]), tf.zeros([3, 3])], [tf.constant(1.0), tf.constant(2.0)]]
    )
    assert uniform.shapes_json({"source": "fit"}).numpy().decode() == (
        '{"source": "fit", "inputs": [{"name": "x", "dtypes": ["float32", "float32"], '
        '"shapes": [[4, 3], [3, 3]]}, {"name": "w", "dtypes": ["float32", "float32"], '
        '"shapes": [[], []]}]}'
    )
    assert uniform.batch_size.numpy().tolist() == [4, 3]
    # Ranks that differ across replicas: formatted replica by replica, the same layout.
    mixed = InputsStats.of_leaves(["x"], [[tf.zeros([4, 3]), tf.zeros([2])]])
    document = json.loads(mixed.shapes_json({}).numpy())
    assert document == {
        "inputs": [{"name": "x", "dtypes": ["float32"] * 2, "shapes": [[4, 3], [2]]}]
    }
    assert mixed.batch_size.numpy().tolist() == [4, 2]
