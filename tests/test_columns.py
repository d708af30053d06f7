"""A tag's samples read in bulk (`core.columns.Column`) against the same samples as a list of
`(step, value)`: the helpers the families take samples with give the same groups, and every
family builds the same series and notes from the runs of the unit and the hostile logs read in
bulk as read one by one."""

import dataclasses
import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tb_replica_plugin import group, metadata
from tb_replica_plugin.core import columns
from tb_replica_plugin.read import event_files

SHAPES = [(2,), (3,), (2, 2), ()]
SAMPLES = st.lists(
    st.tuples(st.integers(0, 6), st.sampled_from(SHAPES), st.integers(-50, 50)), max_size=12
)


def _points(drawn):
    return [(step, np.full(shape, value, np.int32)) for step, shape, value in drawn]


@settings(max_examples=200, deadline=None)
@given(SAMPLES)
def test_by_shape_groups_a_list_by_value_shape_in_order(drawn):
    points = _points(drawn)
    groups = columns.by_shape(points, np.float64)
    wanted = {}
    for position, (step, value) in enumerate(points):
        wanted.setdefault(value.shape, []).append((position, step, value.astype(np.float64)))
    assert sorted(g.shape for g in groups) == sorted(wanted)
    assert [g.positions[-1] for g in groups] == sorted(g.positions[-1] for g in groups)
    for found in groups:
        rows = wanted[found.shape]
        assert found.positions.tolist() == [r[0] for r in rows]
        assert found.steps.tolist() == [r[1] for r in rows]
        assert found.values.dtype == np.float64
        assert found.values.tolist() == [r[2].tolist() for r in rows]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(-50, 50)), max_size=12))
def test_a_column_is_the_list_of_its_samples_and_reads_as_one(drawn):
    points = _points([(step, (2,), value) for step, value in drawn])
    column = columns.Column(
        np.array([s for s, _ in points], np.int64), np.array([v for _, v in points]).reshape(-1, 2)
    )
    assert [(s, v.tolist()) for s, v in column] == [(s, v.tolist()) for s, v in points]
    assert len(column) == len(points)
    ordered = columns.by_step(column)
    assert [(s, v.tolist()) for s, v in ordered] == [
        (s, v.tolist()) for s, v in sorted(points, key=lambda p: p[0])
    ]
    as_list = columns.by_shape(points)
    as_column = columns.by_shape(column)
    assert len(as_column) == len(as_list) == (1 if points else 0)
    for a, b in zip(as_column, as_list, strict=True):
        assert (a.shape, a.positions.tolist(), a.steps.tolist(), a.values.tolist()) == (
            b.shape,
            b.positions.tolist(),
            b.steps.tolist(),
            b.values.tolist(),
        )
    steps, values = columns.last_per_step(column.steps, column.values)
    last = dict(points)
    assert steps.tolist() == sorted(last)
    assert values.tolist() == [last[s].tolist() for s in sorted(last)]


def test_a_scalar_column_gives_0_d_values_and_joins_only_its_own_layout():
    column = columns.Column(np.array([1, 2]), np.array([0.5, 1.5]))
    assert [(s, v.shape, float(v)) for s, v in column] == [(1, (), 0.5), (2, (), 1.5)]
    assert column[-1][0] == 2 and float(column[-1][1]) == 1.5
    both = columns.joined(column, columns.Column(np.array([3]), np.array([2.5])))
    assert isinstance(both, columns.Column) and both.steps.tolist() == [1, 2, 3]
    mixed = columns.joined(column, [(3, np.array([2.5, 3.5]))])
    assert isinstance(mixed, list) and [s for s, _ in mixed] == [1, 2, 3]


def _runs(logdir):
    return sorted(
        os.path.relpath(root, logdir)
        for root, _, names in os.walk(logdir)
        if event_files.event_file_names(names)
    )


def _member(logdir, run, bulk, monkeypatch):
    """`group.read_member` of the run, every file's records decoded in bulk (or one by one)."""
    with monkeypatch.context() as patch:
        patch.setattr(event_files, "BULK_RECORDS", 0 if bulk else 10**9)
        tail = event_files.RunTail(os.path.join(logdir, run), metadata.PLUGIN_NAME)
        return group.read_member(run, tail.read())


def _same(a, b, where):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert a.tolist() == b.tolist() if a.dtype == object else a.tobytes() == b.tobytes(), where
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for field in dataclasses.fields(a):
            _same(getattr(a, field.name), getattr(b, field.name), f"{where}.{field.name}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b or (a != a and b != b), where  # NaN equals NaN here


def _write_layouts(logdir):
    """A run whose series change layout, repeat and skip steps (2 replicas), with every
    record of a tag alike (read in bulk as one column)."""
    import json

    from bad_logs import _write_events

    from tb_replica_plugin.families.examples import schema as examples
    from tb_replica_plugin.families.gradients import schema as gradients
    from tb_replica_plugin.families.inputs import schema as inputs
    from tb_replica_plugin.families.rng import schema as rng
    from tb_replica_plugin.families.step_time import schema as step_time

    def event(schema, tag, kind, value, step):
        return (
            getattr(schema, tag),
            value,
            step,
            metadata.create_summary_metadata(getattr(schema, kind)),
        )

    def document(name):
        return json.dumps({"generators": [{"name": name, "kind": "k"}], "replicas": [0, 1]})

    events = [event(rng, "TAG_RNG_GENERATORS", "KIND_RNG_GENERATORS", document("a"), 0)]
    events.append(event(rng, "TAG_RNG_GENERATORS", "KIND_RNG_GENERATORS", document("b"), 5))
    for step in [*range(10), 7]:  # generator "a" for steps 0-4, then "b"; step 7 twice
        streams = np.full((1, 2, 3), step, np.int64)
        events.append(event(rng, "TAG_RNG_STREAMS", "KIND_RNG_STREAMS", streams, step))
    for n, step in enumerate([0, 1, 2, 2, 3]):  # step 2 twice: the later (21) wins
        norms = np.full((4, 2), 10 * step + (n == 3), np.float32)
        events.append(event(gradients, "TAG_GRAD_NORMS", "KIND_GRAD_NORMS", norms, step))
        flags = np.full((4, 2), step, np.int64)
        events.append(event(gradients, "TAG_GRAD_NONFINITE", "KIND_GRAD_NONFINITE", flags, step))
    for step in range(6):  # overlap from step 1 on; examples at step 3 twice
        counts = np.full((2, 5), 10 * step, np.int64)
        events.append(event(examples, "TAG_DATA_EXAMPLES", "KIND_DATA_EXAMPLES", counts, step))
        if step == 3:
            events.append(event(examples, "TAG_DATA_EXAMPLES", "KIND_DATA_EXAMPLES", -counts, 3))
        overlap = np.full((3, 2, 2), step, np.int64)
        if step:
            events.append(event(examples, "TAG_DATA_OVERLAP", "KIND_DATA_OVERLAP", overlap, step))
    for n, step in enumerate([0, 1, 1, 2, 3]):  # step 1 twice: the later (3) wins; 3 is NaN
        ready = np.full((4, 2), np.nan if step == 3 else 1.0 + n)
        events.append(event(step_time, "TAG_REPLICA_TIME", "KIND_REPLICA_TIME", ready, step))
    for step in (5, 3, 4, 1):  # written out of step order
        sizes = np.full((3, 2), step, np.int32)
        events.append(event(inputs, "TAG_BATCH_SIZE", "KIND_BATCH_SIZE", sizes, step))
    _write_events(os.path.join(logdir, "layouts"), events)


def test_every_family_reads_the_same_series_from_columns_as_from_lists(
    unit_logs, bad_logs, tmp_path, monkeypatch
):
    _write_layouts(str(tmp_path))
    columns_met = 0
    for logdir in (unit_logs, bad_logs, str(tmp_path)):
        for run in _runs(logdir):
            in_bulk = _member(logdir, run, True, monkeypatch)
            each = _member(logdir, run, False, monkeypatch)
            columns_met += sum(isinstance(p, columns.Column) for p in in_bulk.samples.values())
            assert not any(isinstance(p, columns.Column) for p in each.samples.values())
            assert (in_bulk.data is None) == (each.data is None), run
            if each.data is None:
                continue
            _same(in_bulk.data.notes, each.data.notes, f"{run} notes")
            _same(in_bulk.data.series, each.data.series, run)
            assert (in_bulk.new, in_bulk.first_new) == (each.new, each.first_new), run
    assert columns_met >= 20, columns_met  # the bulk reads gave columns: the test compares them


def test_a_run_of_changing_layouts_reads_as_written_in_bulk_and_one_by_one(tmp_path, monkeypatch):
    _write_layouts(str(tmp_path))
    for bulk in (True, False):
        got = _member(str(tmp_path), "layouts", bulk, monkeypatch)
        assert isinstance(got.samples["rng/streams"], columns.Column) == bulk
        series = got.data.series
        assert series["rng"].steps.tolist() == [5, 6, 7, 7, 8, 9]
        assert series["rng"].fingerprint[:, 0, 0].tolist() == [5, 6, 7, 7, 8, 9]
        assert [g["name"] for g in series["rng"].generators] == ["b"]
        assert "rng: 5 logged step(s) with another generator layout were skipped." in (
            got.data.notes
        )
        assert series["gradients"].steps.tolist() == [0, 1, 2, 3]
        assert series["gradients"].global_norm[:, 0].tolist() == [0, 10, 21, 30]
        assert series["gradients"].nonfinite_steps.tolist() == [0, 1, 2, 3]
        assert series["data"].steps.tolist() == [1, 2, 3, 4, 5]
        assert series["data"].batch_size[:, 0].tolist() == [10, 20, -30, 40, 50]
        assert series["inputs"].dense_steps.tolist() == [1, 3, 4, 5]
        assert series["step_time"].ready.steps.tolist() == [0, 1, 2]
        assert series["step_time"].ready.ready_median[:, 0].tolist() == [1, 3, 4]
        assert "1 replica ready-time sample(s) skipped" in " ".join(got.data.notes)
        assert series["inputs"].batch_size[:, 1].tolist() == [1, 3, 4, 5]
