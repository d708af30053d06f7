"""The watch family on a real MirroredStrategy (2 logical CPU replicas): `ReplicaProbe.watch` of
dense, ragged and sparse values, `gather_would_fail` checked against TensorFlow's own
`strategy.gather`, `nonfinite_values`, `per_replica_result`, the route and the report."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, mirrored

from tb_replica_plugin import analysis, group, reader
from tb_replica_plugin.core import jobs
from tb_replica_plugin.families.watch import present, schema
from tb_replica_plugin.read import judge

ROW = {name: index for index, name in enumerate(schema.STAT_ROWS)}


@pytest.fixture(scope="module")
def gather_child(tmp_path_factory):
    """`tests/watch_child.py`: the [4, 10] / [4, 12] loop, its clean twin, and what
    `strategy.gather` does on their outputs (a subprocess: a failing gather aborts the
    process's collectives)."""
    logdir = str(tmp_path_factory.mktemp("watch_gather"))
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "watch_child.py"), logdir],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return logdir, json.loads(result.stdout.strip().splitlines()[-1])


def test_outputs_4x10_and_4x12_give_gather_would_fail_and_tensorflow_gather_raises(gather_child):
    logdir, facts = gather_child
    # TensorFlow itself, on the same values.
    assert facts["mismatch_local_shapes"] == [[4, 10], [4, 12]]
    assert "mismatch_gather_shape" not in facts
    assert facts["mismatch_gather_error"].startswith("InvalidArgumentError")
    assert "Shape mismatch in the collective" in facts["mismatch_gather_error"]

    runs = group.read_log_dir(logdir)
    run = runs["mismatch"]
    logits = run.watch.values["logits"]
    assert [e["step"] for e in logits.shape_events] == [0]  # one change event, 3 steps
    assert logits.shape_events[0]["leaves"][0]["shapes"] == [[4, 10], [4, 12]]
    assert [s for s, _ in logits.stats] == [0, 1, 2]  # update_freq=1
    step0 = logits.stats[0][1]
    assert step0.shape == (1, len(schema.STAT_ROWS), 2)
    assert step0[0, ROW["values"]].tolist() == [40, 48]
    assert step0[0, ROW["nrows"]].tolist() == [4, 4]
    assert step0[0, ROW["mean"]].tolist() == [1.0, 1.0]

    findings = [f for f in judge.find_run(run) if f.kind == "gather_would_fail"]
    by_name = {f.name: f for f in findings}
    assert sorted(by_name) == ["logits", "returned"]
    found = by_name["logits"]
    assert found.severity == "warning"
    assert found.replicas == [0, 1] and found.value == [1]
    assert (found.first_step, found.last_step, found.count) == (0, 2, 3)
    assert "dim 1" in found.message
    assert "replica 0: [4, 10] float32; replica 1: [4, 12] float32" in found.message
    assert "pad or resize" in found.message


def test_clean_twin_gives_no_finding_and_explains_the_gathered_shape(gather_child):
    logdir, facts = gather_child
    run = group.read_log_dir(logdir)["clean"]
    kinds = [f.kind for f in judge.find_run(run)]
    assert kinds == ["per_replica_result"]  # asked for with explain=True; no problem
    (explained,) = judge.find_run(run)
    assert explained.severity == "info" and explained.replicas == [0, 1]
    assert "replica 0: [4, 10], replica 1: [4, 10]" in explained.message
    # The shape TensorFlow's own gather gave in the child process.
    assert facts["clean_gather_shape"] == [8, 10]
    assert "strategy.gather(value, axis=0) gives [8, 10]" in explained.message


def _watch_loop(strategy, run_dir, make_value, steps, name="value", update_freq=1, **probe_args):
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    probe = ReplicaProbe(run_dir, strategy, update_freq=update_freq, **probe_args)

    @tf.function
    def step(index):
        def step_fn():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            probe.watch(name, make_value(index, replica))
            return tf.constant(0)

        return strategy.run(step_fn)

    for index in range(steps):
        step(tf.constant(index))
    probe.close()
    assert probe.disabled_reason == "the probe was closed"


def test_nan_on_one_replica_is_recorded_at_its_step_between_logged_steps(tmp_path):
    import tensorflow as tf

    strategy = mirrored(2)

    def make_value(index, replica):
        base = tf.fill([3, 2], tf.cast(replica + 1, tf.float32))
        poisoned = tf.tensor_scatter_nd_update(base, [[1, 0], [2, 1]], [math.nan, math.inf])
        hit = tf.logical_and(tf.equal(index, 5), tf.equal(replica, 1))
        return tf.where(hit, poisoned, base)

    # Stats every 4 steps only: step 5 is not a logged step, the NaN event is written anyway.
    _watch_loop(strategy, str(tmp_path / "nan"), make_value, 8, update_freq=4, examples_every=4)
    run = group.read_log_dir(str(tmp_path))["nan"]
    value = run.watch.values["value"]
    assert [s for s, _ in value.stats] == [0, 4]
    assert [s for s, _ in value.nonfinite] == [5]
    counts = value.nonfinite[0][1]
    assert counts[0, ROW["nan"]].tolist() == [0, 1]
    assert counts[0, ROW["inf"]].tolist() == [0, 1]
    assert counts[0, ROW["min"]].tolist() == [1.0, 2.0]  # of the finite values
    assert counts[0, ROW["mean"]].tolist() == [1.0, 2.0]
    (found,) = judge.find_run(run)
    assert found.kind == "nonfinite_values" and found.severity == "error"
    assert found.replicas == [1] and (found.first_step, found.count) == (5, 1)
    assert "replica 1 at step 5 (1 NaN, 1 Inf in value)" in found.message


def test_ragged_and_sparse_leaves_in_cross_replica_context(tmp_path):
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    strategy = mirrored(2)
    rows = {0: [[1, 2], [3]], 1: [[4], [5, 6, 7], [8]]}
    dense_shapes = {0: [2, 5], 1: [3, 5]}

    def values(context):
        replica = context.replica_id_in_sync_group
        sparse = tf.sparse.SparseTensor(
            indices=[[0, 1], [1, 4]] if replica == 0 else [[0, 0], [2, 3], [2, 4]],
            values=[1.0, 2.0] if replica == 0 else [3.0, 4.0, 5.0],
            dense_shape=dense_shapes[replica],
        )
        return {"tokens": tf.ragged.constant(rows[replica]), "features": sparse}

    distributed = strategy.experimental_distribute_values_from_function(values)
    probe = ReplicaProbe(str(tmp_path / "composite"), strategy, update_freq=1)
    probe.watch("batch", distributed, step=0)
    probe.close()

    run = group.read_log_dir(str(tmp_path))["composite"]
    value = run.watch.values["batch"]
    (event,) = value.shape_events
    features, tokens = event["leaves"]
    assert tokens["name"] == "batch/tokens" and tokens["kinds"] == ["ragged", "ragged"]
    assert tokens["shapes"] == [[2, -1], [3, -1]]  # nrows, then the ragged dimension
    assert tokens["structure"] == [[3, 1, 2], [5, 1, 3]]  # values, shortest, longest row
    assert features["kinds"] == ["sparse", "sparse"]
    assert features["shapes"] == [[2, 5], [3, 5]]  # dense_shape
    assert features["structure"] == [[2, -1, -1], [3, -1, -1]]  # nnz
    assert not tokens["mismatch"] and not features["mismatch"]
    ((step, stats),) = value.stats
    assert step == 0 and value.leaves == ["batch/features", "batch/tokens"]
    sparse, ragged = stats
    assert ragged[ROW["nrows"]].tolist() == [2, 3]
    assert ragged[ROW["values"]].tolist() == [3, 5]
    assert ragged[ROW["row_min"]].tolist() == [1, 1]
    assert ragged[ROW["row_max"]].tolist() == [2, 3]
    assert ragged[ROW["min"]].tolist() == [1, 4] and ragged[ROW["max"]].tolist() == [3, 8]
    assert ragged[ROW["mean"]].tolist() == [2, 6]
    assert sparse[ROW["nrows"]].tolist() == [2, 3]
    assert sparse[ROW["values"]].tolist() == [2, 3]  # nnz
    assert sparse[ROW["mean"]].tolist() == [1.5, 4.0]
    assert np.isnan(sparse[ROW["row_min"]]).all()
    assert judge.find_run(run) == []  # ragged rows and leading dims may differ: gather works

    body = present.body("composite", run, {"max_points": 100})
    (entry,) = body["values"]
    assert entry["stats"]["steps"] == [0]
    assert entry["stats"]["values"][0][1][ROW["row_max"]] == [2, 3]
    assert entry["stats"]["values"][0][0][ROW["row_min"]] == [None, None]  # NaN -> null
    json.dumps(body, allow_nan=False)  # valid JSON for browsers


def test_sparse_values_with_different_widths_would_fail_to_gather(tmp_path):
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    strategy = mirrored(2)

    def values(context):
        width = 5 + context.replica_id_in_sync_group
        return tf.sparse.SparseTensor([[0, 1]], [1.0], [2, width])

    probe = ReplicaProbe(str(tmp_path / "sparse"), strategy, update_freq=1)
    probe.watch("ids", strategy.experimental_distribute_values_from_function(values), step=3)
    probe.close()
    run = group.read_log_dir(str(tmp_path))["sparse"]
    (found,) = judge.find_run(run)
    assert found.kind == "gather_would_fail" and found.first_step == 3
    assert found.value == [1] and found.replicas == [0, 1]
    assert "replica 0: [2, 5] float32 sparse; replica 1: [2, 6] float32 sparse" in found.message
    assert "tf.sparse.reset_shape" in found.message


def test_watch_rejects_a_bad_name_and_never_breaks_the_step(tmp_path):
    import warnings

    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    strategy = mirrored(2)
    probe = ReplicaProbe(str(tmp_path / "bad"), strategy, update_freq=1)
    with pytest.raises(ValueError, match="`name` must be a non-empty string"):
        probe.watch("", tf.constant(1.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe.watch("strings", tf.constant(["a", "b"]), step=0)  # no numeric stats: NaN
        probe.watch("nothing", {}, step=0)
    probe.close()
    assert [str(w.message) for w in caught] == [
        "tb_replica_plugin: watch('nothing') got no tensors."
    ]
    value = group.read_log_dir(str(tmp_path))["bad"].watch.values["strings"]
    stats = value.stats[0][1][0]
    assert stats[ROW["values"]].tolist() == [2, 2] and np.isnan(stats[ROW["min"]]).all()


def test_fit_records_each_named_output_per_replica_at_training_steps_only(tmp_path):
    import keras
    import tensorflow as tf

    from tb_replica_plugin import ReplicaCallback

    strategy = mirrored(2)
    # 17 examples, global batch 8: [4, 4], [4, 4], [1, 0] per epoch; validation is not recorded.
    x = np.arange(17 * 3, dtype="float32").reshape(17, 3)
    targets = {"a": np.ones((17, 2), "float32"), "b": np.zeros((17, 1), "float32")}
    with strategy.scope():
        inputs = keras.Input((3,))
        model = keras.Model(
            inputs,
            {
                "a": keras.layers.Dense(2, name="a")(inputs),
                "b": keras.layers.Dense(1, name="b")(inputs),
            },
        )
        model.compile(optimizer="sgd", loss={"a": "mse", "b": "mse"})
    dataset = tf.data.Dataset.from_tensor_slices((x, targets)).batch(8)
    callback = ReplicaCallback(str(tmp_path), run_name="fit")
    model.fit(dataset, epochs=2, verbose=0, validation_data=dataset, callbacks=[callback])

    run = group.read_log_dir(str(tmp_path))["fit"]
    value = run.watch.values["outputs"]
    assert value.leaves == ["outputs/a", "outputs/b"]
    # Every change of local shapes, at training steps: the last batch of each epoch is [1, 0].
    assert [e["step"] for e in value.shape_events] == [0, 2, 3, 5]
    assert [leaf["shapes"] for leaf in value.shape_events[1]["leaves"]] == [
        [[1, 2], [0, 2]],
        [[1, 1], [0, 1]],
    ]
    # Stats at sampled steps: step 0 (every 16th) and each epoch's last step.
    assert [s for s, _ in value.stats] == [0, 2, 5]
    assert [a[0, ROW["nrows"]].tolist() for _, a in value.stats] == [[4, 4], [1, 0], [1, 0]]
    assert [a[1, ROW["values"]].tolist() for _, a in value.stats] == [[4, 4], [1, 0], [1, 0]]
    assert run.inputs.batch_size.tolist() == [[4, 4], [4, 4], [1, 0]] * 2  # same step axis
    assert "outputs" not in [f.name for f in judge.find_run(run)]
    assert model.compute_loss.__func__ is type(model).compute_loss  # the hook was removed


def test_watch_route_runs_listing_and_report(gather_child):
    from bad_logs import wsgi_app
    from werkzeug import test as werkzeug_test
    from werkzeug import wrappers

    logdir, _ = gather_child
    app, _ = wsgi_app(logdir)
    client = werkzeug_test.Client(app, wrappers.Response)

    def get(path):
        response = client.get("/data/plugin/replicas" + path)
        text = response.get_data(as_text=True)
        return response.status_code, json.loads(text) if response.status_code < 400 else text

    status, body = get("/watch?run=mismatch")
    assert status == 200
    assert body["replicas"] == [0, 1] and body["stat_rows"] == list(schema.STAT_ROWS)
    logits = next(v for v in body["values"] if v["name"] == "logits")
    assert logits["leaves"] == ["logits"] and logits["stats"]["steps"] == [0, 1, 2]
    assert logits["shape_events"][0]["leaves"][0]["mismatch_dims"] == [1]
    assert logits["stats"]["values"][0][0][ROW["values"]] == [40, 48]
    kept = get("/watch?run=mismatch&max_points=2")[1]["values"][0]["stats"]  # the latest two
    assert kept["steps"] == [1, 2] and kept["dropped"] == 1
    status, body = get("/watch?run=nope")
    assert (status, body) == (404, "Not found: no replica data for run 'nope'")
    status, body = get("/runs")
    families = {entry["run"]: entry["families"] for entry in body["runs"]}
    assert families["mismatch"] == ["watch", "status"]  # watched, observed no inputs
    status, body = get("/findings?run=mismatch")
    assert [f["view"] for f in body["findings"]] == ["watch"] * 3

    run = group.read_log_dir(logdir)["mismatch"]
    report = present.report_json(run, analysis.Thresholds())["watch"]
    assert report["logits"]["last_stats_step"] == 2
    assert report["logits"]["last_stats"]["logits"]["values"] == [40, 48]
    lines = present.report_text(run, analysis.Thresholds())
    assert (
        "      step 0 logits: [4, 10]:float32  [4, 12]:float32  <-- gather(axis=0) fails" in lines
    )


def test_a_job_keeps_the_kind_and_structure_of_its_workers_ragged_inputs():
    from tb_replica_plugin.families.inputs import read as inputs_read

    def worker(index, rows, values):
        document = {
            "devices": [f"/job:worker/replica:0/task:{index}/device:CPU:0"],
            "replicas": [index],
            "source": "custom_loop",
            "worker": {"task_type": "worker", "task_index": index, "worker": index},
            "inputs": [
                {
                    "name": "ids",
                    "dtypes": ["int32"],
                    "kinds": ["ragged"],
                    "shapes": [[rows, -1]],
                    "structure": [[values, 1, 3]],
                }
            ],
        }
        event = inputs_read.parse_shape_event(0, json.dumps(document))
        series = inputs_read.build_inputs_series(f"job/worker_{index}", [event], [])
        return reader.RunData(series.run, inputs=series)

    members = [worker(0, 4, 7), worker(1, 3, 5)]
    merged = jobs.merge_all(inputs_read.InputsMerger, "job", members, [], [])
    (entry,) = merged.shape_events[0]["inputs"]
    assert entry["kinds"] == ["ragged", "ragged"] and entry["structure"] == [[7, 1, 3], [5, 1, 3]]
    assert entry["shapes"] == [[4, -1], [3, -1]] and not entry["mismatch"]
    assert merged.batch_size.tolist() == [[4, 3]]


def test_packed_stats_equal_the_exact_stats_where_every_value_is_finite():
    """What each replica sends every step (sum, min, max, L2 norm of a dense numeric leaf, in
    its own float dtype) gives its stats where every value is finite (to float32's precision for
    a float32 leaf); where one is not, the fault branch's exact stats (`leaf_stats`) are taken:
    together, the stats of every replica."""
    import tensorflow as tf

    from tb_replica_plugin.families.watch import stats

    x = np.arange(12, dtype="float32").reshape(3, 4)
    x[1, 2], x[2, 0] = np.nan, np.inf
    cases = [
        [tf.constant(x), tf.constant(x[:0]), tf.constant(-x[:2])],  # an empty replica
        [tf.constant([1, 5, 3]), tf.constant([7])],  # integers
        [tf.constant([True, False]), tf.constant([True])],
        [tf.constant(3.0), tf.constant(float("nan"))],  # scalars: nrows 1
    ]
    for values in cases:
        assert stats.packable(values)
        exact = np.stack([stats.leaf_stats(v).numpy() for v in values], axis=1)
        packed = tf.stack([tf.cast(tf.stack(stats.packed_values(v)), tf.float64) for v in values])
        broken = tf.logical_not(tf.math.is_finite(packed[:, 0]))  # the sum
        sizes = tf.constant([[float(np.size(v)) for v in values]], tf.float64)
        nrows = tf.constant([[float(v.shape[0]) if v.shape.rank else 1.0 for v in values]])
        nrows = tf.cast(nrows, tf.float64)
        # The fault branch's rows, taken where `broken`: the exact stats of every replica.
        host = stats.host_stats(packed, sizes, nrows, tf.constant(exact.T), broken).numpy()[0]
        np.testing.assert_allclose(host, exact, rtol=1e-6, equal_nan=True)
        # The packed values alone where every value is finite.
        finite = ~broken.numpy()
        alone = stats.host_stats(packed, sizes, nrows, None, broken).numpy()[0]
        np.testing.assert_allclose(alone[:, finite], exact[:, finite], rtol=1e-6, equal_nan=True)
    # Replica 0 of the first case (from the fault branch): min 0, max 11 (Inf and NaN left
    # out), 1 NaN, 1 Inf, 12 values, 3 rows.
    first = stats.leaf_stats(cases[0][0]).numpy()
    assert first[[0, 1, 4, 5, 6, 7]].tolist() == [0.0, 11.0, 1.0, 1.0, 12.0, 3.0]
    ragged = [tf.ragged.constant([[1.0], [2.0, 3.0]]), tf.ragged.constant([[4.0]])]
    assert not stats.packable(ragged)
    assert not stats.packable([tf.constant(["a"])])


def test_a_watched_value_pickles_its_stats_as_one_array_and_reads_back_the_same():
    """A worker read in another process is sent pickled: stats of one layout go as one array
    (not one array per step), and come back equal, step for step; stats of layouts that differ
    (a leaf added at step 2) go as they are."""
    import pickle

    from tb_replica_plugin.families.watch.read import WatchedValue

    rng = np.random.default_rng(0)
    alike = [(step, rng.normal(size=(1, 10, 8))) for step in range(0, 300, 3)]
    differ = [(0, np.ones((1, 10, 2))), (2, np.full((2, 10, 2), np.nan))]
    events = [{"step": 0, "explain": False, "leaves": []}]
    for stats, nonfinite in ((alike, differ), (alike[:1], [])):
        value = WatchedValue("logits", events, stats, nonfinite)
        sent = pickle.dumps(value)
        back = pickle.loads(sent)
        assert back.name == "logits" and back.shape_events == events
        for got, want in ((back.stats, stats), (back.nonfinite, nonfinite)):
            assert [s for s, _ in got] == [s for s, _ in want]
            for (_, a), (_, b) in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b)
                assert a.dtype == b.dtype
    # The 100 steps came as one array: each step's array is a row of it.
    back = pickle.loads(pickle.dumps(WatchedValue("x", [], alike, differ)))
    bases = {id(a.base) for _, a in back.stats}
    assert len(bases) == 1 and back.stats[0][1].base.shape == (100, 1, 10, 8)
    assert all(a.base is None for _, a in back.nonfinite)
