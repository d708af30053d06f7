"""Record checksums: every reader of the plugin skips a record whose CRC fails, as one warning
per file, and reads the records after it; a corrupt value is never read.

A real event file written by the probe (`inputs/batch_size` at every step, 2 logical CPU
replicas), one byte flipped in one record's tensor bytes or in its length, then read through
`RunTail` (the bulk path from 256 new records on, one by one below), `FileSource`'s tails,
`EventFilesProvider` and the shared-read helper's read of a worker.
"""

import io
import logging
import os
import pickle
import struct

import numpy as np
import pytest
from conftest import custom_loop_inputs, mirrored

from tb_replica_plugin import metadata, reader, shared_read
from tb_replica_plugin.families.inputs import schema
from tb_replica_plugin.read import bulk_records, event_files, sources

TAG = schema.TAG_BATCH_SIZE
CORRUPT_STEP = 123


def _write_run(run_dir, steps):
    import tensorflow as tf

    strategy = mirrored(2)
    data = tf.data.Dataset.from_tensor_slices(np.zeros((8 * steps, 2), "float32")).batch(8)
    custom_loop_inputs(strategy, run_dir, strategy.experimental_distribute_dataset(data))
    (name,) = event_files.event_file_names(os.listdir(run_dir))
    return os.path.join(run_dir, name)


def _records(path):
    """`[(offset, length, step, tag, tensor bytes offset in the file or None)]` of a file."""
    from tensorboard.compat.proto import event_pb2

    with open(path, "rb") as handle:
        data = handle.read()
    found, position = [], 0
    while position < len(data):
        (length,) = struct.unpack_from("<Q", data, position)
        record = data[position + 12 : position + 12 + length]
        event = event_pb2.Event.FromString(record)
        for value in event.summary.value:
            content = value.tensor.tensor_content
            at = record.find(content) if content else -1
            where = position + 12 + at if at >= 0 else None
            found.append((position, length, event.step, value.tag, where))
        position += 12 + length + 4
    return found


def _flip(path, offset):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0x01]))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Two runs written once: 300 steps (read in bulk) and 60 (read one record at a time)."""
    root = tmp_path_factory.mktemp("crc")
    return {
        steps: _write_run(str(root / f"clean{steps}" / "replicas"), steps) for steps in (300, 60)
    }


def _corrupt_copy(clean_path, tmp_path, where, step=CORRUPT_STEP):
    """A copy of the run with one byte flipped in the batch-size record of `step`: in its
    tensor bytes ("payload") or in its length ("length")."""
    run_dir = tmp_path / "logs" / "run"
    run_dir.mkdir(parents=True)
    target = str(run_dir / os.path.basename(clean_path))
    with open(clean_path, "rb") as source, open(target, "wb") as copy:
        copy.write(source.read())
    (offset, _, _, _, content) = next(r for r in _records(target) if r[3] == TAG and r[2] == step)
    _flip(target, content + 5 if where == "payload" else offset + 1)
    return str(tmp_path / "logs"), str(run_dir), target, offset


def _steps_and_values(points):
    steps = [int(s) for s, _ in points]
    values = np.stack([np.asarray(v) for _, v in points])
    return steps, values


def _warnings(caplog):
    return [r for r in caplog.records if r.levelno == logging.WARNING and "corrupt" in r.message]


@pytest.mark.parametrize("where", ["payload", "length"])
@pytest.mark.parametrize("steps", [300, 60])
def test_a_corrupt_record_is_skipped_with_one_warning_and_the_rest_is_read(
    clean, tmp_path, caplog, where, steps
):
    corrupt_step = CORRUPT_STEP if steps == 300 else 30
    logdir, run_dir, path, offset = _corrupt_copy(clean[steps], tmp_path, where, corrupt_step)
    expected = event_files.RunTail(os.path.dirname(clean[steps]), metadata.PLUGIN_NAME).read()
    want_steps, want_values = _steps_and_values(expected.samples[TAG])
    assert want_steps == list(range(steps))
    keep = [i for i, s in enumerate(want_steps) if s != corrupt_step]
    caplog.set_level(logging.WARNING)
    tail = event_files.RunTail(run_dir, metadata.PLUGIN_NAME)
    got_steps, got_values = _steps_and_values(tail.read().samples[TAG])
    assert got_steps == [want_steps[i] for i in keep]
    np.testing.assert_array_equal(got_values, want_values[keep])
    (warning,) = _warnings(caplog)
    assert path in warning.message and "skipped" in warning.message
    assert f"at byte {offset} " in warning.message
    # Read again: nothing new, no second warning; appended records are read on.
    assert tail.read().samples == {} and len(_warnings(caplog)) == 1


def test_every_reader_skips_it(clean, tmp_path, caplog):
    logdir, run_dir, path, _ = _corrupt_copy(clean[300], tmp_path, "payload")
    second = next(r for r in _records(path) if r[3] == TAG and r[2] == 200)
    _flip(path, second[4] + 2)  # a second corrupt record: still one warning per file
    wanted = [s for s in range(300) if s not in (CORRUPT_STEP, 200)]
    caplog.set_level(logging.WARNING)
    # `FileSource`, the plugin's source of local runs.
    tail = sources.FileSource(logdir).tail("", "run")
    steps, values = _steps_and_values(tail.read().samples[TAG])
    assert steps == wanted and np.all(values[:, 0] == 4)
    assert len(_warnings(caplog)) == 1
    # `EventFilesProvider` (`reader.local_provider`).
    provider = event_files.EventFilesProvider(logdir)
    from tensorboard import context

    data = provider.read_tensors(
        context.RequestContext(),
        experiment_id="",
        plugin_name=metadata.PLUGIN_NAME,
        run_tag_filter=None,
        downsample=reader.ALL_SAMPLES,
    )["run"][TAG]
    assert [d.step for d in data] == wanted and all(d.numpy[0, 0] == 4 for d in data)
    assert len(_warnings(caplog)) == 1  # once per file, whichever reader met it
    # The shared-read helper's read of a worker (pickled with its tail, which reads on).
    handle = io.BytesIO()
    shared_read._read_worker("run", run_dir, handle)
    got, helper_tail = pickle.loads(handle.getvalue())
    dense = got.data.inputs
    assert dense.dense_steps.tolist() == wanted
    assert np.all(dense.dense[:, 0] == 4)
    assert helper_tail.read().samples == {} and len(_warnings(caplog)) == 1


def test_the_check_is_one_pass_that_finds_each_corrupt_record(clean):
    with open(clean[300], "rb") as handle:
        data = bytearray(handle.read())
    starts, lengths, end = bulk_records.frame(memoryview(data))
    assert end == len(data) and bulk_records._all_intact(
        np.frombuffer(data, np.uint8), starts, lengths
    )
    assert bulk_records.checked(memoryview(data), starts, lengths, end)[3] == []
    before = bytes(data)
    for record in (5, len(starts) // 2, len(starts) - 1):
        for offset in (
            int(starts[record]) - 12,  # the length
            int(starts[record]) - 2,  # the length's CRC
            int(starts[record]) + 3,  # the data
            int(starts[record] + lengths[record]),
        ):
            data[offset] ^= 0x40
            flipped = bytes(data)
            assert not bulk_records._all_intact(np.frombuffer(data, np.uint8), starts, lengths)
            assert bytes(data) == flipped  # the stored CRCs put back
            header = int(starts[record]) - 12
            framed = bulk_records.frame(memoryview(data))
            kept, _, after, skipped = bulk_records.checked(memoryview(data), *framed)
            assert skipped[0] == header
            if offset >= header + 12:  # the header holds: that record alone is skipped
                assert skipped == [header] and len(kept) == len(starts) - 1
                assert after == len(data)
            else:  # the records before it; the next read starts at the next header
                assert kept.tolist() == starts[:record].tolist()
                # (past the last record: its last 11 bytes, where a header could still begin)
                assert after == min(int(starts[record] + lengths[record]) + 4, len(data) - 11)
            data[offset] ^= 0x40
    assert bytes(data) == before
