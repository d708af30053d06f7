"""Data family: per-example fingerprints and the examples replicas share, checked by hand.

In-process on 2 replicas (replica context in a tf.function and cross-replica context eagerly),
and on the 4-replica demo (`demo_logs`): the unsharded `distribute_datasets_from_function`
pipeline is flagged at every step with every replica pair, its sharded twin never.
"""

import json
import os
import subprocess

import numpy as np
import tensorflow as tf
from conftest import VENV_BIN, TensorBoardServer, http_get, mirrored, small_model
from tensorboard.compat.proto import types_pb2

import tb_replica_plugin
from demo import scenarios
from tb_replica_plugin import ReplicaProbe, analysis
from tb_replica_plugin.core import json_stream
from tb_replica_plugin.core.downsample import json_floats
from tb_replica_plugin.families.examples import read as examples_read
from tb_replica_plugin.families.examples import record as data_collector
from tb_replica_plugin.families.examples import rules as examples_rules


def only_run(logdir):
    report = tb_replica_plugin.load(logdir)
    (name,) = report.runs
    return report.runs[name], report.findings[name]


def rows(tensor):
    return [tuple(np.asarray(row).reshape(-1).tolist()) for row in np.asarray(tensor)]


def test_shared_examples_match_a_hand_count_eagerly(tmp_path):
    """Cross-replica context (PerReplica batch), 3-step windows, a few repeated records."""
    strategy = mirrored(2)
    # 24 examples, batch 8 → replicas get 4 each; some records repeat across the two halves.
    values = np.arange(24, dtype="float32")
    values[[4, 12, 13, 20]] = values[[0, 8, 9, 16]]
    labels = (values % 3).astype("int64")
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices({"v": values[:, None], "label": labels}).batch(8)
    )
    expected_shared, expected_distinct = [], []
    with ReplicaProbe(str(tmp_path), strategy, update_freq=3, examples_every=1) as probe:
        for batch in dataset:
            local = [
                set(zip(rows(v), rows(lab), strict=True))
                for v, lab in zip(
                    strategy.experimental_local_results(batch["v"]),
                    strategy.experimental_local_results(batch["label"]),
                    strict=True,
                )
            ]
            expected_shared.append(len(local[0] & local[1]))
            expected_distinct.append([len(s) for s in local])
            probe.observe_examples(batch)
    run, findings = only_run(str(tmp_path))
    series = run.data
    assert series.sampled is False
    assert expected_shared == [1, 2, 1]
    # update_freq=3: steps 0 and 3 are written in-graph, and close() writes the last one (2).
    assert series.steps.tolist() == [0, 2]
    assert series.window_steps.tolist() == [1, 2]
    assert series.shared[:, 0, 1].tolist() == [expected_shared[0], expected_shared[2]]
    assert series.window_shared[:, 0, 1].tolist() == [1, 3]
    assert series.steps_shared[:, 0, 1].tolist() == [1, 2]
    assert series.distinct.tolist() == [expected_distinct[0], expected_distinct[2]]
    assert series.window_duplicated.tolist() == [[1, 1], [3, 3]]
    # 4 of 12 examples per replica are also on the other replica: over the 1 % threshold.
    (finding,) = findings
    assert (finding.kind, finding.replicas, finding.count, finding.first_step) == (
        "duplicate_examples",
        [0, 1],
        3,
        0,
    )
    assert finding.value == round(4 / 12, 6)
    loose = examples_rules.find_data(series, analysis.Thresholds(max_duplicate_share=0.5))
    assert loose == []
    # The overlap is written in int32, schema version 2.
    (value,) = written_values(str(tmp_path), "data/overlap")[:1]
    assert value.tensor.dtype == types_pb2.DT_INT32
    assert json.loads(value.metadata.plugin_data.content) == {"kind": "data_overlap", "version": 2}


def written_values(logdir, tag):
    """The `Summary.Value`s of `tag` in the event files under `logdir`, in order."""
    from tensorboard.backend.event_processing import event_file_loader

    found = []
    for directory, _, names in sorted(os.walk(logdir)):
        for name in sorted(n for n in names if "tfevents" in n):
            loader = event_file_loader.EventFileLoader(os.path.join(directory, name))
            found.extend(v for event in loader.Load() for v in event.summary.value if v.tag == tag)
    return found


def write_examples_run(run_dir, overlap_dtype, version):
    """A run of one logged step of the examples family, its overlap in `overlap_dtype` with
    schema `version` (1: int64, as written before version 2's int32), without TensorFlow."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    from tb_replica_plugin.families.examples import schema

    examples = np.array([[4, 4, 1, 1, 11, 12, 13], [4, 3, 1, 1, 11, 14, 15]], np.int64)
    overlap = np.array([[[4, 1], [1, 3]], [[4, 1], [1, 3]], [[1, 1], [1, 1]]], overlap_dtype)
    writer = EventFileWriter(run_dir)
    for tag, kind, value, written in (
        (schema.TAG_DATA_EXAMPLES, schema.KIND_DATA_EXAMPLES, examples, 1),
        (schema.TAG_DATA_OVERLAP, schema.KIND_DATA_OVERLAP, overlap, version),
    ):
        content = json.dumps({"kind": kind, "version": written}).encode()
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(
                plugin_name="replicas", content=content
            ),
            data_class=summary_pb2.DATA_CLASS_TENSOR,
        )
        event = event_pb2.Event(step=0, wall_time=1.0)
        event.summary.value.add(
            tag=tag, metadata=metadata, tensor=tensor_util.make_tensor_proto(value)
        )
        writer.add_event(event)
    writer.close()


def test_overlap_of_schema_version_1_int64_reads_as_version_2(tmp_path):
    """Runs written before the overlap became int32 read to the same series."""
    write_examples_run(str(tmp_path / "old"), np.int64, 1)
    write_examples_run(str(tmp_path / "new"), np.int32, 2)
    report = tb_replica_plugin.load(str(tmp_path))
    old, new = report.runs["old"].data, report.runs["new"].data
    assert old.shared.dtype == new.shared.dtype == np.int64
    assert old.shared.tolist() == new.shared.tolist() == [[[4, 1], [1, 3]]]
    assert old.window_steps.tolist() == new.window_steps.tolist() == [1]
    assert report.runs["old"].notes == report.runs["new"].notes == []


def test_examples_every_samples_every_nth_and_every_logged_step(tmp_path):
    """examples_every=3 with update_freq=4 over 10 steps: sampled steps 0, 3, 4, 6, 8, 9 (every
    3rd and every logged one); written: the logged steps 0, 4, 8 and, at close, 9; the windows
    count and sum the sampled steps only."""
    strategy = mirrored(2)
    # 10 steps of 2 examples per replica; replica 1 repeats replica 0's examples at steps 1, 4, 9.
    values = np.arange(40, dtype="float32")
    for step in (1, 4, 9):
        values[4 * step + 2 : 4 * step + 4] = values[4 * step : 4 * step + 2]
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(values[:, None]).batch(4)
    )
    probe = ReplicaProbe(str(tmp_path), strategy, update_freq=4, examples_every=3)

    @tf.function
    def train_step(batch):
        def step_fn(x):
            probe.observe_inputs({"x": x})
            probe.observe_examples({"x": x})
            return tf.reduce_sum(x)

        return strategy.run(step_fn, args=(batch,))

    for batch in dataset:
        train_step(batch)
    probe.close()
    run, findings = only_run(str(tmp_path))
    series = run.data
    assert series.steps.tolist() == [0, 4, 8, 9]
    assert series.window_steps.tolist() == [1, 2, 2, 1]  # {0}, {3, 4}, {6, 8}, {9}
    assert series.window_start.tolist() == [0, 1, 5, 9]
    assert series.sampled is True
    # Shared examples at the logged step and summed over the sampled steps of the window: step
    # 1 (duplicated, not sampled) is in no window.
    assert series.shared[:, 0, 1].tolist() == [0, 2, 0, 2]
    assert series.window_shared[:, 0, 1].tolist() == [0, 2, 0, 2]
    assert series.steps_shared[:, 0, 1].tolist() == [0, 1, 0, 1]
    assert series.batch_size.tolist() == [[2, 2]] * 4
    (finding,) = findings
    assert (finding.replicas, finding.count, finding.first_step, finding.last_step) == (
        [0, 1],
        2,
        1,
        9,
    )
    assert "(at 2 of 6 sampled steps;" in finding.message
    assert "examples (6 sampled steps)" in tb_replica_plugin.load(str(tmp_path)).to_text()


def test_fit_samples_examples_at_every_nth_step_and_each_epoch_end(tmp_path):
    """ReplicaCallback(examples_every=3), update_freq="epoch", 2 epochs of 5 steps: sampled
    steps 0, 3, 4 (epoch end) | 6, 9; written at the epoch ends 4 and 9."""
    strategy = mirrored(2)
    x = np.arange(40, dtype="float32").reshape(40, 1)
    model = small_model(strategy, 1)
    model.fit(
        tf.data.Dataset.from_tensor_slices((x, x)).batch(8),
        epochs=2,
        verbose=0,
        callbacks=[tb_replica_plugin.ReplicaCallback(str(tmp_path), examples_every=3)],
    )
    run, _ = only_run(str(tmp_path))
    series = run.data
    assert series.steps.tolist() == [4, 9]
    assert series.window_steps.tolist() == [3, 2]
    assert series.window_start.tolist() == [0, 5]
    assert series.sampled is True
    assert series.window_shared[:, 0, 0].tolist() == [12, 8]  # 4 distinct examples per step
    assert series.distinct.tolist() == [[4, 4], [4, 4]]
    assert series.window_shared[:, 0, 1].tolist() == [0, 0]
    # Every step is still in the inputs family.
    assert run.inputs.steps.tolist() == list(range(10))


def test_fingerprints_and_sketch_layout():
    x = tf.constant([[1.0, 2.0], [1.0, 2.0], [3.0, 4.0]])
    y = tf.constant([0, 0, 1])
    fingerprints = data_collector.example_fingerprints([x, y]).numpy()
    assert fingerprints[0] == fingerprints[1] != fingerprints[2]
    assert data_collector.example_fingerprints([x]).numpy()[0] != fingerprints[0]
    # A leaf without the batch's leading dimension contributes zeros, it does not fail.
    odd = data_collector.example_fingerprints([x, tf.constant([7, 8])]).numpy()
    assert odd.shape == (3,)
    strings = data_collector.example_fingerprints([tf.constant(["a", "b", "a"])]).numpy()
    assert strings[0] == strings[2] != strings[1]
    assert data_collector.example_fingerprints([tf.zeros([0, 3])]).numpy().shape == (0,)
    stats = data_collector.OverlapStats(
        [tf.constant([5, 3, 3, 9], tf.int64), tf.constant([9, 1], tf.int64)], sketch_size=3
    )
    assert stats.batch_size.numpy().tolist() == [4, 2]
    assert stats.distinct.numpy().tolist() == [3, 2]
    assert stats.shared.numpy().tolist() == [[3, 1], [1, 2]]
    assert stats.duplicated.numpy().tolist() == [1, 1]
    assert stats.sketch.numpy().tolist() == [[3, 5, 9], [1, 9, 0]]


def pipeline_logs(logdir, sharded):
    strategy = mirrored(2)
    scenarios.pipeline_run(strategy, logdir, sharded=sharded, examples=48, global_batch=8)
    return only_run(os.path.join(logdir))


def test_unsharded_pipeline_flagged_at_every_step_on_2_replicas(tmp_path):
    run, findings = pipeline_logs(str(tmp_path), sharded=False)
    series = run.data
    # Each replica reads the whole dataset: 48 / 4 per replica = 12 steps, all identical.
    assert series.steps.tolist() == list(range(12))
    assert series.shared[:, 0, 1].tolist() == [4] * 12
    assert (series.sketch[:, 0] == series.sketch[:, 1]).all()
    (finding,) = [f for f in findings if f.kind == "duplicate_examples"]
    assert (finding.replicas, finding.first_step, finding.last_step, finding.count) == (
        [0, 1],
        0,
        11,
        12,
    )
    assert finding.value == 1.0
    assert "Replicas 0 and 1 were fed the same examples at the same step (at every step" in (
        finding.message
    )
    assert "input_context.input_pipeline_id" in finding.message


def test_sharded_pipeline_has_no_duplicates_on_2_replicas(tmp_path):
    run, findings = pipeline_logs(str(tmp_path), sharded=True)
    series = run.data
    assert series.steps.tolist() == list(range(6))
    assert series.shared[:, 0, 1].tolist() == [0] * 6
    assert series.distinct.tolist() == [[4, 4]] * 6
    assert findings == []


def test_demo_pipelines_on_4_replicas(demo_logs):
    report = tb_replica_plugin.load(demo_logs, run="*_pipeline/replicas")
    unsharded = report.runs["unsharded_pipeline/replicas"].data
    steps = unsharded.steps.size
    assert steps == 256 // 8  # every replica reads all 256 examples, 8 per step
    pairs = [(r, q) for r in range(4) for q in range(r + 1, 4)]
    for r, q in pairs:
        assert unsharded.shared[:, r, q].tolist() == [8] * steps
        assert unsharded.steps_shared[:, r, q].tolist() == [1] * steps
    (finding,) = report.findings["unsharded_pipeline/replicas"]
    assert (finding.kind, finding.replicas, finding.first_step, finding.last_step) == (
        "duplicate_examples",
        [0, 1, 2, 3],
        0,
        steps - 1,
    )
    assert finding.count == steps
    assert finding.message.startswith("Replicas 0–3 were fed the same examples")
    sharded = report.runs["sharded_pipeline/replicas"].data
    assert sharded.steps.tolist() == list(range(8))
    assert (sharded.shared.sum(axis=0) == np.diag(np.diagonal(sharded.shared.sum(axis=0)))).all()
    assert report.findings["sharded_pipeline/replicas"] == []


def test_sketch_written_by_another_process_matches_this_one(demo_logs):
    """Fingerprints are deterministic across processes: the demo subprocess's sketch of the
    sharded pipeline's first step equals the one computed here for the same examples."""
    report = tb_replica_plugin.load(demo_logs, run="sharded_pipeline/replicas")
    series = report.runs["sharded_pipeline/replicas"].data
    x, y = scenarios._regression_data(256)
    for replica in range(4):
        index = np.arange(replica, 256, 4)[:8]  # dataset.shard(4, replica), first batch of 8
        local = data_collector.example_fingerprints([x[index], y[index]])
        expected = np.sort(np.unique(local.numpy()))[: data_collector.SKETCH_SIZE]
        sketch = series.sketch[0, replica]
        assert sketch[: expected.size].tolist() == expected.tolist()
        assert (sketch[expected.size :] == 0).all()


def test_find_data_partial_overlap_message():
    steps = np.array([0, 1])
    shared = np.array([[[4, 2, 0], [2, 4, 0], [0, 0, 4]]] * 2)
    steps_shared = np.array([[[1, 1, 0], [1, 1, 0], [0, 0, 1]]] * 2)
    series = examples_read.DataSeries(
        run="r",
        replicas=[0, 1, 2],
        steps=steps,
        window_steps=np.array([1, 1]),
        batch_size=np.full((2, 3), 4),
        distinct=np.full((2, 3), 4),
        duplicated=np.array([[2, 2, 0]] * 2),
        window_duplicated=np.array([[2, 2, 0]] * 2),
        shared=shared,
        window_shared=shared,
        steps_shared=steps_shared,
        sketch=np.zeros((2, 3, 16), np.int64),
        notes=[],
    )
    (finding,) = examples_rules.find_data(series)
    assert (finding.replicas, finding.count, finding.value) == ([0, 1], 2, 0.5)
    assert "0–1: 50%" in finding.message


def test_rng_data_and_replica_blocks_routes_on_rustboard(demo_logs):
    server = TensorBoardServer(demo_logs, load_fast=True)
    try:
        base = server.url + "/data/plugin/replicas"
        server.wait_for(
            "/data/plugin/replicas/runs",
            lambda status, body: status == 200 and len(json.loads(body)["runs"]) >= 9,
        )
        status, body, _ = http_get(base + "/data?run=unsharded_pipeline/replicas")
        data = json.loads(body)
        assert status == 200
        assert data["replicas"] == [0, 1, 2, 3] and data["total_steps"] == 32
        assert data["share"] == [[1.0] * 4] * 4
        assert data["steps_shared"] == [[32] * 4] * 4
        assert data["duplicate_share"][0] == [1.0] * 4
        assert len(data["last_sketch"][0]) == 8 and data["last_sketch"][0] == data["last_sketch"][3]
        status, body, _ = http_get(base + "/rng?run=dropout_fit/replicas&max_points=3")
        rng = json.loads(body)
        assert status == 200 and rng["downsampled"] is True and rng["logged_steps"] == 8
        assert len(rng["steps"]) == 3 and rng["steps"][0] == 0 and rng["steps"][-1] == 7
        (dropout,) = rng["generators"]
        assert (dropout["name"], dropout["kind"], dropout["mirrored"]) == (
            "dropout",
            "keras.SeedGenerator",
            True,
        )
        assert dropout["match"] == [[1.0] * 4] * 4
        assert dropout["stream_groups"] == [[0, 0, 0, 0]] * 3
        # matrix_side: more replicas than that get blocks r * P // R, each the largest share of
        # its pairs r != q (-1: a block of one replica on the diagonal).
        _, body, _ = http_get(base + "/rng?run=dropout_fit/replicas&matrix_side=3")
        (blocks,) = json.loads(body)["generators"]
        assert blocks["match"] == [[1.0, 1.0, 1.0], [1.0, -1.0, 1.0], [1.0, 1.0, -1.0]]
        assert blocks["pooled"] == {"side": 3, "pairs_above_0": 6}
        _, body, _ = http_get(base + "/rng?run=dropout_fit/replicas&matrix_side=4")
        (whole,) = json.loads(body)["generators"]
        assert whole["match"] == [[1.0] * 4] * 4 and "pooled" not in whole
        _, body, _ = http_get(base + "/data?run=unsharded_pipeline/replicas&matrix_side=2")
        data = json.loads(body)
        assert data["share"] == [[1.0, 1.0], [1.0, 1.0]] and data["steps_shared"] == [[32, 32]] * 2
        assert data["pooled"] == {"side": 2, "pairs_above_0": 6} and len(data["replicas"]) == 4
        # replica_blocks: the top variables' per-replica drift series in blocks r * P // R of
        # replicas, each the largest value of its replicas.
        drift = base + "/variables?run=weight_drift/skipped_allreduce&top=4"
        whole = json.loads(http_get(drift)[1])
        blocks = json.loads(http_get(drift + "&replica_blocks=3")[1])
        assert blocks["pooled"] == {"blocks": [[0, 1], [2, 2], [3, 3]]} and "pooled" not in whole
        assert len(whole["top"]) == len(blocks["top"]) == 4
        for every, pooled in zip(whole["top"], blocks["top"], strict=True):
            for key in ("rel_l2", "max_abs"):
                assert pooled[key] == [[max(r[:2]), r[2], r[3]] for r in every[key]], key
            assert pooled["max_rel_l2"] == every["max_rel_l2"] and max(every["max_rel_l2"]) > 0
        assert blocks["variables"] == whole["variables"] and blocks["steps"] == whole["steps"]
        grads = base + "/gradients?run=gradient_outlier/replicas"
        whole = json.loads(http_get(grads)[1])
        blocks = json.loads(http_get(grads + "&replica_blocks=3")[1])
        assert blocks["pooled"] == {"blocks": [[0, 1], [2, 2], [3, 3]]} and "pooled" not in whole
        for key in ("global_norm", "ratio", "loss", "layer_norms", "layer_ratio"):
            assert blocks[key] == [[max(r[:2]), r[2], r[3]] for r in whole[key]], key
            assert len(whole[key]) > 0 and len(whole[key][0]) == 4, key
        assert max(r[1] for r in blocks["ratio"]) > 10  # replica 2, the outlier: block 1
        assert blocks["nonfinite"] == whole["nonfinite"] and blocks["steps"] == whole["steps"]
        # Batch sizes in blocks: the smallest of a block (an empty shard stays visible), and
        # the largest for batch_size_max; the imbalance is the replicas'.
        inputs = base + "/inputs?run=empty_last_shard/replicas"
        whole = json.loads(http_get(inputs)[1])
        blocks = json.loads(http_get(inputs + "&replica_blocks=3")[1])
        assert blocks["pooled"] == {"blocks": [[0, 1], [2, 2], [3, 3]]} and "pooled" not in whole
        for key, pick in (("batch_size", min), ("batch_size_min", min), ("batch_size_max", max)):
            assert blocks[key] == [[pick(r[:2]), r[2], r[3]] for r in whole[key]], key
        assert any(0 in row for row in blocks["batch_size"])  # the empty last shard
        assert blocks["imbalance"] == whole["imbalance"] and blocks["replicas"] == [0, 1, 2, 3]
        status, body, _ = http_get(base + "/rng?run=shape_mismatch/replicas")
        assert (status, json.loads(body)["generators"]) == (200, [])
        _, body, _ = http_get(base + "/rng?run=generator_loop/replicas")
        assert json.loads(body)["generators"][0]["stream_groups"][-1] == [0, 1, 2, 3]
        for path, code, message in [
            ("/rng", 400, "missing argument 'run'"),
            ("/data?run=nope", 404, "no replica data for run 'nope'"),
            ("/data?run=balanced/replicas&max_points=1", 400, "max_points must be between"),
            ("/rng?run=dropout_fit/replicas&matrix_side=1", 400, "matrix_side must be between"),
            (
                "/variables?run=weight_drift/skipped_allreduce&replica_blocks=1",
                400,
                "replica_blocks must be between",
            ),
        ]:
            status, body, _ = http_get(base + path)
            # TensorBoard's own errors: "Invalid argument: ..." (400), "Not found: ..." (404).
            assert (status, message in body.decode()) == (code, True), path
    finally:
        server.stop()


def test_report_json_and_text_have_both_families(demo_logs):
    result = subprocess.run(
        [os.path.join(VENV_BIN, "tb-replica"), "report", demo_logs, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    runs = {r["run"]: r for r in json.loads(result.stdout)["runs"]}
    assert runs["unsharded_pipeline/replicas"]["data"]["share"][0] == [1.0] * 4
    assert runs["dropout_fit/replicas"]["rng"]["generators"][0]["match"][0] == [1.0] * 4
    assert runs["shape_mismatch/replicas"]["rng"] is None
    text = tb_replica_plugin.load(demo_logs, run="*_pipeline/replicas").to_text()
    assert "0–1: 100% at 32 steps" in text
    assert "examples (8 steps): shared at the same step by replica pair: none" in text


def test_report_json_written_in_pieces_equals_the_whole_document(demo_logs):
    report = tb_replica_plugin.load(demo_logs)
    whole = json.dumps(report.to_json(), allow_nan=False, default=str)
    assert "".join(report.json_chunks()) == whole
    runs = {r["run"]: r for r in json.loads(whole)["runs"]}
    gradients = runs["nan_replica/replicas"]["gradients"]
    # FloatRows blocks: one row per logged step, as json_floats writes the whole array.
    series = report.runs["nan_replica/replicas"].gradients
    assert len(gradients["variable_norms"]) == len(gradients["steps"]) == series.steps.size
    assert gradients["global_norm"] == json_floats(series.global_norm)
    assert gradients["variable_norms"] == json_floats(series.variable_norms)


def test_float_rows_encode_as_json_floats_one_row_at_a_time():
    rows = json_stream.FloatRows(np.float32([[0.1, np.nan], [np.inf, -np.inf]]))
    value = {"a": {"b": rows, "c": [1, 2]}, "empty": json_stream.FloatRows(np.zeros((0, 2)))}
    pieces = list(json_stream.chunks(value))
    assert "".join(pieces) == (
        '{"a": {"b": [[0.1, "NaN"], ["Infinity", "-Infinity"]], "c": [1, 2]}, "empty": []}'
    )
    assert json_stream.materialize(value) == {
        "a": {"b": [[0.1, "NaN"], ["Infinity", "-Infinity"]], "c": [1, 2]},
        "empty": [],
    }
    assert len(pieces) > 5  # the rows were written one at a time


def test_joined_fingerprints_and_overlaps_equal_the_per_replica_ones():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 5)).astype("float32")
    y = rng.integers(0, 3, size=(20, 1))
    # Replicas 0 and 1 share examples 4..7, replica 2 is empty, replica 3 repeats one example.
    parts = [slice(0, 8), slice(4, 12), slice(0, 0), [1, 1, 1]]
    per_leaf = [[tf.constant(x[p]) for p in parts], [tf.constant(y[p]) for p in parts]]
    joined = data_collector.fingerprints_across(per_leaf)
    each = [
        data_collector.example_fingerprints([tf.constant(x[p]), tf.constant(y[p])]) for p in parts
    ]
    assert joined[0].numpy().tolist() == tf.concat(each, 0).numpy().tolist()
    assert joined[1].numpy().tolist() == [0] * 8 + [1] * 8 + [3] * 3
    assert joined[2].numpy().tolist() == [8, 8, 0, 3]
    for sketch_size in (3, 16):
        a = data_collector.OverlapStats.joined(*joined, sketch_size)
        b = data_collector.OverlapStats(each, sketch_size)
        for name in ("batch_size", "distinct", "shared", "duplicated", "sketch"):
            assert getattr(a, name).numpy().tolist() == getattr(b, name).numpy().tolist(), name
    stats = data_collector.OverlapStats.joined(*joined)
    assert stats.distinct.numpy().tolist() == [8, 8, 0, 1]
    assert stats.shared.numpy()[0].tolist() == [8, 4, 0, 1]
    # Ragged leaves, or row shapes that differ across replicas, are hashed replica by replica.
    assert data_collector.fingerprints_across([[tf.ragged.constant([[1], [2, 3]])] * 2]) is None
    assert data_collector.fingerprints_across([[tf.zeros([2, 3]), tf.zeros([2, 4])]]) is None
