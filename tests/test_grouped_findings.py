"""One finding per cause, on real models under a real 2-replica MirroredStrategy.

Keras 3 BatchNormalization (per-replica moving statistics), a skipped all-reduce beside it,
Keras 3 Dropout (identical masks) and a stock `keras.applications.MobileNetV2`.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored

import tb_replica_plugin
from tb_replica_plugin import ReplicaCallback, ReplicaProbe, analysis

pytestmark = pytest.mark.skipif(
    not keras.__version__.startswith("3"), reason="Keras 3 behaviour (per-replica statistics)"
)


def only(logdir):
    report = tb_replica_plugin.load(logdir)
    (name,) = report.runs
    return report, report.findings[name]


def batchnorm_model(strategy, layers=3):
    with strategy.scope():
        stack = [keras.Input((6,))]
        for _ in range(layers):
            stack += [keras.layers.Dense(8), keras.layers.BatchNormalization()]
        model = keras.Sequential(stack + [keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    return model


def data(n=32, features=6, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(n, features)).astype("float32"),
        rng.normal(size=(n, 1)).astype("float32"),
    )


def fit(model, logdir, x, y, batch=8):
    """One epoch of Keras fit with `ReplicaCallback(update_freq=1)`; returns the findings."""
    model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(batch),
        epochs=1,
        verbose=0,
        callbacks=[ReplicaCallback(str(logdir), update_freq=1)],
    )
    return only(str(logdir))


def test_batchnorm_fit_gives_one_statistics_finding_naming_the_layers(tmp_path):
    strategy = mirrored(2)
    keras.utils.set_random_seed(5)
    model = batchnorm_model(strategy)
    x, y = data()
    report, findings = fit(model, tmp_path, x, y)
    (finding,) = findings
    assert (finding.kind, finding.severity, finding.cause) == (
        "per_replica_statistics",
        "info",
        "bn_moving_statistics",
    )
    layers = [layer.name for layer in model.layers if "batch_normalization" in layer.name]
    assert len(layers) == 3
    assert finding.message.startswith("3 BatchNormalization layers (")
    assert all(f"/{layer}`" in finding.message for layer in layers), finding.message
    assert "synchronized=True" in finding.message and "replica 0's" in finding.message
    names = sorted(item["name"] for item in finding.items)
    expected = sorted(
        v.path for v in model.non_trainable_variables if v.path.split("/")[-1].startswith("moving")
    )
    assert names == expected and len(names) == 6
    assert finding.replicas == [1] and finding.first_step == 0 and finding.name is None
    # The report: one line per finding; its JSON carries the items.
    text = report.to_text()
    assert text.count("[info] per_replica_statistics:") == 1
    body = json.loads(json.dumps(report.to_json(), default=str))
    (run,) = body["runs"]
    (as_json,) = run["findings"]
    assert sorted(item["name"] for item in as_json["items"]) == expected
    assert {item["severity"] for item in as_json["items"]} == {"info"}


def test_skipped_allreduce_beside_batchnorm_is_still_one_error(tmp_path):
    """Custom loop: each copy updated with its own replica's gradient, BN statistics per replica."""
    strategy = mirrored(2)
    keras.utils.set_random_seed(6)
    model = batchnorm_model(strategy, layers=2)
    x, y = data(seed=1)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    )
    probe = ReplicaProbe(os.path.join(str(tmp_path), "replicas"), strategy, update_freq=1)

    @tf.function
    def train_step(batch):
        def step_fn(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(features, training=True) - labels))
            return tape.gradient(loss, model.trainable_variables)

        grads = strategy.run(step_fn, args=batch)
        for variable, grad in zip(model.trainable_variables, grads, strict=True):
            local = strategy.experimental_local_results(grad)
            for copy, local_grad in zip(variable.value.values, local, strict=True):
                copy.assign_sub(0.1 * local_grad)
        probe.observe_variables(model.variables)

    for batch in dataset:
        train_step(batch)
    probe.close()
    _, findings = only(str(tmp_path))
    assert [(f.kind, f.severity) for f in findings] == [
        ("variable_drift", "error"),
        ("per_replica_statistics", "info"),
    ]
    drift, statistics = findings
    assert sorted(item["name"] for item in drift.items) == sorted(
        v.path for v in model.trainable_variables
    )
    assert drift.message.startswith(f"{len(model.trainable_variables)} trainable variables (")
    assert "not all-reduced" in drift.message and "and " in drift.message
    assert drift.first_step == 0 and drift.replicas == [1]
    assert statistics.message.startswith("2 BatchNormalization layers (")
    assert len(statistics.items) == 4


def test_two_dropout_layers_give_one_identical_streams_finding(tmp_path):
    strategy = mirrored(2)
    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(16),
                keras.layers.Dropout(0.5, name="drop_a"),
                keras.layers.Dense(16),
                keras.layers.Dropout(0.5, name="drop_b"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="sgd", loss="mse")
    x, y = data()
    _, findings = fit(model, tmp_path, x, y)
    (finding,) = findings
    assert (finding.kind, finding.severity, finding.cause) == (
        "identical_rng_streams",
        "warning",
        "dropout",
    )
    assert finding.message.startswith(
        "Replicas 0 and 1 draw identical dropout masks in 2 Dropout layers (`drop_a` and `drop_b`)"
    )
    assert len(finding.items) == 2 and finding.count == 4 and finding.replicas == [0, 1]
    assert all("Dropout" in item["message"] for item in finding.items)


def test_mobilenet_v2_on_2_replicas_gives_at_most_2_findings(tmp_path):
    strategy = mirrored(2)
    keras.utils.set_random_seed(8)
    with strategy.scope():
        model = keras.applications.MobileNetV2(
            input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=4
        )
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(8, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 4, size=(8,))
    _, findings = fit(model, tmp_path, x, y, batch=4)
    assert len(findings) <= 2, [(f.kind, f.message[:80]) for f in findings]
    (statistics,) = [f for f in findings if f.kind == "per_replica_statistics"]
    bn_layers = [
        layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)
    ]
    assert statistics.message.startswith(f"{len(bn_layers)} BatchNormalization layers (")
    assert len(bn_layers) == 52 and len(statistics.items) == 2 * len(bn_layers)
    assert not [f for f in findings if f.severity == "error"]
    assert analysis.severity_counts(findings)["error"] == 0


def test_group_findings_merges_one_cause_only():
    def finding(name, cause, severity="warning", step=0, replicas=(1,), value=0.5):
        return analysis.Finding(
            "variable_drift",
            severity,
            "run",
            step,
            step + 2,
            3,
            list(replicas),
            name,
            value,
            1e-6,
            f"'{name}' differs.",
            "drift",
            cause=cause,
        )

    found = [
        finding("a", "x", step=4, replicas=(2,), value=0.25),
        finding("b", "x", severity="error", step=1, value=0.75),
        finding("c", "y"),
        finding("d", None),
        finding("e", None),
    ]
    calls = []

    def describe(kind, cause, items):
        calls.append((kind, cause, [f.name for f in items]))
        return "grouped."

    grouped = analysis.group_findings(found, describe)
    assert calls == [("variable_drift", "x", ["b", "a"])]  # most severe first, then rule order
    assert [(f.name, f.severity, f.cause) for f in grouped] == [
        (None, "error", "x"),
        ("d", "warning", None),
        ("e", "warning", None),
        ("c", "warning", "y"),  # a cause with one finding stays as it is
    ]
    merged = grouped[0]
    assert (merged.first_step, merged.last_step, merged.replicas, merged.value) == (
        1,
        6,
        [1, 2],
        0.75,
    )
    assert [i["name"] for i in merged.items] == ["b", "a"]
    assert set(merged.items[0]) == {
        "severity",
        "first_step",
        "last_step",
        "count",
        "replicas",
        "name",
        "value",
        "threshold",
        "message",
        "view",
    }
    assert all(f.items == [] for f in grouped[1:])
    assert analysis.names_text(["a", "b", "c", "d", "e"]) == "`a`, `b`, `c` and 2 more"
    assert analysis.names_text(["a", "b"]) == "`a` and `b`"
