"""Fail fast (`halt_on`) and culprit capture, on a real MirroredStrategy (2 logical CPUs).

Replica 1 is fed one NaN example at step 5 (MLP Dense→ReLU→Dense, plain SGD, so the NaN reaches
every replica's weights through the all-reduce): with `halt_on="error"` fit stops after step 5,
the finding names replica 1 and step 5, and the exported `.npz` holds replica 1's batch of step 5
with the NaN example at the injected index; replica 0's batch is never captured.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored

import tb_replica_plugin
from tb_replica_plugin import ReplicaCallback, ReplicaProbe, cli
from tb_replica_plugin.write import halt

BATCH = 8  # 4 examples per replica
STEPS = 10
NAN_STEP = 5
NAN_INDEX = 1  # index in replica 1's local batch


def nan_data(nan_step=NAN_STEP, steps=STEPS):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * BATCH, 3)).astype("float32")
    y = rng.normal(size=(steps * BATCH, 1)).astype("float32")
    x[nan_step * BATCH + BATCH // 2 + NAN_INDEX, 2] = np.nan
    return x, y


def mlp(strategy):
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(4, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def fit_nan(logdir, halt_on, nan_step=NAN_STEP, steps=STEPS):
    strategy = mirrored(2)
    x, y = nan_data(nan_step, steps)
    model = mlp(strategy)
    callback = ReplicaCallback(logdir, halt_on=halt_on)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    return model, callback, x, y


def test_halt_on_error_stops_after_the_nan_step_and_keeps_the_batch(tmp_path, capsys):
    logdir = str(tmp_path)
    model, callback, x, y = fit_nan(logdir, "error")
    # Steps 0..5 ran, not one more.
    assert int(model.optimizer.iterations.numpy()) == NAN_STEP + 1
    assert callback.probe.next_step() == NAN_STEP + 1
    (finding,) = callback.stopped_by
    assert (finding.kind, finding.severity, finding.replicas, finding.first_step) == (
        "nonfinite_gradients",
        "error",
        [1],
        NAN_STEP,
    )
    printed = capsys.readouterr().out
    assert printed.count("stopping training") == 1
    assert "nonfinite_gradients (replica 1, step 5)" in printed
    # Restored as on any other end.
    assert "train_step" not in model.__dict__ and "compute_loss" not in model.__dict__
    assert "apply_gradients" not in model.optimizer.__dict__

    series = tb_replica_plugin.load(logdir).runs["replicas"].gradients
    assert [(b.step, b.replica) for b in series.batches] == [(NAN_STEP, 1)]
    out = str(tmp_path / "culprit.npz")
    argv = ["export-batch", logdir, "--run", "replicas", "--step", "5", "--replica", "1", out]
    assert cli.main(argv) == 0
    with np.load(out) as exported:
        start = NAN_STEP * BATCH + BATCH // 2
        np.testing.assert_array_equal(exported["x"], x[start : start + BATCH // 2])
        np.testing.assert_array_equal(exported["y"], y[start : start + BATCH // 2])
        bad_rows = np.flatnonzero(np.isnan(exported["x"]).any(axis=1)).tolist()
    assert bad_rows == [NAN_INDEX]
    assert series.batch(NAN_STEP, 1).nonfinite_examples == {"x": [NAN_INDEX]}
    # Replica 0's batch is not captured.
    argv[-3:] = ["--replica", "0", str(tmp_path / "none.npz")]
    assert cli.main(argv) == 2
    assert "no batch captured at step 5 for replica 0" in capsys.readouterr().err


def test_without_halt_on_training_runs_on_and_the_capture_is_kept(tmp_path):
    logdir = str(tmp_path)
    model, callback, x, _ = fit_nan(logdir, None)
    assert int(model.optimizer.iterations.numpy()) == STEPS
    assert callback.stopped_by == []
    series = tb_replica_plugin.load(logdir).runs["replicas"].gradients
    # The all-reduce wrote the NaN into the weights every replica shares (the fused
    # MatMul+ReLU keeps the later steps' outputs, losses and gradients finite).
    assert series.nonfinite_steps.tolist() == [NAN_STEP]
    assert np.isnan(model.layers[0].kernel.numpy()).any()
    assert [(b.step, b.replica) for b in series.batches] == [(NAN_STEP, 1)]
    captured = series.batch(NAN_STEP, 1)
    start = NAN_STEP * BATCH + BATCH // 2
    np.testing.assert_array_equal(captured.arrays["x"], x[start : start + BATCH // 2])
    assert captured.truncated == []

    # The tab's link: the plugin route serves the same batch as a .npz download (and again
    # from its cache).
    import io

    from test_store import PLUGIN, serve

    client = serve(logdir)[0]
    path = f"{PLUGIN}/gradients?run=replicas&batch_step={NAN_STEP}&batch_replica=1"
    for _ in range(2):
        response = client.get(path)
        assert response.status_code == 200
        assert "attachment" in response.headers["Content-Disposition"]
        with np.load(io.BytesIO(response.get_data())) as served:
            np.testing.assert_array_equal(served["x"], x[start : start + BATCH // 2])
    assert client.get(path.replace("batch_replica=1", "batch_replica=0")).status_code == 404


def _events(logdir):
    """`{(step, tag): value}` of every summary a run directory holds at a training step (wall
    times left out, and the status family's summaries, written at wall-clock steps); the step
    time's values, which are times, as the number of steps their window holds."""
    import glob

    values = {}
    for path in sorted(glob.glob(os.path.join(logdir, "replicas", "events.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                array = tf.make_ndarray(value.tensor)
                if value.tag.startswith("step_time/"):
                    values[(event.step, value.tag)] = array[-1]  # steps in its window
                elif not value.tag.startswith("status/"):
                    values[(event.step, value.tag)] = array
    return values


@pytest.mark.parametrize("as_functions", [True, False])
def test_branches_as_functions_or_lowered_record_the_same(tmp_path, monkeypatch, as_functions):
    """The sampled and fault branches record the same events whether they stay functions (CPU
    replicas, the default here) or are lowered into the step's graph (accelerators): NaN/Inf
    counts, the culprit batch, example overlaps and the outputs' stats, step for step."""
    from tb_replica_plugin.write import probe as probe_core

    runs = {}
    for mode in (as_functions, not as_functions):
        monkeypatch.setattr(probe_core, "BRANCHES_AS_FUNCTIONS", mode)
        keras.backend.clear_session()  # the same layer names in both runs
        keras.utils.set_random_seed(3)
        logdir = str(tmp_path / str(mode))
        _, callback, _, _ = fit_nan(logdir, None)
        assert callback._probe.branches_as_functions is mode  # noqa: SLF001
        runs[mode] = _events(logdir)
    first, second = runs[as_functions], runs[not as_functions]
    assert sorted(first) == sorted(second)
    tags = {tag for _, tag in first}
    for tag in ("gradients/nonfinite", "gradients/batch", "data/examples", "watch/outputs/stats"):
        assert tag in tags
    assert (NAN_STEP, "gradients/batch") in first
    for key, value in first.items():
        if value.dtype.kind == "f":
            np.testing.assert_allclose(value, second[key], rtol=1e-6, err_msg=str(key))
        else:
            np.testing.assert_array_equal(value, second[key], err_msg=str(key))


def test_run_if_keeps_a_function_branch_out_of_the_lowering():
    """`run_if(as_function=True)` marks its `If` not to be lowered (the branch stays a function),
    the default leaves it to TensorFlow; both run the body exactly where the condition holds."""
    from tb_replica_plugin.core.recorder import run_if

    counter = tf.Variable(0)
    graphs = {}
    for as_function in (True, False):

        @tf.function
        def step(flag, as_function=as_function):
            run_if(flag, lambda: counter.assign_add(1), as_function=as_function)

        for flag in (True, False, True):
            step(tf.constant(flag))
        graphs[as_function] = step.get_concrete_function(tf.constant(True)).graph
    assert int(counter.numpy()) == 4
    lowering = {
        mode: [
            op.get_attr("_lower_using_switch_merge")
            for op in graph.get_operations()
            if op.type in ("If", "StatelessIf")
        ]
        for mode, graph in graphs.items()
    }
    assert lowering == {True: [False], False: [True]}


def test_each_replicas_nonfinite_counts_are_taken_in_an_if_on_its_device():
    """Each replica's fault branch is a functional `If` on that replica's device, taking only its
    own tensors: its NaN/Inf counts where its packed sums of squares and loss are not finite,
    zeros where they are (the host gets them in the replica's one vector, no gradient)."""
    from tb_replica_plugin.core import transfer as transfer_lib
    from tb_replica_plugin.families.gradients import replica

    devices = ["/device:CPU:0", "/device:CPU:1"]
    nan, inf = float("nan"), float("inf")
    key, counts_key = ("gradients", "sq_loss"), ("gradients", "counts")

    @tf.function
    def vectors(grads, losses):
        transfer = transfer_lib.Transfer(devices)
        for index, packet in enumerate(transfer.packets):
            with tf.device(packet.device):
                values = replica.replica_values([grads[index]], losses[index])
                packet.floats(key, replica.packed_floats(values, True))

            def counts(values=values):
                return replica.nonfinite_counts(values.values, values.loss, True)

            packet.on_fault(counts_key, counts, 4, tf.int64, guard=[key])
        slots, _ = transfer_lib.common_layout(transfer)
        return [packet.vector(slots) for packet in transfer.packets]

    grads = (tf.constant([nan, 1.0, inf, inf]), tf.constant([2.0, 3.0, 4.0, 5.0]))
    losses = (tf.constant(inf), tf.constant(1.0))
    words = [v.numpy() for v in vectors(grads, losses)]
    # Each vector: 2 float words (sum of squares, loss), then the 4 counts.
    assert [w[2:].tolist() for w in words] == [[1, 2, 0, 1], [0, 0, 0, 0]]
    assert np.isnan(words[0][:1].view(np.float64)).all()
    assert words[1][:2].view(np.float64).tolist() == [27.0, 1.0]  # l2_loss: 54 / 2
    graph = vectors.get_concrete_function(grads, losses).graph
    ifs = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    assert [tf.DeviceSpec.from_string(op.device).device_index for op in ifs] == [0, 1]
    assert [op.get_attr("_lower_using_switch_merge") for op in ifs] == [False, False]
    # Each takes its own replica's gradient and loss (after its predicate), and its own packed
    # floats (its guard reads them), cast on its device: nothing else.
    producers = [sorted(t.op.name for t in op.inputs[1:]) for op in ifs]
    assert producers == [["Cast", "grads", "losses"], ["Cast_1", "grads_1", "losses_1"]]
    casts = [graph.get_operation_by_name(name) for name in ("Cast", "Cast_1")]
    assert [tf.DeviceSpec.from_string(op.device).device_index for op in casts] == [0, 1]


def test_halt_on_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="unknown finding kind.*'nan'.*nonfinite_gradients"):
        ReplicaCallback("unused", halt_on=["nan"])
    with pytest.raises(ValueError, match="`halt_on` must be None, 'error'"):
        ReplicaCallback("unused", halt_on="warning")
    with pytest.raises(ValueError, match="capture_bytes"):
        ReplicaCallback("unused", capture_bytes=0)
    assert halt.resolve_halt_on(["variable_drift"]) == frozenset({"variable_drift"})


def test_custom_loop_faults_and_truncated_capture(tmp_path):
    """A custom loop checks `probe.faults()` after each step; `capture_bytes` keeps first rows."""
    strategy = mirrored(2)
    x, y = nan_data()
    x[NAN_STEP * BATCH + BATCH // 2 + NAN_INDEX, 2] = 0.0
    x[NAN_STEP * BATCH + BATCH // 2, 0] = np.inf  # replica 1's first example
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1)
    # 2 inputs share 40 bytes: x keeps 1 row of 12 bytes, y (4 bytes a row) all 4 rows.
    probe = ReplicaProbe(str(tmp_path), strategy, update_freq=4, capture_bytes=40)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    )

    @tf.function
    def train_step(batch):
        def step_fn(features, labels):
            with tf.GradientTape() as tape:
                per_example = tf.square(model(features) - labels)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            probe.observe_gradients(
                grads, model.trainable_variables, loss=loss, scale=0.5, batch=(features, labels)
            )
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        strategy.run(step_fn, args=batch)

    stopped_at, found = None, []
    for step, batch in enumerate(dataset):
        train_step(batch)
        found = probe.faults()
        if found:
            stopped_at = step
            break
    probe.close()
    assert stopped_at == NAN_STEP
    (finding,) = found
    assert (finding.kind, finding.replicas, finding.first_step) == ("nonfinite_gradients", [1], 5)
    series = tb_replica_plugin.load(str(tmp_path)).runs["."].gradients
    (captured,) = series.batches
    assert (captured.step, captured.replica) == (NAN_STEP, 1)
    assert captured.shapes == {"0": [4, 3], "1": [4, 1]}
    assert captured.truncated == ["0"]
    start = NAN_STEP * BATCH + BATCH // 2
    np.testing.assert_array_equal(captured.arrays["0"], x[start : start + 1])
    np.testing.assert_array_equal(captured.arrays["1"], y[start : start + 4])
    assert captured.nonfinite_examples == {"0": [0]}


def test_capture_blocks_of_uneven_replicas_read_back_row_for_row():
    """Each local replica's block (one set of ops for all) reads back as that replica's batch:
    full shapes, the first rows within the byte budget (strings and an uneven last batch)."""
    from tb_replica_plugin.families.gradients import capture
    from tb_replica_plugin.families.gradients import read as gradients_read

    x = np.arange(24, dtype=np.float32).reshape(6, 4)  # 16 bytes a row
    words = np.array([b"a", b"bb", b"ccc", b"dddd", b"e", b"f"], dtype=object)
    batch = [[x[:5], words[:5]], [x[5:], words[5:]]]  # replicas of 5 and 1 examples
    blocks = capture.capture_blocks([2, 3], ["x", "w"], batch, 64, ["/cpu:0", "/cpu:0"])
    assert blocks.shape == (2, 5)
    first, second = gradients_read.parse_batches(7, blocks.numpy().reshape(-1))
    assert (first.step, first.replica, second.replica) == (7, 2, 3)
    assert first.shapes == {"x": [5, 4], "w": [5]} and second.shapes == {"x": [1, 4], "w": [1]}
    np.testing.assert_array_equal(first.arrays["x"], x[:2])  # 32 bytes per leaf: 2 rows
    assert first.arrays["w"].tolist() == [b"a", b"bb", b"ccc", b"dddd", b"e"]
    assert first.truncated == ["x"]
    np.testing.assert_array_equal(second.arrays["x"], x[5:])
    assert second.arrays["w"].tolist() == [b"f"] and second.truncated == []


def test_custom_loop_check_time_fault_stops_at_the_check(tmp_path):
    """duplicate_examples (an unsharded pipeline) is found at the first check, not before."""
    strategy = mirrored(2)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 3)).astype("float32")

    def dataset_fn(input_context):  # ignores input_context: every replica gets the same data
        return tf.data.Dataset.from_tensor_slices(x).batch(4)

    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_fetch_to_device=False,
    )
    dataset = strategy.distribute_datasets_from_function(dataset_fn, options)
    probe = ReplicaProbe(
        os.path.join(str(tmp_path), "run"),
        strategy,
        update_freq=4,
        examples_every=1,
        halt_on=["duplicate_examples"],
    )

    @tf.function
    def train_step(batch):
        def step_fn(features):
            probe.observe_inputs({"x": features})
            probe.observe_examples({"x": features})

        strategy.run(step_fn, args=(batch,))

    checked = []
    for step, batch in enumerate(dataset):
        train_step(batch)
        found = probe.faults(check=step % 4 == 3)
        checked.append(step)
        if found:
            break
    probe.close()
    assert checked == [0, 1, 2, 3]
    (finding,) = found
    assert (finding.kind, finding.replicas, finding.first_step) == ("duplicate_examples", [0, 1], 0)
    with pytest.raises(halt.ReplicaFaultError, match="duplicate_examples"):
        raise halt.ReplicaFaultError(found)


def test_fit_check_time_fault_stops_at_the_epoch_end_check(tmp_path):
    """A stock Dropout draws the same mask on every replica (`identical_rng_streams`): with
    `update_freq="epoch"` it is seen at the first epoch end, and fit stops there."""
    strategy = mirrored(2)
    x, y = nan_data()
    x = np.nan_to_num(x)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dropout(0.3),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    callback = ReplicaCallback(str(tmp_path), halt_on=["identical_rng_streams"])
    history = model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[callback])
    assert len(history.history["loss"]) == 1  # stopped at the end of epoch 0
    assert int(model.optimizer.iterations.numpy()) == STEPS
    (finding,) = callback.stopped_by
    assert (finding.kind, finding.severity, finding.replicas) == (
        "identical_rng_streams",
        "warning",
        [0, 1],
    )
    assert finding.last_step == STEPS - 1


def test_cross_replica_capture_and_a_batch_that_is_not_per_replica(tmp_path):
    """Cross-replica calls capture a PerReplica batch; a plain tensor batch warns once and the
    gradients are recorded without it."""
    strategy = mirrored(2)
    with strategy.scope():
        variable = tf.Variable([1.0, 2.0])

    def bad_fn(ctx):
        return tf.constant([np.inf, 0.0]) if ctx.replica_id_in_sync_group else tf.ones(2)

    def batch_fn(ctx):
        return tf.fill([3, 2], float(ctx.replica_id_in_sync_group))

    good = str(tmp_path / "good")
    with ReplicaProbe(good, strategy, update_freq=1) as probe:
        bad = strategy.experimental_distribute_values_from_function(bad_fn)
        batch = strategy.experimental_distribute_values_from_function(batch_fn)
        probe.observe_gradients([bad], [variable], step=3, batch={"x": batch})
    (captured,) = tb_replica_plugin.load(good).runs["."].gradients.batches
    assert (captured.step, captured.replica) == (3, 1)
    np.testing.assert_array_equal(captured.arrays["x"], np.ones((3, 2), np.float32))

    plain = str(tmp_path / "plain")
    probe = ReplicaProbe(plain, strategy, update_freq=1)
    with pytest.warns(RuntimeWarning, match="not per-replica"), probe:
        bad = strategy.experimental_distribute_values_from_function(bad_fn)
        probe.observe_gradients([bad], [variable], step=3, batch=tf.ones([3, 2]))
    series = tb_replica_plugin.load(plain).runs["."].gradients
    assert series.nonfinite_steps.tolist() == [3] and series.batches == []


def _job_worker_probe(tmp_path):
    """`(strategy, variable, probe)` of a worker of 2 replicas in a job with `halt_on`:
    MirroredStrategy(2), a mirrored variable, a probe with `sync_faults` on (what `build` sets on
    a worker of a job)."""
    strategy = mirrored(2)
    with strategy.scope():
        variable = tf.Variable([1.0, 2.0])
    probe = ReplicaProbe(str(tmp_path), strategy, update_freq=1, halt_on="error")
    probe.build()
    probe.recorder("gradients").sync_faults = True
    return strategy, variable, probe


def test_cross_replica_fault_of_a_worker_with_two_replicas_is_a_job_fault(tmp_path):
    """The cross-replica branch with `sync_faults` (set in a job) on a worker of 2 replicas:
    MirroredStrategy(2) stands for that worker (tests/test_multiworker.py runs the 2-worker
    job, one replica each). Replica 1's Inf is counted by the all-reduce over every replica,
    so the job fault slot is set and `faults()` names replica 1 at that step."""
    from tb_replica_plugin.families.gradients import record

    strategy, variable, probe = _job_worker_probe(tmp_path)
    bad = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant([np.inf, 0.0]) if ctx.replica_id_in_sync_group else tf.ones(2)
    )
    probe.observe_gradients([bad], [variable], step=3)
    state = probe.recorder("gradients").fault_slots()
    assert state[[record.FAULT_LAST, record.FAULT_LOCAL, record.FAULT_JOB]].tolist() == [3, 1, 1]
    (finding,) = probe.faults()
    assert (finding.kind, finding.replicas, finding.first_step) == ("nonfinite_gradients", [1], 3)
    probe.close()


def test_stop_flag_leaves_out_an_empty_batch_s_nan_loss_with_finite_gradients():
    """`sync_faults`' per-replica flag: a NaN loss stops the job unless the replica's batch was
    empty and its gradients finite (the inputs family's `empty_shard`, as the device fault record
    and the rules judge it); NaN gradients stop it whatever the batch."""
    from tb_replica_plugin.families.gradients import replica

    nan = tf.constant(float("nan"))
    empty, full = [tf.zeros([0, 3])], [tf.zeros([2, 3])]
    clean = replica.replica_values([tf.zeros([2])], nan)
    broken = replica.replica_values([tf.constant([np.nan, 0.0])], nan)
    flags = [
        replica.stop_flag(clean, True, False, empty),
        replica.stop_flag(clean, True, False, full),
        replica.stop_flag(clean, True, False),  # no batch given: the loss alone decides
        replica.stop_flag(clean, True, True, empty),  # loss-scaled: the loss alone stops
        replica.stop_flag(clean, True, False, [tf.constant(1.0), *empty]),  # a scalar leaf skipped
        replica.stop_flag(broken, True, False, empty),
        replica.stop_flag(broken, False, False, empty),
    ]
    assert [float(flag) for flag in flags] == [0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]


def test_an_empty_batch_s_nan_loss_is_no_job_fault_in_replica_context(tmp_path):
    """Replica context with `sync_faults` (a worker of a job): replica 1's batch is empty and
    its loss NaN, its gradients zero. The job's all-reduced count stays 0: no job fault, so
    `halt_on` does not stop every worker for what the rules call `empty_shard`."""
    from tb_replica_plugin.families.gradients import record

    strategy, variable, probe = _job_worker_probe(tmp_path)

    @tf.function
    def step():
        def replica_fn():
            replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
            rows = tf.where(replica_id > 0, 0, 2)
            batch = tf.zeros(tf.stack([rows, 3]))
            loss = tf.reduce_mean(batch)  # NaN for the empty batch
            probe.observe_gradients([tf.zeros([2])], [variable], loss=loss, batch=batch, step=4)

        strategy.run(replica_fn)

    step()
    state = probe.recorder("gradients").fault_slots()
    assert int(state[record.FAULT_JOB]) == 0
    assert probe.faults() == []
    probe.close()


# A plain step (`write.variants`): after the fit's first 16 steps, neither sampled (16, 32) nor
# logged, nor the epoch's last.
PLAIN_NAN_STEP = 21


def test_a_nan_at_a_plain_step_is_reported_at_its_step_and_replica(tmp_path):
    logdir = str(tmp_path / "plain")
    model, callback, x, _ = fit_nan(logdir, None, nan_step=PLAIN_NAN_STEP, steps=40)
    assert int(model.optimizer.iterations.numpy()) == 40 and callback.stopped_by == []
    report = tb_replica_plugin.load(logdir)
    series = report.runs["replicas"].gradients
    # Kept on the replicas' devices, written by the host at the end of the fit.
    assert series.plain_faults.tolist() == [[0, 1], [-1, PLAIN_NAN_STEP], [-1, PLAIN_NAN_STEP]]
    assert series.nonfinite_steps.tolist() == [PLAIN_NAN_STEP]
    counts = series.nonfinite[0]
    assert counts[:, 0].tolist() == [0, 0, 0, 0] and counts[0, 1] > 0  # NaN gradient values
    (finding,) = [f for f in report.findings["replicas"] if f.kind == "nonfinite_gradients"]
    assert (finding.replicas, finding.first_step, finding.severity) == (
        [1],
        PLAIN_NAN_STEP,
        "error",
    )
    # The culprit batch, kept on replica 1's device (a CPU) at that step.
    captured = series.batch(PLAIN_NAN_STEP, 1)
    start = PLAIN_NAN_STEP * BATCH + BATCH // 2
    np.testing.assert_array_equal(captured.arrays["x"], x[start : start + BATCH // 2])
    assert captured.nonfinite_examples == {"x": [NAN_INDEX]}
    # With `halt_on` every step is full: fit stops right after that step.
    halted = str(tmp_path / "halted")
    model, callback, _, _ = fit_nan(halted, "error", nan_step=PLAIN_NAN_STEP, steps=40)
    assert int(model.optimizer.iterations.numpy()) == PLAIN_NAN_STEP + 1
    (finding,) = [f for f in callback.stopped_by if f.kind == "nonfinite_gradients"]
    assert (finding.replicas, finding.first_step) == ([1], PLAIN_NAN_STEP)
