"""`read.event_files`: `EventFilesProvider` answers as TensorBoard's multiplexer provider does;
`RunTail` reads on; a log dir on a TensorFlow file system (`ram://`) reads as a local one."""

import os
import shutil

import numpy as np
import pytest

from tb_replica_plugin import group, metadata, reader
from tb_replica_plugin.read.event_files import EventFilesProvider


def multiplexer_provider(logdir):
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={metadata.PLUGIN_NAME: 0}, max_reload_threads=1
    )
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    return data_provider.MultiplexerDataProvider(multiplexer, logdir)


def both(provider, method, **kwargs):
    from tensorboard import context

    ctx = context.RequestContext()
    return getattr(provider, method)(
        ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME, **kwargs
    )


def assert_same_answers(logdir, downsample=reader.ALL_SAMPLES, reads_on=()):
    """Our provider's answers are TensorBoard's multiplexer's; in the runs `reads_on`, whose
    file has a corrupt record, TensorBoard's loader stops there while ours skips it and reads
    on: its samples of each tag start with TensorBoard's."""
    ours, theirs = EventFilesProvider(logdir), multiplexer_provider(logdir)
    listed, listed_theirs = both(ours, "list_tensors"), both(theirs, "list_tensors")
    assert listed and {r: sorted(t) for r, t in listed.items()} == {
        r: sorted(t) for r, t in listed_theirs.items()
    }
    for run in listed_theirs:
        if run not in reads_on:  # there our last steps are later than TensorBoard's
            assert listed[run] == listed_theirs[run], run
    read, expected = (both(p, "read_tensors", downsample=downsample) for p in (ours, theirs))
    assert {r: sorted(t) for r, t in read.items()} == {r: sorted(t) for r, t in expected.items()}
    count = 0
    for run, tags in expected.items():
        for tag, data in tags.items():
            mine_all = read[run][tag]
            if run in reads_on:
                assert len(mine_all) >= len(data), (run, tag)
                read[run][tag] = mine_all = mine_all[: len(data)]
            assert [(d.step, d.wall_time) for d in mine_all] == [
                (d.step, d.wall_time) for d in data
            ], (run, tag)
            for mine, want in zip(mine_all, data, strict=True):
                assert mine.numpy.dtype == want.numpy.dtype
                np.testing.assert_array_equal(mine.numpy, want.numpy)
                count += 1
    return listed, count


def test_every_run_tag_and_sample_as_tensorboard_reads_them(unit_logs, bad_logs):
    listed, count = assert_same_answers(unit_logs)
    assert "fit_17_8/replicas" in listed and count >= 20
    # Hostile names, a corrupt and a truncated file, another schema version, bad payloads.
    listed, _ = assert_same_answers(bad_logs, reads_on={"corrupt/replicas"})
    assert {"corrupt/replicas", "truncated/replicas", "newer_schema/replicas"} <= set(listed)


def test_runs_of_several_files_the_log_dir_itself_and_downsampling(unit_logs, tmp_path):
    # The log dir is a run ("."), and a run holds the files of two writers.
    source = os.path.join(unit_logs, "fit_17_8", "replicas")
    for name in os.listdir(source):
        shutil.copy(os.path.join(source, name), tmp_path / name)
        shutil.copy(os.path.join(source, name), tmp_path / (name + ".second"))
    other = os.path.join(unit_logs, "loop_15_7", "replicas")
    os.makedirs(tmp_path / "nested" / "run")
    for name in os.listdir(other):
        shutil.copy(os.path.join(other, name), tmp_path / "nested" / "run" / name)
    listed, _ = assert_same_answers(str(tmp_path))
    assert sorted(listed) == [".", "nested/run"]
    assert_same_answers(str(tmp_path), downsample=2)


def test_a_run_tag_filter_reads_only_what_it_names(unit_logs):
    from tensorboard.data import provider as provider_lib

    ours = EventFilesProvider(unit_logs)
    wanted = provider_lib.RunTagFilter(runs=["fit_17_8/replicas"], tags=["inputs/batch_size"])
    read = both(ours, "read_tensors", downsample=reader.ALL_SAMPLES, run_tag_filter=wanted)
    assert list(read) == ["fit_17_8/replicas"] and list(read["fit_17_8/replicas"]) == [
        "inputs/batch_size"
    ]
    assert read["fit_17_8/replicas"]["inputs/batch_size"]


def write_values(path, steps, tag="inputs/batch_size", kind="batch_size", first=True):
    """Appends one value of the plugin's `tag` per step to the event file `path` (the first
    with its metadata), with TensorBoard's own record writer; returns the bytes written."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer import record_writer
    from tensorboard.util import tensor_util

    with open(path, "ab") as handle:
        writer = record_writer.RecordWriter(handle)
        for i, step in enumerate(steps):
            value = summary_pb2.Summary.Value(
                tag=tag, tensor=tensor_util.make_tensor_proto(np.full((3, 2), step, np.int64))
            )
            if first and i == 0:
                value.metadata.CopyFrom(metadata.create_summary_metadata(kind))
            event = event_pb2.Event(step=step, wall_time=1.0 + step)
            event.summary.value.append(value)
            writer.write(event.SerializeToString())
        handle.flush()
    return os.path.getsize(path)


def test_a_tail_reads_only_what_was_appended_since(tmp_path):
    from tb_replica_plugin.read.event_files import RunTail

    run = tmp_path / "run"
    run.mkdir()
    path = str(run / "events.out.tfevents.1.host")
    write_values(path, [0, 1, 2])
    tail = RunTail(str(run), metadata.PLUGIN_NAME)
    first = tail.read()
    assert [step for step, _ in first.samples["inputs/batch_size"]] == [0, 1, 2]
    assert (first.values, first.files, tail.values_read) == (3, 1, 3)
    assert list(first.contents) == ["inputs/batch_size"]
    assert tail.read().samples == {} and tail.values_read == 3  # nothing new, nothing read
    write_values(path, [3, 4], first=False)
    second = tail.read()
    assert [step for step, _ in second.samples["inputs/batch_size"]] == [3, 4]
    np.testing.assert_array_equal(second.samples["inputs/batch_size"][1][1], np.full((3, 2), 4))
    assert (second.values, tail.values_read) == (2, 5)
    # A record cut in the middle (a writer's flush under way) is read whole at the next read.
    size = write_values(path, [5], first=False)
    with open(path, "rb") as handle:
        content = handle.read()
    with open(path, "wb") as handle:
        handle.write(content[: size - 7])
    assert tail.read().samples == {}
    with open(path, "ab") as handle:
        handle.write(content[size - 7 :])
    assert [step for step, _ in tail.read().samples["inputs/batch_size"]] == [5]
    # A second file of the run (a new writer) is read too; another plugin's tags are not kept.
    other = str(run / "events.out.tfevents.2.host")
    write_values(other, [6])
    with open(other, "ab") as handle:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer import record_writer

        foreign = summary_pb2.Summary.Value(tag="loss", simple_value=1.0)
        event = event_pb2.Event(step=6, summary=summary_pb2.Summary(value=[foreign]))
        record_writer.RecordWriter(handle).write(event.SerializeToString())
    got = tail.read()
    assert list(got.samples) == ["inputs/batch_size"] and got.values == 2
    # The whole of it, as the provider over the log dir reads it.
    whole = both(EventFilesProvider(str(tmp_path)), "read_tensors", downsample=reader.ALL_SAMPLES)
    assert [d.step for d in whole["run"]["inputs/batch_size"]] == list(range(7))


def test_a_run_pattern_reads_only_the_runs_it_matches(unit_logs, monkeypatch):
    from tb_replica_plugin.read.event_files import RunTail

    asked = []
    read = RunTail.read

    def recording(self):
        asked.append(os.path.relpath(self.directory, unit_logs))
        return read(self)

    monkeypatch.setattr(RunTail, "read", recording)
    runs = group.read_log_dir(unit_logs, "fit_17_*")
    assert list(runs) == asked == ["fit_17_8/replicas"]
    assert runs["fit_17_8/replicas"].inputs.batch_size.shape[1] == 2


@pytest.mark.parametrize("missing", ["does_not_exist"])
def test_a_log_dir_without_runs_lists_nothing(tmp_path, missing):
    assert both(EventFilesProvider(str(tmp_path / missing)), "list_tensors") == {}
    assert both(EventFilesProvider(str(tmp_path)), "list_tensors") == {}


def test_pool_processes_send_broadcast_arrays_compact():
    """A reading process pickles a broadcast view (a series' "not checked" NaN arrays) as its
    repeated block, and an array of one value (zero drift) as that value: the parent gets the
    same values, dtype and shape as a read-only view, in a few bytes."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from tb_replica_plugin.read.processes import reduce_array

    class Pickler(ForkingPickler):
        _extra_reducers = {}  # its own: registering on ForkingPickler would change this process's

    Pickler.register(np.ndarray, reduce_array)
    not_checked = np.broadcast_to(np.nan, (1000, 21, 8))
    per_row = np.broadcast_to(np.arange(3.0)[:, None], (3, 5))
    plain = np.arange(12.0).reshape(3, 4)[:, ::2]
    zeros = np.zeros((1000, 21, 8))  # a healthy job's drift: one value throughout
    signed = np.zeros(1000)
    signed[500] = -0.0  # equal to 0.0, other bits: sent whole
    arrays = {"not_checked": not_checked, "per_row": per_row, "plain": plain, "zeros": zeros}
    arrays.update(signed=signed, identical=np.ones((1000, 8), bool), ramp=np.arange(1000))
    sent = {name: bytes(Pickler.dumps(a)) for name, a in arrays.items()}
    assert len(sent["not_checked"]) < 300 < len(pickle.dumps(not_checked))
    assert len(sent["zeros"]) < 300 and len(sent["identical"]) < 300
    assert len(sent["signed"]) > 8000 and len(sent["ramp"]) > 8000
    back = {name: pickle.loads(data) for name, data in sent.items()}
    assert back["not_checked"].shape == (1000, 21, 8) and np.isnan(back["not_checked"]).all()
    assert back["not_checked"].strides == (0, 0, 0) and not back["not_checked"].flags.writeable
    np.testing.assert_array_equal(back["per_row"], per_row)
    assert back["per_row"].strides[1] == 0
    np.testing.assert_array_equal(back["plain"], plain)
    assert back["plain"].flags.writeable  # an ordinary array comes back as numpy sends it
    for name in ("zeros", "identical", "signed", "ramp"):
        assert back[name].dtype == arrays[name].dtype and back[name].shape == arrays[name].shape
        np.testing.assert_array_equal(back[name], arrays[name])
    assert not back["zeros"].flags.writeable and back["zeros"].strides == (0, 0, 0)
    assert np.signbit(back["signed"][500]) and back["signed"].flags.writeable


def test_a_report_read_by_a_pool_imports_tensorflow_in_the_pool_only(unit_logs):
    """`use_event_reader("tensorflow", defer=True)`: the pool's processes read with TensorFlow's
    reader, the process that lists the runs and merges imports it only when it reads itself."""
    import subprocess
    import sys

    script = """
import sys
from tb_replica_plugin.read import processes
from tb_replica_plugin.read.event_files import EventFilesProvider
processes.use_event_reader("tensorflow", defer=True)
assert "fit_17_8/replicas" in EventFilesProvider(sys.argv[1]).run_names()
print("tensorflow" in sys.modules)
with processes.reading_pool(1) as pool:
    print(pool.submit(processes.event_reader).result())
print("tensorflow" in sys.modules)
processes.use_deferred_event_reader()
print(processes.event_reader())
"""
    done = subprocess.run(
        [sys.executable, "-c", script, unit_logs], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "tensorflow", "False", "tensorflow"]


def _copy_to(source, target):
    """Copies directory `source` into `target` through `tf.io.gfile` (any TensorFlow file
    system); returns the copied event files' target paths."""
    import tensorflow as tf

    copied = []
    for directory, _, names in tf.io.gfile.walk(source):
        relative = os.path.relpath(directory, source)
        into = target if relative == "." else os.path.join(target, relative)
        tf.io.gfile.makedirs(into)
        for name in names:
            tf.io.gfile.copy(os.path.join(directory, name), os.path.join(into, name), True)
            copied.append(os.path.join(into, name))
    return copied


def test_a_log_dir_on_a_tensorflow_file_system_reads_as_a_local_one(unit_logs, tmp_path):
    """A `gs://`, `s3://` or `hdfs://` log dir is listed with TensorBoard's `io_wrapper` and read
    through TensorFlow's file systems (the "://" paths of `EventFilesProvider` and `RunTail`).
    `ram://`, TensorFlow's in-memory file system, takes those same paths: the runs read from it
    are the local ones, findings included, and a tail reads on as its file grows."""
    import json
    import time

    import tensorflow as tf

    from tb_replica_plugin import load
    from tb_replica_plugin.read.event_files import RunTail

    remote = "ram://tb_replica_tests/unit_logs"
    _copy_to(unit_logs, remote)
    now = time.time()  # the runs' status judged at the same time
    local_report, remote_report = load(unit_logs, now=now), load(remote, now=now)
    assert sorted(remote_report.runs) == sorted(local_report.runs) and remote_report.runs
    local_json, remote_json = local_report.to_json(), remote_report.to_json()
    local_json["logdir"] = remote_json["logdir"] = None
    assert json.dumps(remote_json, sort_keys=True, default=str) == json.dumps(
        local_json, sort_keys=True, default=str
    )
    # The tab's answers over TensorBoard's app, the plugin reading the files itself (`FileSource`).
    from bad_logs import wsgi_app
    from werkzeug.test import Client

    clients = [Client(wsgi_app(logdir)[0]) for logdir in (unit_logs, remote)]
    for run in local_report.runs:
        for route in ("inputs", "findings"):
            answers = [
                c.get(f"/data/plugin/replicas/{route}", query_string={"run": run}) for c in clients
            ]
            assert [a.status_code for a in answers] == [200, 200], (run, route)
            assert answers[0].data == answers[1].data, (run, route)
    # A run that grows: the tail reads the new records only.
    run = tmp_path / "run"
    run.mkdir()
    path = str(run / "events.out.tfevents.1.host")
    written = write_values(path, [0, 1, 2])
    (remote_path,) = _copy_to(str(run), "ram://tb_replica_tests/growing")
    tail = RunTail("ram://tb_replica_tests/growing", metadata.PLUGIN_NAME)
    assert [step for step, _ in tail.read().samples["inputs/batch_size"]] == [0, 1, 2]
    write_values(path, [3, 4], first=False)
    with open(path, "rb") as local, tf.io.gfile.GFile(remote_path, "ab") as appended:
        appended.write(local.read()[written:])  # 2 records more, as a writer appends them
    second = tail.read()
    assert [step for step, _ in second.samples["inputs/batch_size"]] == [3, 4]
    assert (second.values, tail.values_read) == (2, 5)


def test_reading_in_bulk_pauses_collection_and_huge_pages_until_the_last_reader_ends():
    import gc
    import threading

    from tb_replica_plugin.read import event_files

    def huge_pages():
        before = event_files._set_huge_pages(True)
        event_files._set_huge_pages(before)
        return before

    initial = huge_pages()  # True where numpy advises huge pages (Linux), None without
    assert gc.isenabled()
    first_in, second_in, first_out, second_out = (threading.Event() for _ in range(4))
    seen = {}

    def reader(name, entered, leave):
        with event_files.reading_in_bulk():
            entered.set()
            leave.wait(10)
            seen[name] = (gc.isenabled(), huge_pages())

    one = threading.Thread(target=reader, args=("one", first_in, first_out))
    two = threading.Thread(target=reader, args=("two", second_in, second_out))
    one.start()
    assert first_in.wait(10)
    two.start()
    assert second_in.wait(10)
    first_out.set()
    one.join(10)
    assert not gc.isenabled() and huge_pages() in (False, None)  # the second still reads
    second_out.set()
    two.join(10)
    assert seen == {"one": (False, seen["one"][1]), "two": (False, seen["two"][1])}
    assert seen["one"][1] in (False, None) and seen["two"][1] in (False, None)
    assert gc.isenabled() and huge_pages() == initial
