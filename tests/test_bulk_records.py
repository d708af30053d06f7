"""Local event files read in bulk (`read/bulk_records.py` through `RunTail`) against a reference
that parses every record with protobuf and decodes every tensor with TensorBoard's
`tensor_util.make_ndarray`: random files of the plugin's and others' tags, scalars, vectors,
strings, several values per event, a tag whose first value has no metadata, steps of every
varint width and negative ones, read in random pieces (cut inside records too) and chunks.
"""

import os
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tb_replica_plugin import metadata
from tb_replica_plugin.read import bulk_records, event_files
from tb_replica_plugin.read.event_files import RunTail

# tag -> (numpy dtype, shape) or "string"; "other/c" is another plugin's.
LAYOUTS = {
    "ours/a": (np.int64, (3, 2)),
    "ours/b": (np.float32, (4,)),
    "ours/s": (np.float64, ()),
    "ours/text": "string",
    "ours/late": (np.int32, (2,)),  # its first value comes without metadata
    "other/c": (np.float32, (2,)),
}
STEPS = st.one_of(
    st.integers(0, 300),
    st.integers(16_370, 16_400),
    st.integers(2**21 - 3, 2**21 + 3),
    st.integers(2**55, 2**62),
    st.integers(-3, -1),
)
ONE_EVENT = st.tuples(
    st.lists(st.sampled_from(sorted(LAYOUTS)), min_size=1, max_size=2),
    STEPS,
    st.sampled_from([0.0, 1.5, 1.7e9]),
    st.integers(0, 2**32 - 1),
).map(lambda event: [event])
# A writer's usual records: one tag at consecutive steps (alike but for step, time and values).
CONSECUTIVE = st.tuples(
    st.sampled_from(sorted(LAYOUTS)), STEPS, st.integers(2, 20), st.integers(0, 2**32 - 1)
).map(
    lambda run: [
        ([run[0]], run[1] + i, 1.7e9 + i, run[3] + i) for i in range(run[2]) if run[1] + i < 2**63
    ]
)
EVENTS = st.lists(st.one_of(ONE_EVENT, CONSECUTIVE), min_size=1, max_size=12).map(
    lambda blocks: [event for block in blocks for event in block]
)


def _value(tag, seed, with_metadata):
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.util import tensor_util

    layout = LAYOUTS[tag]
    rng = np.random.default_rng(seed)
    if layout == "string":
        array = np.array(f"text {seed}".encode())
    else:
        dtype, shape = layout
        array = (rng.normal(size=shape) * 1000).astype(dtype)
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(array))
    if with_metadata:
        if tag.startswith("other/"):
            value.metadata.plugin_data.plugin_name = "other"
            value.metadata.data_class = summary_pb2.DATA_CLASS_TENSOR
        else:
            value.metadata.CopyFrom(metadata.create_summary_metadata("batch_size"))
    return value


def _file_bytes(events, metadata_each=False):
    """The event file of `events` (each value's first occurrence with metadata, but for
    "ours/late", whose second one has it; with `metadata_each`, every later one too, as
    TensorFlow's writer does), as TensorBoard's record writer writes it."""
    import io

    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer import record_writer

    handle = io.BytesIO()
    writer = record_writer.RecordWriter(handle)
    writer.write(event_pb2.Event(wall_time=1.0, file_version="brain.Event:2").SerializeToString())
    seen = {}
    for tags, step, wall_time, seed in events:
        event = event_pb2.Event(step=step, wall_time=wall_time)
        for tag in tags:
            count = seen[tag] = seen.get(tag, 0) + 1
            first = 2 if tag == "ours/late" else 1
            with_metadata = count == first or (metadata_each and count > first)
            event.summary.value.append(_value(tag, seed + count, with_metadata))
        writer.write(event.SerializeToString())
    return handle.getvalue()


def _reference(data):
    """`({tag: [(step, array)]}, values)` of the plugin's tags in `data`, record by record."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    starts, lengths, _ = _frame_each(data)
    series, first_metadata, values = {}, {}, 0
    for start, length in zip(starts, lengths, strict=True):
        event = event_pb2.Event.FromString(data[start : start + length])
        for value in event.summary.value:
            values += 1
            if value.HasField("metadata"):
                first_metadata.setdefault(value.tag, value.metadata.plugin_data.plugin_name)
            if value.HasField("tensor"):
                array = tensor_util.make_ndarray(value.tensor)
                series.setdefault(value.tag, []).append((event.step, array))
    ours = {t: s for t, s in series.items() if first_metadata.get(t) == metadata.PLUGIN_NAME}
    return ours, values


def _frame_each(data):
    """`(starts, lengths, end)` of the complete records of `data`, one after the other."""
    starts, lengths, position = [], [], 0
    while position + 12 <= len(data):
        length = int.from_bytes(data[position : position + 8], "little")
        if position + 16 + length > len(data):
            break
        starts.append(position + 12)
        lengths.append(length)
        position += 16 + length
    return starts, lengths, position


# Record lengths as writers lay them out: runs of a repeating pattern (a step's tags), odd
# records between (events, heartbeats), a pattern whose lengths grow (a step's varint).
PATTERNED = st.lists(
    st.one_of(
        st.tuples(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.integers(1, 60)).map(
            lambda run: run[0] * run[1]
        ),
        st.lists(st.integers(0, 300), min_size=1, max_size=3),
    ),
    min_size=1,
    max_size=8,
).map(lambda blocks: [length for block in blocks for length in block])


@settings(max_examples=300, deadline=None)
@given(PATTERNED, st.integers(0, 30), st.booleans())
def test_framing_by_predicted_patterns_frames_as_record_by_record(lengths, cut, small):
    data = b"".join(
        n.to_bytes(8, "little") + b"\xa5" * 4 + bytes([i % 251]) * n + b"\x5a" * 4
        for i, n in enumerate(lengths)
    )
    data = data[: len(data) - cut]  # a last record not whole yet (or its header cut)
    limits = (8, 4) if small else (bulk_records._PATTERN_RECORDS, bulk_records._MAX_PERIOD)
    with mock.patch.multiple(bulk_records, _PATTERN_RECORDS=limits[0], _MAX_PERIOD=limits[1]):
        starts, found, end = bulk_records.frame(memoryview(bytearray(data)))
    wanted = _frame_each(data)
    assert (starts.tolist(), found.tolist(), end) == wanted


def test_framing_resumes_its_pattern_after_an_odd_record_between():
    lengths = []
    for period in range(400):
        lengths += [10, 20, 30] + ([99] if period % 50 == 49 else [])
    data = b"".join(n.to_bytes(8, "little") + bytes(8 + n) for n in lengths)
    one_by_one = []
    framed = bulk_records._frame_each

    def counted(*args):
        found = framed(*args)
        one_by_one.append(len(found[0]))
        return found

    with mock.patch.object(bulk_records, "_frame_each", counted):
        starts, found, end = bulk_records.frame(data)
    assert (starts.tolist(), found.tolist(), end) == _frame_each(data)
    # The first 256 records find the pattern; after them only the odd ones are framed alone.
    odd = [i for i, n in enumerate(lengths) if n == 99]
    assert len(odd) == 8 and sum(one_by_one) == 256 + sum(i >= 256 for i in odd)


def _same(got, wanted):
    assert sorted(got) == sorted(wanted)
    for tag, points in wanted.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        for (_, a), (_, b) in zip(got[tag], points, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape, tag
            assert a.tolist() == b.tolist() if a.dtype == object else a.tobytes() == b.tobytes()


def _read(path, data, cuts, chunk=0, bulk=True):
    """`({tag: [(step, array)]}, values read)` of a `RunTail` over `path` while `data` is
    appended to it in pieces (`cuts`: fractions of it), `chunk` bytes per read (0: default);
    `bulk`: every read decoded in bulk (else as many records as a tail of a few steps: one by
    one)."""
    run = os.path.dirname(path)
    tail, got, read = RunTail(run, metadata.PLUGIN_NAME), {}, 0
    limit, least = event_files.CHUNK_BYTES, event_files.BULK_RECORDS
    event_files.CHUNK_BYTES = chunk or limit
    event_files.BULK_RECORDS = 0 if bulk else 10**9
    try:
        written = 0
        for cut in [*sorted(int(c * len(data)) for c in cuts), len(data)]:
            with open(path, "ab") as handle:
                handle.write(data[written:cut])
            written = max(written, cut)
            found = tail.read()
            read += found.values
            for tag, points in found.samples.items():
                got.setdefault(tag, []).extend(points)
    finally:
        event_files.CHUNK_BYTES, event_files.BULK_RECORDS = limit, least
    assert read == tail.values_read
    return got, read


def _record_by_record():
    """`RunTail`'s files read by TensorBoard's record reader, one record at a time."""
    original = event_files._Records.__init__

    def init(self, path):
        original(self, path)
        self.local, self._random = False, event_files._random_reader()

    return mock.patch.object(event_files._Records, "__init__", init)


@settings(max_examples=80, deadline=None)
@given(
    events=EVENTS,
    metadata_each=st.booleans(),
    cuts=st.lists(st.floats(0, 1), max_size=3),
    chunk=st.sampled_from([0, 64]),
)
def test_a_file_read_in_bulk_reads_as_record_by_record(
    tmp_path_factory, events, metadata_each, cuts, chunk
):
    data = _file_bytes(events, metadata_each)
    # Whole: as the reference reads it.
    wanted, values = _reference(data)
    for bulk in (True, False):
        path = str(tmp_path_factory.mktemp("run") / "events.out.tfevents.1.h")
        got, read = _read(path, data, [], bulk=bulk)
        _same(got, wanted)
        assert read == values
    assert all(not a.flags.writeable for points in got.values() for _, a in points if a.ndim)
    # In pieces (a tag's values read before its metadata are not the plugin's yet, as
    # TensorBoard lists a tag by its first metadata): as TensorBoard's reader reads them.
    path = str(tmp_path_factory.mktemp("run") / "events.out.tfevents.1.h")
    got, read = _read(path, data, cuts, chunk)
    with _record_by_record():
        path = str(tmp_path_factory.mktemp("run") / "events.out.tfevents.1.h")
        wanted, values = _read(path, data, cuts)
    _same(got, wanted)
    assert read == values


def test_a_record_whose_step_bytes_are_not_one_varint_is_not_the_template_s():
    """Records alike in every other byte but whose step bytes end early (another structure
    shifted into them) are parsed one by one."""
    from tensorboard.compat.proto import event_pb2

    from tb_replica_plugin.read.event_files import _layout

    data = _file_bytes([(["ours/a"], 200, 1.5, 1), (["ours/a"], 300, 1.5, 2)])
    starts, lengths, _ = _frame_each(data)
    record = data[starts[2] : starts[2] + lengths[2]]
    found = bulk_records.template(
        record, event_pb2.Event.FromString(record), _layout, event_pb2.Event.FromString
    )
    assert found.step_span == (10, 12)  # after the wall time: 300 in 2 varint bytes
    rows = np.frombuffer(record, np.uint8)[None, :].repeat(2, axis=0).copy()
    rows[1, 10] = 0x05  # a one-byte varint, the next byte no longer the step's
    assert found.matches(rows).tolist() == [True, False]
    assert found.steps(rows[:1]).tolist() == [300]


def test_a_tag_noted_by_a_record_parsed_alone_after_its_bulk_records_reads_one_by_one(tmp_path):
    """ "ours/late" first comes without metadata (alike records, decoded in bulk), its metadata
    in an event of two values (parsed alone) after them: the whole read falls back to one by
    one from the tags as they were before it, and reads as the reference."""
    events = [(["ours/late"], 1, 1.5, 1)]
    events += [(["ours/late", "ours/a"], 2, 1.5, 2)]
    events += [(["ours/late"], step, 1.5, step) for step in range(3, 12)]
    data = _file_bytes(events)
    wanted, values = _reference(data)
    got, read = _read(str(tmp_path / "events.out.tfevents.1.h"), data, [])
    _same(got, wanted)
    assert read == values and len(got["ours/late"]) == 11


def test_a_tags_records_of_two_step_widths_are_joined_in_one_copy(tmp_path):
    """Two tags logged at steps 100-159, their records one and two step bytes long (the varint
    grows at 128), the first with metadata: each tag's three groups are copied once into one
    part (`joined_values`), in record order, and read as the reference."""
    events = [([tag], step, 1.5, step) for step in range(100, 160) for tag in ("ours/a", "ours/b")]
    data = _file_bytes(events)
    wanted, values = _reference(data)
    joined = []
    original = bulk_records.joined_values

    def spy(data, groups):
        joined.append((groups[0][0].tag, len(groups)))
        return original(data, groups)

    with mock.patch.object(bulk_records, "joined_values", spy):
        got, read = _read(str(tmp_path / "events.out.tfevents.1.h"), data, [])
    _same(got, wanted)
    assert read == values and sorted(joined) == [("ours/a", 3), ("ours/b", 3)]
    assert [step for step, _ in got["ours/b"]] == list(range(100, 160))
