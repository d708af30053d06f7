"""One transfer per replica and step, its arrival time, and the one step axis (issue 40).

Real `MirroredStrategy` on 2 logical CPU replicas, real Keras `fit`:

- in a profiler trace (as `benchmarks.step_counts` reads it), a plain step of the callback's
  (`write.variants`) sends nothing more than the model's own and adds the cost model's kernels;
  its sampled step sends one vector per replica that is not on the host's device, for an MLP
  and a model with BatchNormalization and Dropout (every family of the default);
- a replica that sleeps 20 ms more per step than the other on the same batch (a branch on the
  replica id) has the larger median ready time in `step_time/replicas`, the other waits for it,
  and `load` (the report's and the tab's reader) finds it a `slow_replica`; its twin without the
  sleep has neither;
- the window statistics (`window_stats`) are numpy's medians and maxima over the window's steps;
- a custom loop's `probe.step()` records every family at one step per step, and calls outside a
  scope follow the step axis's rule.
"""

import collections
import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored

from benchmarks import step_counts
from tb_replica_plugin import ReplicaCallback, ReplicaProbe
from tb_replica_plugin.families.step_time import schema as step_time_schema
from tb_replica_plugin.families.step_time.record import window_stats
from tb_replica_plugin.report import load
from tb_replica_plugin.write import variants

SLEEP_S = 0.02  # what the slow replica adds to each step


def _events(run_dir, prefix=""):
    """`{tag: [(step, value)]}` of the run's summaries whose tag starts with `prefix`."""
    found = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "events.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag.startswith(prefix):
                    array = tf.make_ndarray(value.tensor)
                    found.setdefault(value.tag, []).append((event.step, array))
    return found


def _data(count, batch=8, features=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, features)).astype("float32")
    y = rng.normal(size=(count, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def _mlp(strategy):
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer="adam", loss="mse")
    return model


def _batchnorm_dropout(strategy):
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(16),
                keras.layers.BatchNormalization(),
                keras.layers.Dropout(0.2),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
    return model


def _profiled_calls(model, callbacks, trace_dir):
    """`benchmarks.step_counts.per_call` of 16 steps of `model`'s fit (steps PROFILE_FROM ..
    PROFILE_FROM + 15: after the fit's first, full, steps)."""
    profile = step_counts._profile_callback(keras, trace_dir)  # noqa: SLF001
    steps = step_counts.PROFILE_FROM + 20
    model.fit(_data(8 * steps), epochs=1, verbose=0, callbacks=[*callbacks, profile])
    return step_counts.per_call(trace_dir)


@pytest.mark.parametrize("make_model", [_mlp, _batchnorm_dropout], ids=["mlp", "bn_dropout"])
def test_a_plain_step_sends_nothing_and_a_sampled_step_one_vector_per_replica(tmp_path, make_model):
    """`write.variants`: at a step neither logged nor sampled the callback adds no transfer and
    `R·V + 3·R + 1` kernels (an `l2_loss` per variable, `AddN`, `IsFinite` and
    `ResourceCountUpTo` per replica, the step axis's `assign_add`); at the sampled step 32 it
    adds replica 1's one vector to the host (replica 0's device is the host's); the fit's first
    16 steps are full too (`write.variants.FIRST_FULL_STEPS`)."""
    strategy = mirrored(2)
    keras.utils.set_random_seed(0)
    without = _profiled_calls(make_model(strategy), [], str(tmp_path / "trace_without"))
    keras.utils.set_random_seed(0)
    callback = ReplicaCallback(str(tmp_path / "logs"))
    model = make_model(strategy)
    with_callback = _profiled_calls(model, [callback], str(tmp_path / "trace_with"))
    callback.probe.close()  # its background flushes run no kernel in a later test's trace
    assert len(without) == len(with_callback) == 15  # the last call cut

    def usual(values):  # a background flush (the heartbeat) may add kernels to one call
        return collections.Counter(values).most_common(1)[0][0]

    base = usual(step_counts.sends(c) for c in without)
    base_kernels = usual(sum(c.values()) for c in without)
    assert step_counts.PROFILE_FROM >= variants.FIRST_FULL_STEPS
    sampled = 32 - step_counts.PROFILE_FROM
    plain = [c for index, c in enumerate(with_callback) if index != sampled]
    assert usual(step_counts.sends(c) for c in plain) == base
    replicas, variables = 2, len(model.trainable_variables)
    added = usual(sum(c.values()) - base_kernels for c in plain)
    assert added == replicas * variables + 3 * replicas + 1
    probe_ops = {k: n for k, n in plain[0].items() if k.startswith("tb_replica/")}
    assert probe_ops == {
        "tb_replica/AddN": replicas,
        "tb_replica/IsFinite": replicas,
        "tb_replica/ResourceCountUpTo": replicas,
    }
    assert step_counts.sends(with_callback[sampled]) - base == replicas - 1
    # Every family recorded (the sampled and logged steps carry them all).
    tags = set(_events(os.path.join(str(tmp_path / "logs"), "replicas")))
    expected = {"inputs/shapes", "gradients/variables", "watch/outputs/shapes"}
    if make_model is _batchnorm_dropout:
        expected |= {"rng/streams", "rng/generators"}
    assert expected <= tags


class _SlowReplica(keras.layers.Layer):
    """Identity, except that replica `slow` sleeps `SLEEP_S` first (a stand-in for a slower
    device: its forward pass, and so its vector, comes later)."""

    def __init__(self, slow=None, **kwargs):
        super().__init__(**kwargs)
        self.slow = slow

    def call(self, x):
        context = tf.distribute.get_replica_context()
        if self.slow is None or context is None:  # None: Keras building the model
            return x
        replica = context.replica_id_in_sync_group

        def sleep():
            import time

            time.sleep(SLEEP_S)
            return np.float32(0.0)

        delay = tf.cond(
            tf.equal(replica, self.slow),
            lambda: tf.reshape(tf.py_function(sleep, [], tf.float32), []),
            lambda: tf.constant(0.0),
        )
        return x + delay


def _fit_ready_times(logdir, slow, update_freq="epoch"):
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), _SlowReplica(slow), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    callback = ReplicaCallback(logdir, update_freq=update_freq)
    model.fit(_data(16 * 12, batch=16), epochs=2, verbose=0, callbacks=[callback])
    return _events(os.path.join(logdir, "replicas"), step_time_schema.TAG_REPLICA_TIME)


def test_a_slow_replica_has_the_larger_ready_time_and_the_other_waits_for_it(tmp_path):
    ready = step_time_schema.READY_MEDIAN
    wait = step_time_schema.WAIT_MEDIAN
    slow = _fit_ready_times(str(tmp_path / "slow"), slow=1)[step_time_schema.TAG_REPLICA_TIME]
    # Written at each epoch end (update_freq "epoch"), over the epoch's timed steps: every step
    # of the first 12 (the fit's first 16 are full), then 12-15, the sampled 16 and the last.
    assert [step for step, _ in slow] == [11, 23]
    assert [rows[step_time_schema.WINDOW_STEPS].tolist() for _, rows in slow] == [
        [12.0] * 2,
        [6.0] * 2,
    ]
    for _, rows in slow:
        assert rows.shape == (step_time_schema.REPLICA_TIME_ROWS, 2) and rows.dtype == np.float64
        # Replica 1 sleeps 20 ms more before its forward pass: its vector arrives later.
        assert rows[ready, 1] - rows[ready, 0] > SLEEP_S / 2
        assert rows[step_time_schema.READY_MAX, 1] >= rows[ready, 1] > SLEEP_S
        # Replica 0 waits for it at the all-reduce; it waits for nobody.
        assert rows[wait, 0] > SLEEP_S / 2 and rows[wait, 1] < SLEEP_S / 4
    # Read back as the report and the tab read it: replica 1 is the slow replica, by the ratio
    # of its median ready time (over both windows) to replica 0's.
    (finding,) = _slow_replica_findings(str(tmp_path / "slow"))
    own, base = (float(np.median([rows[ready, r] for _, rows in slow])) for r in (1, 0))
    assert (finding.replicas, finding.severity, finding.threshold) == ([1], "warning", 1.25)
    assert finding.value == round(own / base, 3) and finding.value >= 1.25
    assert own - base > SLEEP_S / 2
    assert (finding.first_step, finding.last_step, finding.count) == (11, 23, 2)
    assert finding.name.endswith("device:CPU:1")
    assert finding.message.startswith(f"Replica 1 (CPU:1) is slow: it is ready {own:.3f} s")
    twin = _fit_ready_times(str(tmp_path / "twin"), slow=None)[step_time_schema.TAG_REPLICA_TIME]
    for _, rows in twin:
        assert abs(rows[ready, 1] - rows[ready, 0]) < SLEEP_S / 2
        assert (rows[ready] < SLEEP_S).all()
    assert _slow_replica_findings(str(tmp_path / "twin")) == []


def _slow_replica_findings(logdir):
    """The `slow_replica` findings of the callback's run, as `tb-replica report` finds them."""
    report = load(logdir)
    return [f for f in report.findings["replicas"] if f.kind == "slow_replica"]


def test_ready_times_are_written_in_the_step_at_logged_steps(tmp_path):
    written = _fit_ready_times(str(tmp_path), slow=1, update_freq=5)
    series = written[step_time_schema.TAG_REPLICA_TIME]
    # In-graph at steps 0, 5, 10, ... (as `inputs/batch_size`); the host writes the rest when
    # training ends. Timed: the fit's first 16 steps, then the sampled 16, the logged 20 and the
    # epoch's last 23 (`write.variants`).
    assert [step for step, _ in series] == [0, 5, 10, 15, 20, 23]
    counts = [rows[step_time_schema.WINDOW_STEPS, 0] for _, rows in series]
    assert counts == [1, 5, 5, 5, 2, 1]
    assert all(rows[step_time_schema.READY_MEDIAN, 1] > SLEEP_S for _, rows in series)


def test_a_faulty_step_is_left_out_of_the_ready_times(tmp_path):
    # Replica 1's label is NaN at step 3 (TerminateOnNaN stops there): its fault branch counts
    # NaN/Inf over every gradient at that step, the tool's work, so the step is not timed. With
    # update_freq=1 each step is its own window: step 3's has no timed step and is not written.
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16 * 6, 6)).astype("float32")
    y = rng.normal(size=(16 * 6, 1)).astype("float32")
    y[3 * 16 + 12, 0] = np.nan  # the second half of step 3's batch: replica 1's
    callbacks = [ReplicaCallback(str(tmp_path), update_freq=1), keras.callbacks.TerminateOnNaN()]
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model.fit(data, epochs=1, verbose=0, callbacks=callbacks)
    run = os.path.join(str(tmp_path), "replicas")
    nonfinite = _events(run, "gradients/nonfinite")["gradients/nonfinite"]
    assert [step for step, _ in nonfinite] == [3]
    series = _events(run, step_time_schema.TAG_REPLICA_TIME)[step_time_schema.TAG_REPLICA_TIME]
    assert [step for step, _ in series] == [0, 1, 2]
    assert all(rows[step_time_schema.WINDOW_STEPS, 0] == 1 for _, rows in series)


def test_window_stats_are_numpy_medians_over_the_window():
    rng = np.random.default_rng(1)
    steps = np.arange(10, 19, dtype=np.float64)  # steps 10..18 in a ring of 12 rows
    start = rng.uniform(0, 100, size=9)
    arrivals = start[:, None] + rng.uniform(0, 0.1, size=(9, 3))
    ring = np.full((12, 5), np.nan)
    ring[steps.astype(int) % 12] = np.column_stack([steps, start, arrivals])
    for after, upto in ((9, 18), (12, 16), (10, 11)):
        rows, count = window_stats(tf.constant(ring), after, upto)
        chosen = (steps > after) & (steps <= upto)
        ready = arrivals[chosen] - start[chosen, None]
        wait = ready.max(axis=1, keepdims=True) - ready
        assert int(count) == chosen.sum()
        np.testing.assert_allclose(rows[0], np.median(ready, axis=0), rtol=1e-12)
        np.testing.assert_allclose(rows[1], ready.max(axis=0), rtol=1e-12)
        np.testing.assert_allclose(rows[2], np.median(wait, axis=0), rtol=1e-12)
        assert rows[3].numpy().tolist() == [float(chosen.sum())] * 3
    rows, count = window_stats(tf.constant(ring), 18, 30)
    assert int(count) == 0 and np.isnan(rows.numpy()).all()
    # An arrival stamped before the step's start (timer jitter) counts as ready at once.
    early = np.array([[0.0, 10.0, 9.999, 10.002]])
    rows, _ = window_stats(tf.constant(early), -1, 0)
    np.testing.assert_allclose(rows[:3].numpy(), [[0, 0.002], [0, 0.002], [0.002, 0]], atol=1e-9)


def test_a_custom_loop_step_scope_records_every_family_at_one_step(tmp_path):
    """`with probe.step():` in replica context: one step per call of the step function, every
    family at it, and ready times; calls outside a scope follow the axis's rule."""
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    probe = ReplicaProbe(str(tmp_path), strategy, update_freq=1)
    probe.set_step(5)

    @tf.function
    def train_step(x, y):
        def step_fn(x, y):
            with probe.step():
                probe.observe_inputs({"x": x, "y": y})
                with tf.GradientTape() as tape:
                    logits = model(x)
                    loss = tf.reduce_mean(tf.square(logits - y))
                probe.watch("logits", logits)
                grads = tape.gradient(loss, model.trainable_variables)
                probe.observe_gradients(grads, model.trainable_variables, loss=loss)
                optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        strategy.run(step_fn, args=(x, y))

    for x, y in strategy.experimental_distribute_dataset(_data(24)):
        train_step(x, y)
        probe.observe_variables(model.variables)  # outside the scope: the step just run
    probe.close()
    events = _events(str(tmp_path))
    for tag in ("inputs/batch_size", "gradients/norms", "watch/logits/stats"):
        assert [step for step, _ in events[tag]] == [5, 6, 7], tag
    assert [step for step, _ in events["variables/hash"]] == [5, 6, 7]
    ready = events[step_time_schema.TAG_REPLICA_TIME]
    assert [step for step, _ in ready] == [5, 6, 7]
    # One step a window; ready times of a tiny step: near 0, never below (the start stamp's
    # scheduling jitter can put it a little after a replica's arrival: 0 then).
    assert all(rows[3].tolist() == [1, 1] for _, rows in ready)
    assert all(((rows[:3] >= 0) & (rows[:3] < 1.0)).all() for _, rows in ready)


def test_calls_outside_a_scope_count_steps_by_the_axis_rule(tmp_path):
    """Without a scope, a family calling again begins the next step: one call of each family
    per step records the same steps, and one called after the step (eagerly) records at the
    step it follows; `step=` leaves the axis alone; `set_step` moves it."""
    strategy = mirrored(2)
    probe = ReplicaProbe(str(tmp_path), strategy, update_freq=1)

    @tf.function
    def step(x):
        def step_fn(x):
            probe.observe_inputs({"x": x})
            probe.watch("x", x)

        strategy.run(step_fn, args=(x,))

    with strategy.scope():
        variable = tf.Variable([1.0, 2.0])
    for index in range(3):
        if index == 2:
            probe.set_step(10)
        step(tf.ones([4, 2]))
        probe.observe_variables([variable])
        probe.watch("given", tf.constant(1.0), step=100 + index)
    assert probe.next_step() == 11
    probe.close()
    events = _events(str(tmp_path))
    assert [s for s, _ in events["inputs/batch_size"]] == [0, 1, 10]
    assert [s for s, _ in events["watch/x/stats"]] == [0, 1, 10]
    assert [s for s, _ in events["variables/hash"]] == [0, 1, 10]
    assert [s for s, _ in events["watch/given/stats"]] == [100, 101, 102]
    assert step_time_schema.TAG_REPLICA_TIME not in events  # no scope: not timed


def test_the_full_variant_runs_at_a_fits_first_steps_and_logged_and_sampled_ones(tmp_path):
    """`write.variants`: the host's choice of the step function's variant, call by call."""
    probe = ReplicaProbe(str(tmp_path), mirrored(2), update_freq=5, examples_every=16)
    probe.set_step(0)  # as `fit` does: its first 16 steps are full
    probe.sample_last_of(23)  # the epoch's last step, 22
    full = [step for step in range(40) if probe.full_needed(step)]
    assert full == [*range(17), 20, 22, 25, 30, 32, 35]  # 16: sampled
    # A call of 4 steps (`steps_per_execution`) is full when one of them is.
    assert [probe.full_needed(step, 4) for step in (16, 27, 36)] == [True, True, False]
    assert [probe.full_needed(step, 2) for step in (16, 17, 23, 26, 33, 37)] == [
        True, False, False, False, False, False,
    ]  # fmt: skip
    probe.set_step(100)  # a second fit
    assert probe.full_needed(110) and not probe.full_needed(117)
    probe.every_step_full = True  # `halt_on`
    assert probe.full_needed(117)
    probe.close()
