"""Gradients family: local (pre all-reduce) gradient norms, loss and NaN/Inf per replica.

Real MirroredStrategy on 2 logical CPUs, real Keras `fit` and a real custom loop; the recorded
values are compared with norms computed by hand from each replica's batch with a GradientTape
(fit is replayed step by step: SGD applies the mean of the replicas' gradients).
"""

import os
import types
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored

import tb_replica_plugin
from tb_replica_plugin import ReplicaCallback, ReplicaProbe, analysis
from tb_replica_plugin.families.gradients import read as gradients_read
from tb_replica_plugin.families.gradients import rules as gradients_rules

LR = 0.1
BATCH = 8  # global batch: 4 examples per replica


def make_model(strategy=None, optimizer=None):
    def build():
        model = keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(2, name="hidden"), keras.layers.Dense(1)]
        )
        model.compile(optimizer=optimizer or keras.optimizers.SGD(LR), loss="mse")
        return model

    if strategy is None:
        return build()
    with strategy.scope():
        return build()


def data(steps, zero_replica=None, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * BATCH, 3)).astype("float32")
    y = rng.normal(size=(steps * BATCH, 1)).astype("float32")
    if zero_replica is not None:
        for step in range(steps):
            start = step * BATCH + zero_replica * BATCH // 2
            x[start : start + BATCH // 2] = 0.0
    return x, y


def hand_replay(weights, x, y, steps, replicas=2):
    """Per step and replica: (norm of the gradient of the replica's mean loss, that loss,
    per-variable norms), replaying SGD on the mean of the replicas' gradients."""
    model = make_model()
    for variable, value in zip(model.weights, weights, strict=True):
        variable.assign(value)
    per = BATCH // replicas
    norms, losses, var_norms = [], [], []
    for step in range(steps):
        grads_of, row_norm, row_loss, row_vars = [], [], [], []
        for replica in range(replicas):
            start = step * BATCH + replica * per
            xb, yb = x[start : start + per], y[start : start + per]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb) - yb))
            grads = tape.gradient(loss, model.trainable_weights)
            grads_of.append(grads)
            row_norm.append(float(tf.linalg.global_norm(grads)))
            row_loss.append(float(loss))
            row_vars.append([float(tf.norm(g)) for g in grads])
        for variable, *grads in zip(model.trainable_weights, *grads_of, strict=True):
            variable.assign_sub(LR * tf.add_n(grads) / replicas)
        norms.append(row_norm)
        losses.append(row_loss)
        var_norms.append(np.array(row_vars).T.tolist())
    return np.array(norms), np.array(losses), np.array(var_norms)


def gradients_of(logdir):
    report = tb_replica_plugin.load(logdir)
    (name,) = report.runs
    return report.runs[name].gradients, report.findings[name]


@pytest.fixture(scope="module")
def fit_zero_replica(tmp_path_factory):
    """fit on 2 replicas, replica 1's examples all zero, LossScaleOptimizer around SGD."""
    logdir = str(tmp_path_factory.mktemp("fit_zero"))
    strategy = mirrored(2)
    x, y = data(3, zero_replica=1)
    # Created in the scope: an optimizer made outside it has variables on one device only
    # (the drift family would rightly report them as not mirrored).
    with strategy.scope():
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(LR))
    model = make_model(strategy, optimizer)
    weights = [w.numpy() for w in model.weights]
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=1,
        verbose=0,
        shuffle=False,
        callbacks=[ReplicaCallback(logdir, update_freq=1)],
    )
    return logdir, hand_replay(weights, x, y, 3), model


def test_fit_norms_equal_hand_computation_per_replica(fit_zero_replica):
    logdir, (norms, losses, var_norms), model = fit_zero_replica
    series, findings = gradients_of(logdir)
    assert series.steps.tolist() == [0, 1, 2]
    assert len(series.variables) == 4
    assert series.variables[0].endswith("hidden/kernel")
    assert series.variables[1].endswith("hidden/bias")
    assert series.shapes == [[3, 2], [2], [2, 1], [1]]
    assert series.scaling == "replica_loss" and series.has_loss
    np.testing.assert_allclose(series.global_norm, norms, rtol=1e-4)
    np.testing.assert_allclose(series.loss, losses, rtol=1e-4)
    np.testing.assert_allclose(series.variable_norms, var_norms, rtol=1e-4, atol=1e-6)
    # Replica 1 saw zeros: its first-layer kernel gradient is exactly 0, the norms differ.
    assert np.all(series.variable_norms[:, 0, 1] == 0)
    assert np.all(series.variable_norms[:, 0, 0] > 0)
    assert np.all(np.abs(series.global_norm[:, 0] - series.global_norm[:, 1]) > 1e-3)
    assert series.nonfinite_steps.size == 0
    assert {f.kind for f in findings} <= {"gradient_norm_outlier"}
    # The optimizer and the model are restored after fit.
    assert "apply_gradients" not in model.optimizer.__dict__
    assert "apply" not in model.optimizer.__dict__
    assert "compute_loss" not in model.__dict__


class SkipNonFiniteSGD(keras.optimizers.SGD):
    """SGD that zeroes a step whose all-reduced gradients hold NaN/Inf, so a NaN does not spread.

    (Keras 3.15's LossScaleOptimizer does not do this under MirroredStrategy: it checks only
    replica 0's local gradients, so a NaN on replica 1 reaches the weights.)
    """

    def apply_gradients(self, grads_and_vars):
        pairs = list(grads_and_vars)
        bad = tf.add_n(
            [tf.reduce_sum(tf.cast(~tf.math.is_finite(g), tf.float32)) for g, _ in pairs]
        )
        bad = tf.distribute.get_replica_context().all_reduce("sum", bad)
        return super().apply_gradients([(tf.where(bad > 0, 0.0, g), v) for g, v in pairs])


def test_nan_on_one_replica_between_logged_steps(tmp_path):
    strategy = mirrored(2)
    x, y = data(8)
    x[5 * BATCH + BATCH // 2 + 1, 2] = np.nan  # replica 1's batch at step 5
    model = make_model(strategy, SkipNonFiniteSGD(LR))
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=1,
        verbose=0,
        shuffle=False,
        callbacks=[ReplicaCallback(str(tmp_path), update_freq=4)],
    )
    series, findings = gradients_of(str(tmp_path))
    assert series.steps.tolist() == [0, 4]  # step 5 is not a logged step
    assert np.all(np.isfinite(series.global_norm))
    assert series.nonfinite_steps.tolist() == [5]
    counts = series.nonfinite[0]  # rows: grad NaN, grad Inf, loss NaN, loss Inf
    assert counts[:, 0].tolist() == [0, 0, 0, 0]
    assert counts[0, 1] > 0 and counts[2, 1] == 1
    (finding,) = [f for f in findings if f.kind == "nonfinite_gradients"]
    assert (finding.severity, finding.replicas, finding.first_step, finding.count) == (
        "error",
        [1],
        5,
        1,
    )
    assert "Replica 1" in finding.message and "step 5" in finding.message


def test_overridden_train_step_records_gradients_as_given(tmp_path):
    class OwnStep(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self(x) - y))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
            return {"loss": loss}

    strategy = mirrored(2)
    with strategy.scope():
        inputs = keras.Input((3,))
        model = OwnStep(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    x, y = data(2, zero_replica=0)
    kernel, bias = (w.numpy() for w in model.weights)
    model.fit(
        x,
        y,
        batch_size=BATCH,
        verbose=0,
        shuffle=False,
        callbacks=[ReplicaCallback(str(tmp_path), update_freq=1)],
    )
    series, _ = gradients_of(str(tmp_path))
    assert series.scaling == "as_given" and not series.has_loss
    assert np.all(np.isnan(series.loss))
    # Learning rate 0: every step's gradient is at the initial weights.
    for step in range(2):
        for replica in range(2):
            start = step * BATCH + replica * BATCH // 2
            xb, yb = x[start : start + BATCH // 2], y[start : start + BATCH // 2]
            error = xb @ kernel + bias - yb
            grad_k = 2 * xb.T @ error / len(xb)
            grad_b = 2 * error.mean(axis=0)
            expected = np.sqrt((grad_k**2).sum() + (grad_b**2).sum())
            assert series.global_norm[step, replica] == pytest.approx(expected, rel=1e-4)
    assert series.variable_norms[0, 0, 0] == 0  # replica 0 saw zeros: no kernel gradient


def custom_loop(tmp_path, seed):
    """The pieces of a custom loop on 2 replicas: 3 steps of data (replica 1 fed zeros), the
    model and SGD made under the scope, their initial weights, the distributed dataset and a
    probe writing `tmp_path/loop` at every step (a `SimpleNamespace`)."""
    strategy = mirrored(2)
    x, y = data(3, zero_replica=1, seed=seed)
    with strategy.scope():
        model = make_model()
        optimizer = keras.optimizers.SGD(LR)
        optimizer.build(model.trainable_variables)
    return types.SimpleNamespace(
        strategy=strategy,
        x=x,
        y=y,
        model=model,
        optimizer=optimizer,
        weights=[w.numpy() for w in model.weights],
        dataset=strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
        ),
        probe=ReplicaProbe(str(tmp_path / "loop"), strategy, update_freq=1),
    )


def replica_gradients(model, features, labels):
    """`(grads, loss)` of one replica: its share of the global batch's mean squared error."""
    with tf.GradientTape() as tape:
        per_example = tf.reduce_mean(tf.square(model(features) - labels), axis=1)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
    return tape.gradient(loss, model.trainable_variables), loss


def test_custom_loop_norms_equal_hand_computation(tmp_path):
    loop = custom_loop(tmp_path, seed=1)
    strategy, model, optimizer, probe = loop.strategy, loop.model, loop.optimizer, loop.probe

    @tf.function
    def train_step(batch):
        def step_fn(features, labels):
            grads, loss = replica_gradients(model, features, labels)
            probe.observe_gradients(
                grads, model.trainable_variables, loss=loss, scale=1 / 2
            )  # the gradient of each replica's own mean loss
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.run(step_fn, args=batch)

    for batch in loop.dataset:
        train_step(batch)
    probe.close()
    norms, losses, var_norms = hand_replay(loop.weights, loop.x, loop.y, 3)
    series, findings = gradients_of(str(tmp_path))
    assert series.steps.tolist() == [0, 1, 2]
    assert series.scaling == "as_given"
    np.testing.assert_allclose(series.global_norm, norms, rtol=1e-4)
    np.testing.assert_allclose(series.loss, losses, rtol=1e-4)
    np.testing.assert_allclose(series.variable_norms, var_norms, rtol=1e-4, atol=1e-6)
    assert np.all(np.abs(series.global_norm[:, 0] - series.global_norm[:, 1]) > 1e-3)
    assert {f.kind for f in findings} <= {"gradient_norm_outlier"}


def test_cross_replica_per_replica_gradients_eagerly(tmp_path):
    strategy = mirrored(2)
    with strategy.scope():
        variable = tf.Variable([1.0, 2.0])

    def grads_fn(context):
        scale = float(context.replica_id_in_sync_group + 1)
        return tf.constant([3.0, 4.0]) * scale

    with ReplicaProbe(str(tmp_path), strategy, update_freq=1) as probe:
        for step in range(2):
            grads = strategy.experimental_distribute_values_from_function(grads_fn)
            probe.observe_gradients([grads], [variable], step=step * 10)
        bad = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant([np.inf, 0.0]) if ctx.replica_id_in_sync_group else tf.ones(2)
        )
        probe.observe_gradients([bad], [variable], step=15)
    series, findings = gradients_of(str(tmp_path))
    assert series.steps.tolist() == [0, 10, 15]
    np.testing.assert_allclose(series.global_norm[:2], [[5.0, 10.0], [5.0, 10.0]])
    assert series.nonfinite_steps.tolist() == [15]
    assert series.nonfinite[0][:, 1].tolist() == [0, 1, 0, 0]
    assert [(f.kind, f.replicas, f.first_step) for f in findings] == [
        ("nonfinite_gradients", [1], 15)
    ]


def test_cross_replica_scalar_loss_is_recorded_on_every_replica(tmp_path):
    """A loop that returns `(grads, loss)` from `strategy.run`, reduces the loss to a scalar
    (`strategy.reduce("MEAN", ...)`) and calls `observe_gradients` outside `strategy.run`:
    each replica's own gradient norms, and the scalar loss as every replica's loss."""
    loop = custom_loop(tmp_path, seed=2)
    strategy, model, optimizer, probe = loop.strategy, loop.model, loop.optimizer, loop.probe

    @tf.function
    def train_step(batch):
        def step_fn(features, labels):
            grads, loss = replica_gradients(model, features, labels)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return grads, loss

        grads, loss = strategy.run(step_fn, args=batch)
        total = strategy.reduce("MEAN", loss, axis=None)  # a scalar, no longer per replica
        # scale=1/2: each replica's own mean-loss gradient; the MEAN of the replicas' shares
        # of the global loss, divided by 1/2, is the global mean loss.
        probe.observe_gradients(grads, model.trainable_variables, loss=total, scale=1 / 2)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in loop.dataset:
            train_step(batch)
        probe.close()
    assert [str(w.message) for w in caught if "tb_replica_plugin" in str(w.message)] == []
    norms, losses, _ = hand_replay(loop.weights, loop.x, loop.y, 3)
    series, findings = gradients_of(str(tmp_path))
    assert series.steps.tolist() == [0, 1, 2]
    np.testing.assert_allclose(series.global_norm, norms, rtol=1e-4)
    # Replica 1's examples are zero: its own loss differs from replica 0's, the recorded one
    # is the mean of both on both.
    assert np.all(np.abs(losses[:, 0] - losses[:, 1]) > 1e-3)
    expected = np.repeat(losses.mean(axis=1, keepdims=True), 2, axis=1)
    np.testing.assert_allclose(series.loss, expected, rtol=1e-4)
    assert series.nonfinite_steps.size == 0
    assert not [f for f in findings if f.kind == "nonfinite_gradients"]


def test_gradient_failure_warns_once_and_training_goes_on(tmp_path):
    strategy = mirrored(2)
    probe = ReplicaProbe(str(tmp_path), strategy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe.observe_gradients([tf.ones(2)], [])  # lengths differ
        probe.observe_gradients([tf.ones(2)], [])
    messages = [str(w.message) for w in caught if "gradients" in str(w.message)]
    assert len(messages) == 1 and "training goes on" in messages[0]
    probe.close()


def test_nonfinite_counts_of_each_replica():
    """The fault branch's exact NaN/Inf counts of a replica (rows `schema.NONFINITE_ROWS`), and
    without a loss the loss rows are 0."""
    from tb_replica_plugin.families.gradients.replica import nonfinite_counts

    nan, inf = float("nan"), float("inf")
    values = [
        [tf.constant([nan, 1.0]), tf.constant([[inf, -inf], [1.0, nan]])],
        [tf.constant([1.0, 2.0]), tf.constant([[0.0, 0.0], [0.0, 0.0]])],
        [tf.constant([inf, nan]), tf.constant([[nan, nan], [nan, 3.0]])],
    ]
    losses = [tf.constant(nan), tf.constant(inf), tf.constant(1.0)]
    expected = [[2, 0, 4], [2, 0, 1], [1, 0, 0], [0, 1, 0]]  # rows: grad NaN, Inf, loss NaN, Inf
    each = tf.stack(
        [nonfinite_counts(v, loss, True) for v, loss in zip(values, losses, strict=True)], 1
    )
    assert each.numpy().tolist() == expected
    without_loss = tf.stack([nonfinite_counts(v, None, False) for v in values], 1)
    assert without_loss.numpy().tolist() == [*expected[:2], [0, 0, 0], [0, 0, 0]]


def test_ratio_to_median_leaves_the_replica_out():
    ratio = gradients_rules.ratio_to_median(np.array([[1.0, 3.0], [2.0, 2.0], [0.0, 0.0]]))
    assert ratio.tolist() == [[1 / 3, 3.0], [1.0, 1.0], [1.0, 1.0]]
    four = gradients_rules.ratio_to_median(np.array([[1.0, 1.2, 100.0, 0.9]]))
    assert four[0, 2] == pytest.approx(100.0)
    assert np.all(four[0, [0, 1, 3]] < 2)


def test_outlier_and_spreading_nan_findings():
    steps = np.array([0, 10, 20])
    norms = np.array([[1.0, 1.1, 120.0, 0.9], [1.0, 1.0, 90.0, 1.2], [1.0, 1.0, 1.1, 1.0]])
    var_norms = np.stack([norms * 0.1, norms], axis=1)  # variable "b" holds most of the norm
    counts = np.zeros((2, 4, 4), np.int64)
    counts[0, 0, 3] = 2  # step 12: replica 3 has 2 NaN
    counts[1, 0, :] = 5  # step 13: every replica (spread by the all-reduce)
    series = gradients_read.GradientsSeries(
        run="r",
        replicas=[0, 1, 2, 3],
        variables=["a", "b"],
        shapes=[[1], [1]],
        has_loss=False,
        scaling="as_given",
        steps=steps,
        global_norm=norms,
        loss=np.full(norms.shape, np.nan),
        variable_norms=var_norms,
        nonfinite_steps=np.array([12, 13]),
        nonfinite=counts,
    )
    findings = gradients_rules.find_gradients(series)
    assert [(f.kind, f.replicas, f.first_step, f.last_step, f.count) for f in findings] == [
        ("nonfinite_gradients", [3], 12, 13, 2),
        ("nonfinite_gradients", [0, 1, 2], 13, 13, 1),
        ("gradient_norm_outlier", [2], 0, 10, 2),
    ]
    assert "after replica(s) 3 at step 12" in findings[1].message
    assert findings[2].value == pytest.approx(120.0 / 1.0)
    assert findings[2].name in ("a", "b")
    relaxed = gradients_rules.find_gradients(series, analysis.Thresholds(max_grad_norm_ratio=200))
    assert [f.kind for f in relaxed] == ["nonfinite_gradients", "nonfinite_gradients"]
    # Over the ratio at 2 of 3 logged steps: not enough when 90 % are asked for.
    persistent = gradients_rules.find_gradients(
        series, analysis.Thresholds(min_grad_outlier_fraction=0.9)
    )
    assert "gradient_norm_outlier" not in [f.kind for f in persistent]


def test_epoch_update_freq_writes_last_norms_at_epoch_end(tmp_path):
    strategy = mirrored(2)
    x, y = data(2)
    model = make_model(strategy)
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=2,
        verbose=0,
        shuffle=False,
        callbacks=[ReplicaCallback(str(tmp_path))],
    )
    series, _ = gradients_of(str(tmp_path))
    assert series.steps.tolist() == [1, 3]
    assert np.all(series.global_norm > 0)


def test_run_without_gradients_has_none(unit_logs):
    report = tb_replica_plugin.load(os.path.join(unit_logs, "loop_15_7"))
    assert all(run.gradients is None for run in report.runs.values())


def test_gradients_false_records_no_gradients_and_leaves_the_optimizer_alone(tmp_path):
    strategy = mirrored(2)
    model = make_model(strategy)
    x, y = data(2)
    optimizer = model.optimizer
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=1,
        verbose=0,
        callbacks=[ReplicaCallback(str(tmp_path), update_freq=1, gradients=False)],
    )
    (run,) = tb_replica_plugin.load(str(tmp_path)).runs.values()
    assert run.gradients is None
    assert run.inputs.batch_size.tolist() == [[4, 4], [4, 4]]
    assert "apply_gradients" not in optimizer.__dict__ and "apply" not in optimizer.__dict__


def test_nan_loss_of_an_empty_batch_is_one_empty_shard_finding(tmp_path):
    """17 examples in global batches of 8 on 2 replicas: the last batch splits [1, 0]. A plain
    mean loss is NaN on the empty replica (0/0) while its gradients are finite (zero): the one
    finding is `empty_shard`, which names the NaN loss; no `nonfinite_gradients`."""
    strategy = mirrored(2)
    x, y = data(3, seed=3)
    x, y = x[:17], y[:17]
    with strategy.scope():
        model = make_model()
        optimizer = keras.optimizers.SGD(LR)
        optimizer.build(model.trainable_variables)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    )
    probe = ReplicaProbe(str(tmp_path / "loop"), strategy, update_freq=1)

    @tf.function
    def train_step(batch):
        def step_fn(features, labels):
            probe.observe_inputs({"x": features, "y": labels})
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(features) - labels))
            grads = tape.gradient(loss, model.trainable_variables)
            probe.observe_gradients(grads, model.trainable_variables, loss=loss)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.run(step_fn, args=batch)

    losses = [strategy.experimental_local_results(train_step(batch)) for batch in dataset]
    probe.close()
    assert np.isnan(float(losses[2][1])) and np.isfinite(float(losses[2][0]))
    assert all(np.all(np.isfinite(w.numpy())) for w in model.weights)
    report = tb_replica_plugin.load(str(tmp_path))
    series = report.runs["loop"].gradients
    # The probe saw the NaN loss (and finite gradients) on replica 1 at step 2.
    assert series.nonfinite_steps.tolist() == [2]
    assert series.nonfinite[0][:, 1].tolist() == [0, 0, 1, 0]
    assert series.nonfinite[0][:, 0].tolist() == [0, 0, 0, 0]
    findings = report.findings["loop"]
    assert [(f.kind, f.replicas, f.first_step) for f in findings] == [("empty_shard", [1], 2)]
    (finding,) = findings
    assert "The loss of replica 1 is NaN/Inf at step 2" in finding.message
    assert "all-reduce writes" not in finding.message


def test_nan_loss_with_finite_gradients_on_a_full_batch_is_still_found():
    """A NaN loss with finite gradients on a replica whose batch was not empty stays a
    `nonfinite_gradients` finding, without the sentence on the all-reduce writing NaN into the
    weights; an empty batch's NaN loss at the same step is left to `empty_shard`."""
    counts = np.zeros((2, 4, 3), np.int64)
    counts[0, 2, 1] = 1  # step 4: replica 1's loss is NaN, its gradients finite (full batch)
    counts[1, 2, 2] = 1  # step 6: replica 2's loss is NaN, its batch empty
    series = gradients_read.GradientsSeries(
        run="r",
        replicas=[0, 1, 2],
        variables=["a"],
        shapes=[[1]],
        has_loss=True,
        scaling="as_given",
        steps=np.array([0]),
        global_norm=np.ones((1, 3)),
        loss=np.ones((1, 3)),
        variable_norms=np.ones((1, 1, 3)),
        nonfinite_steps=np.array([4, 6]),
        nonfinite=counts,
    )
    inputs = types.SimpleNamespace(
        steps=np.arange(8), replicas=[0, 1, 2], batch_size=np.full((8, 3), 4)
    )
    inputs.batch_size[6] = [3, 1, 0]
    (finding,) = gradients_rules.find_gradients(series, inputs=inputs)
    assert (finding.kind, finding.replicas, finding.first_step, finding.count) == (
        "nonfinite_gradients",
        [1],
        4,
        1,
    )
    assert "gradients stayed finite" in finding.message
    assert "all-reduce" not in finding.message
    # Without batch sizes nothing is known to be empty: both replicas are found.
    found = gradients_rules.find_gradients(series)
    assert [(f.replicas, f.first_step) for f in found] == [([1], 4), ([2], 6)]
