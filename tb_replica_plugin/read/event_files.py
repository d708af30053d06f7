"""A run's event files read incrementally (`RunTail`), and a data provider over a log dir.

`RunTail` is how the plugin, `tb-replica report` and `load()` read a run: each `read` parses
only what was appended to the run's files since the last one (TensorBoard's own file loaders
hold the offsets), and decodes only this plugin's tensors. `EventFilesProvider` answers as
TensorBoard's `MultiplexerDataProvider` does (`list_tensors`, `read_tensors`) without holding
the log dir (the multiplexer first loads every run into memory, about 2.4× the event bytes):
`reader.local_provider`, for code and tests that want a data provider over a log dir.

It answers as `MultiplexerDataProvider` does for what the reader asks (`list_tensors`,
`read_tensors`): runs are the directories holding `*tfevents*` files, named by their path relative
to the log dir (`.` for the log dir itself); a tag belongs to the plugin whose metadata came with
its first value; samples keep their order of writing (files by name, then records); `downsample`
keeps the last sample and a seeded random choice of the others (TensorBoard's own function).
A local file's new records are framed from their lengths and decoded in bulk where a writer's
records are alike (`bulk_records`: 2.3 µs per value against 5.3 one by one); other paths
(`gs://`, `ram://`) are read by TensorBoard's event file reader (TensorFlow's once it is
imported). A truncated last record is left for later, as TensorBoard does. A local record whose
CRC fails (`bulk_records.checked`) is skipped with one warning per file and the rest of the file
read, where TensorBoard's loader stops reading the file (and the other paths stop, as it does).
No TensorFlow import.
"""

import contextlib
import dataclasses
import gc
import logging
import os
import threading

import numpy as np
from tensorboard.data import provider

from tb_replica_plugin.core import columns
from tb_replica_plugin.read import bulk_records

__all__ = ["EventFilesProvider", "RunTail", "TailRead", "event_file_names", "reading_in_bulk"]


@dataclasses.dataclass
class _Tag:
    metadata: object  # the SummaryMetadata of the tag's first value that had one
    max_step: int
    max_wall_time: float
    maybe_ours: bool = True  # its metadata names the reading plugin, or is not known yet


class EventFilesProvider:
    """The `list_tensors` / `read_tensors` part of TensorBoard's `DataProvider`, over event files.

    Args:
      logdir: the log directory (local, or any path TensorBoard's file reader opens).

    Example:
      >>> provider = EventFilesProvider("logs")
      >>> reader.list_runs(provider, None, "")["replicas"]["inputs/batch_size"].max_step
      2
    """

    def __init__(self, logdir):
        self._logdir = os.fspath(logdir)
        self._files = None  # {run: [event file paths]}, found by the first `list_tensors`
        self._listed = None  # {run: {tag: _Tag}} of every tag, after the first `list_tensors`

    def run_names(self):
        """The runs: directories holding event files, with or without this plugin's data."""
        if self._files is None:
            self._files = self._runs()
        return list(self._files)

    def _runs(self):
        """`{run: [event file paths, sorted]}`, as TensorBoard's `AddRunsFromDirectory` names
        runs: the directories holding a `*tfevents*` file, their files but `.profile-empty`
        ones. A local log dir is walked with `os.walk` (TensorBoard's walk imports TensorFlow
        for `tf.io.gfile`), others with TensorBoard's functions."""
        if "://" in self._logdir:
            from tensorboard.backend.event_processing import io_wrapper

            walked = (
                (
                    directory,
                    [os.path.basename(p) for p in io_wrapper.ListDirectoryAbsolute(directory)],
                )
                for directory in io_wrapper.GetLogdirSubdirectories(self._logdir)
            )
        else:
            walked = ((directory, names) for directory, _, names in os.walk(self._logdir))
        runs = {}
        for directory, names in walked:
            if any("tfevents" in name for name in names):
                name = os.path.relpath(directory, self._logdir)
                runs[name] = [os.path.join(directory, n) for n in event_file_names(names)]
        return runs

    @staticmethod
    def _values(paths):
        """`(event, value)` of every summary value in the files, in order of writing.

        Python's cyclic garbage collector is paused meanwhile (`reading_in_bulk`).
        """
        from tensorboard.compat.proto import event_pb2

        with reading_in_bulk():
            for path in paths:
                for record in _Records(path).each():
                    event = event_pb2.Event.FromString(record)
                    for value in event.summary.value:
                        yield event, value

    def _list_all(self):
        if self._listed is None:
            self.run_names()
            self._listed = {}
            for run, paths in self._files.items():
                self._listed[run] = _list_run(paths)
        return self._listed

    def _index(self, plugin_name, run_tag_filter):
        """`{run: {tag: _Tag}}` of the plugin's tensor tags that the filter keeps."""
        from tensorboard.compat.proto import summary_pb2

        runs = getattr(run_tag_filter, "runs", None)
        tags = getattr(run_tag_filter, "tags", None)
        listed = self._list_all()
        index = {}
        for run in listed if runs is None else [r for r in runs if r in listed]:
            kept = {
                tag: info
                for tag, info in listed[run].items()
                if info.metadata is not None
                and info.metadata.plugin_data.plugin_name == plugin_name
                and info.metadata.data_class == summary_pb2.DATA_CLASS_TENSOR
                and (tags is None or tag in tags)
            }
            if kept:
                index[run] = kept
        return index

    def list_tensors(self, ctx=None, *, experiment_id, plugin_name, run_tag_filter=None):
        """`{run: {tag: TensorTimeSeries}}` of the plugin's tensor tags (files scanned once)."""
        return {
            run: {
                tag: provider.TensorTimeSeries(
                    max_step=info.max_step,
                    max_wall_time=info.max_wall_time,
                    plugin_content=info.metadata.plugin_data.content,
                    description=info.metadata.summary_description,
                    display_name=info.metadata.display_name,
                )
                for tag, info in tags.items()
            }
            for run, tags in self._index(plugin_name, run_tag_filter).items()
        }

    def read_tensors(
        self, ctx=None, *, experiment_id, plugin_name, downsample=None, run_tag_filter=None
    ):
        """`{run: {tag: [TensorDatum]}}`: the runs' files read again, the tags asked decoded."""
        from tensorboard.backend.event_processing import data_provider

        index = self._index(plugin_name, run_tag_filter)
        result = {}
        for run, tags in index.items():
            kept = {tag: [] for tag in tags}
            for event, value in self._values(self._files[run]):
                series = kept.get(value.tag)
                if series is not None and value.HasField("tensor"):
                    series.append(_datum(event, value))
            data = {tag: kept.get(tag, []) for tag in tags}
            if downsample is not None:
                # TensorBoard's own choice of samples (the last one and a seeded random subset).
                data = {tag: data_provider._downsample(xs, downsample) for tag, xs in data.items()}
            result[run] = data
        return result


def _list_run(paths):
    """`{tag: _Tag}` of every summary value in one run's event files (`paths`, in order)."""
    tags = {}
    for event, value in EventFilesProvider._values(paths):
        tag = tags.get(value.tag)
        if tag is None:
            has_metadata = value.HasField("metadata")
            tag = tags[value.tag] = _Tag(
                value.metadata if has_metadata else None, event.step, event.wall_time
            )
        elif tag.metadata is None and value.HasField("metadata"):
            tag.metadata = value.metadata
        tag.max_step = max(tag.max_step, event.step)
        tag.max_wall_time = max(tag.max_wall_time, event.wall_time)
    return tags


def _datum(event, value):
    """The `TensorDatum` of a summary value with a tensor."""
    return provider.TensorDatum(
        step=event.step, wall_time=event.wall_time, numpy=tensor_to_numpy(value.tensor)
    )


def tensor_to_numpy(tensor):
    """A `TensorProto` as a numpy array, the same as TensorBoard's `tensor_util.make_ndarray`.

    Tensors serialized as bytes (`tensor_content`: every non-scalar numeric one the probe
    writes) are copied out in one call; the rest go through TensorBoard's function.
    """
    content = tensor.tensor_content
    if content:
        dtype = _numpy_dtype(tensor.dtype)
        return np.frombuffer(content, dtype=dtype).copy().reshape(_shape(tensor.tensor_shape))
    from tensorboard.util import tensor_util

    return tensor_util.make_ndarray(tensor)


def _numpy_dtype(data_type):
    """The numpy dtype of a `DataType` enum value (kept once looked up)."""
    dtype = _NUMPY_DTYPES.get(data_type)
    if dtype is None:
        from tensorboard.compat.tensorflow_stub import dtypes

        dtype = _NUMPY_DTYPES[data_type] = dtypes.as_dtype(data_type).as_numpy_dtype
    return dtype


def _layout(tensor):
    """`(numpy dtype, dimensions)` of a `TensorProto`, kept per dtype and serialized shape."""
    key = (tensor.dtype, tensor.tensor_shape.SerializeToString())
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = (np.dtype(_numpy_dtype(tensor.dtype)), _shape(tensor.tensor_shape))
        if len(_LAYOUTS) < _KEPT_SHAPES:
            _LAYOUTS[key] = layout
    return layout


def _records_of(data, starts, lengths):
    """The serialized records of `data` framed at `starts` and `lengths`."""
    for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
        yield data[start : start + length]


def tensor_to_numpy_view(tensor):
    """`tensor_to_numpy`, read-only over the proto's bytes where they hold the values."""
    content = tensor.tensor_content
    if not content:
        return tensor_to_numpy(tensor)
    dtype, shape = _layout(tensor)
    return np.frombuffer(content, dtype).reshape(shape)


def _bulk_parts(data, groups):
    """`[(record numbers, steps, values)]` of one tag's groups decoded in bulk: one part when
    their templates share a dtype and value shape (`bulk_records.joined_values`)."""
    if len(groups) > 1 and len({(g[0].dtype, tuple(g[0].shape)) for g in groups}) == 1:
        return [bulk_records.joined_values(data, groups)]
    return [(numbers, found.steps(rows), found.values(rows)) for found, numbers, rows in groups]


def _in_record_order(parts):
    """`[(step, value)]` of `[(record numbers, steps, values)]` parts, by record number: a
    `columns.Column` when every part is a bulk one of one dtype and value shape."""
    parts = sorted(parts, key=lambda part: part[0][0])
    numbers = [np.asarray(p[0], np.int64) for p in parts]
    # Parts one after the other (a tag's records before and after its step's varint grew a
    # byte) are in record order as they are; interleaved ones are sorted.
    order = None
    if any(a[-1] > b[0] for a, b in zip(numbers, numbers[1:], strict=False)):
        order = np.argsort(np.concatenate(numbers), kind="stable")
    if all(isinstance(p[2], np.ndarray) for p in parts) and columns.one_layout(
        [p[2] for p in parts]
    ):
        if len(parts) == 1:
            return columns.Column(parts[0][1], parts[0][2])
        steps = np.concatenate([p[1] for p in parts])
        values = np.concatenate([p[2] for p in parts])
        if order is not None:
            steps, values = steps[order], values[order]
        values.flags.writeable = False
        return columns.Column(steps, values)
    steps = [s for p in parts for s in _as_list(p[1])]
    values = [v for p in parts for v in _each(p[2])]
    if order is None:
        return list(zip(steps, values, strict=True))
    return [(steps[i], values[i]) for i in order.tolist()]


def _as_list(steps):
    return steps.tolist() if isinstance(steps, np.ndarray) else steps


def _each(values):
    """The values of a part, one array each: rows of a bulk part (0-d arrays for scalars)."""
    return columns.value_rows(values) if isinstance(values, np.ndarray) else values


def _shape(tensor_shape):
    """The dimensions of a `TensorShapeProto`, kept per serialized shape (a log dir has a few
    distinct shapes, read millions of times; walking the dimensions costs 3 times as much)."""
    key = tensor_shape.SerializeToString()
    shape = _SHAPES.get(key)
    if shape is None:
        shape = tuple(dim.size for dim in tensor_shape.dim)
        if len(_SHAPES) < _KEPT_SHAPES:
            _SHAPES[key] = shape
    return shape


# Bytes of a local event file read at once (`_Records.new_bytes`).
CHUNK_BYTES = 64 << 20
# The event files whose corrupt records were logged (`_Records.new_bytes`): once per file and
# process, whichever reader met them.
_CORRUPT_FILES = set()
# Each thread's buffer of `new_bytes` (`_read_at`), as large as its largest read.
_READ_BUFFER = threading.local()
# Fewer new records than this (a tail of a few steps) are parsed one by one: decoding in bulk
# costs a few numpy calls per tag and length (0.6 against 0.4 ms per worker file for 10 steps).
BULK_RECORDS = 256
# DataType enum value -> numpy dtype, filled on first use.
_NUMPY_DTYPES = {}
# Serialized TensorShapeProto -> dimensions (`_shape`), at most `_KEPT_SHAPES`.
_SHAPES = {}
_KEPT_SHAPES = 4096
# (DataType, serialized TensorShapeProto) -> (numpy dtype, dimensions) (`_layout`).
_LAYOUTS = {}


@contextlib.contextmanager
def reading_in_bulk():
    """The block allocates as a read does: Python's cyclic garbage collector paused and numpy's
    new arrays on small pages (both as they were after the last such block of any thread ends).

    Reading a log dir allocates millions of objects (events, arrays, their series), none in a
    cycle; the collections their allocation triggers rescan every object alive, and cost a
    fifth of a job's first read (4.6 of 24 s at 256 workers × 1,000 steps). numpy asks the
    kernel for huge pages for its large arrays (`madvise`); where the kernel then compacts
    memory to find them (`transparent_hugepage/defrag` "madvise", a common setting), a job's
    merged arrays cost 2 ms per MB to fault in instead of 0.3: 0.8 of the 4 s of that job's
    first read.
    """
    global _BULK_READS, _BULK_BEFORE
    with _BULK_LOCK:
        if not _BULK_READS:
            _BULK_BEFORE = (gc.isenabled(), _set_huge_pages(False))
            gc.disable()
        _BULK_READS += 1
    try:
        yield
    finally:
        with _BULK_LOCK:
            _BULK_READS -= 1
            if not _BULK_READS:
                collecting, huge_pages = _BULK_BEFORE
                _set_huge_pages(huge_pages)
                if collecting:
                    gc.enable()


def _set_huge_pages(enabled):
    """numpy's huge-page advice for new arrays set to `enabled`; returns what it was (None: this
    numpy has no such setting)."""
    try:
        from numpy._core import multiarray  # numpy 1.26 has this name too
    except ImportError:
        return None
    setting = getattr(multiarray, "_set_madvise_hugepage", None)
    if setting is None or enabled is None:
        return None
    return setting(enabled)


_BULK_LOCK = threading.Lock()
_BULK_READS = 0  # blocks of `reading_in_bulk` running, in every thread
_BULK_BEFORE = (True, None)


def event_file_names(names):
    """The event files among a directory's file names, sorted: `*tfevents*` but not the
    profiler's `.profile-empty` markers (as TensorBoard's `AddRunsFromDirectory` takes them)."""
    return sorted(n for n in names if "tfevents" in n and not n.endswith(".profile-empty"))


def event_bytes(directories, limit=None):
    """Bytes of the event files (`event_file_names`) directly in each of `directories`, counted
    until they exceed `limit` (None: all); a directory or file that cannot be read counts 0."""
    total = 0
    for directory in directories:
        try:
            names = event_file_names(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            try:
                total += os.path.getsize(os.path.join(directory, name))
            except OSError:
                continue
            if limit is not None and total > limit:
                return total
    return total


@dataclasses.dataclass
class TailRead:
    """What one `RunTail.read` found.

    Attributes:
      samples: `{tag: [(step, numpy value)]}` (a list, or a `columns.Column` of a bulk read) of
        the plugin's tensor tags appended since the last read, in order of writing (files by
        name, then records); the values may be read-only.
      contents: `{tag: plugin content bytes}` of every tag of the plugin seen so far (the schema
        version and kind of its metadata).
      files: how many event files had new summary values.
      values: summary values read (of every tag, the plugin's or not).
      reset: the files can no longer be read on from where the last read stopped (never for
        event files, which only grow; see `read.sources.ProviderTail`): read the run again.
    """

    samples: dict
    contents: dict
    files: int = 0
    values: int = 0
    reset: bool = False


class _Records:
    """The records of one event file from where the last read stopped.

    A local file is read with `open` from the kept offset (`new_bytes`, up to `CHUNK_BYTES` at
    a time). Another path: with TensorFlow, its `RandomRecordReader` reads from a kept offset
    and is closed after each look (TensorBoard's loader keeps a reader open, whose buffer holds
    as much as the file up to 16 MB: 1.7 GB for the 256 files of a job); a truncated or corrupt
    record stops the look and is read again at the next one, as TensorBoard's loader does.
    Without TensorFlow, TensorBoard's loader is kept (its reader holds a file and a partial
    record only).
    """

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.local = "://" not in path  # read by `new_bytes` (`bulk_records`)
        self.templates = {}  # `bulk_records.bulk_groups`' templates of this file, by length
        self._loader = None
        self._random = None if self.local else _random_reader()

    def new_bytes(self):
        """A local file's whole records from the offset on whose CRCs hold: `(data, starts,
        lengths, end)` (`bulk_records.frame`, then `bulk_records.checked`), about `CHUNK_BYTES`
        at most; `end` is the offset in `data` after them and after any corrupt record skipped
        (0: nothing whole yet). The caller moves `offset` past what it read. `data` is a view of
        this thread's read buffer, good until its next `new_bytes` (what is kept of it is
        copied: bulk rows, parsed events). The first corrupt record of the file is logged."""
        with open(self.path, "rb") as handle:
            available = os.fstat(handle.fileno()).st_size - self.offset
            data = _read_at(handle, self.offset, min(max(available, 0), CHUNK_BYTES))
            size = bulk_records.record_size(data)
            if size is not None and len(data) < size <= available:
                data = _read_at(handle, self.offset, size)  # one record larger than the chunk
        starts, lengths, end = bulk_records.frame(data)
        starts, lengths, end, skipped = bulk_records.checked(data, starts, lengths, end)
        if skipped and self.path not in _CORRUPT_FILES:
            _CORRUPT_FILES.add(self.path)
            logging.getLogger(__name__).warning(
                "tb_replica_plugin: %s has a corrupt record at byte %d (its CRC does not "
                "match): skipped, and the records after it read (TensorBoard's own loader stops "
                "reading the file there). Other corrupt records of this file are skipped "
                "without a word.",
                self.path,
                self.offset + skipped[0],
            )
        return data, starts, lengths, end

    def each(self):
        """Yields the serialized records appended since the last call, of a local file too
        (framed and checked by `new_bytes`, each copied out)."""
        if not self.local:
            yield from self.new()
            return
        while True:
            data, starts, lengths, end = self.new_bytes()
            if not end:
                return
            pairs = zip(starts.tolist(), lengths.tolist(), strict=True)
            records = [bytes(data[start : start + n]) for start, n in pairs]
            self.offset += end
            yield from records

    def new(self):
        """Yields the serialized records appended since the last call."""
        if self._random is None:
            if self._loader is None:
                from tensorboard.backend.event_processing import event_file_loader

                self._loader = event_file_loader.RawEventFileLoader(self.path)
            yield from self._loader.Load()
            return
        from tensorflow.python.framework import errors

        reader = self._random(self.path)
        try:
            while True:
                try:
                    record, offset = reader.read(self.offset)
                except (IndexError, errors.OutOfRangeError, errors.DataLossError):
                    return  # the end, or a record not whole yet (or corrupt): read again later
                self.offset = offset
                yield record
        finally:
            reader.close()


def _read_at(handle, offset, count):
    """A view of up to `count` bytes of `handle` from `offset`, read into this thread's
    buffer: reused, not a new `bytes` per read (whose fresh pages cost 3 times the copy)."""
    buffer = getattr(_READ_BUFFER, "bytes", None)
    if buffer is None or len(buffer) < count:
        buffer = _READ_BUFFER.bytes = bytearray(count)  # a new one: views of the old may live
    handle.seek(offset)
    read = handle.readinto(memoryview(buffer)[:count])
    return memoryview(buffer)[:read]


def _random_reader():
    """TensorFlow's `RandomRecordReader` class when TensorBoard reads with TensorFlow, else None
    (TensorBoard's stub reader, or a TensorFlow without it)."""
    from tensorboard.compat import tf

    if tf.__version__ == "stub":
        return None
    try:
        from tensorflow.python.lib.io import _pywrap_record_io
    except ImportError:
        return None
    return getattr(_pywrap_record_io, "RandomRecordReader", None)


class RunTail:
    """One run's event files read incrementally: each `read` gives what was appended since.

    Each event file's offset is kept (`_Records`; a truncated last record is read again at the
    next read, as TensorBoard's own loader does), so a file grown by a few steps costs those
    steps. The plugin's tags are those whose first metadata names the plugin with the tensor
    data class (as `EventFilesProvider` lists them); other values are parsed but not decoded.

    Attributes:
      directory: the run's directory.
      values_read: summary values read so far, of every tag (what `read` costs).

    Example:
      >>> tail = RunTail("logs/job/worker_0", "replicas")
      >>> first = tail.read()  # everything written so far
      >>> tail.read().samples  # nothing appended since
      {}
    """

    def __init__(self, directory, plugin_name):
        """Args:
        directory: the run's directory (local, or any path TensorBoard's file reader opens).
        plugin_name: the plugin whose tags are read.
        """
        self.directory = os.fspath(directory)
        self._plugin = plugin_name
        self._files = {}  # path -> _Records, each holding its offset
        self._tags = {}  # tag -> _Tag (its first metadata)
        self.values_read = 0

    def _paths(self):
        """The run's event files now, sorted."""
        if "://" in self.directory:
            from tensorboard.backend.event_processing import io_wrapper

            paths = io_wrapper.ListDirectoryAbsolute(self.directory)
            names = [os.path.basename(p) for p in paths]
        else:
            try:
                names = os.listdir(self.directory)
            except FileNotFoundError:
                names = []
        return [os.path.join(self.directory, n) for n in event_file_names(names)]

    def read(self):
        """The plugin's values appended to the run's files since the last read (`TailRead`)."""
        found, files, values = {}, 0, 0
        with reading_in_bulk():
            for path in self._paths():
                records = self._files.get(path)
                if records is None:
                    records = self._files[path] = _Records(path)
                read = self._read_records(records, found)
                values += read
                files += read > 0
        self.values_read += values
        samples = {tag: data for tag, data in found.items() if self._is_ours(tag)}
        contents = {
            tag: info.metadata.plugin_data.content
            for tag, info in self._tags.items()
            if self._is_ours(tag)
        }
        return TailRead(samples=samples, contents=contents, files=files, values=values)

    def _read_records(self, records, found):
        """Adds to `found` (`{tag: [(step, numpy value)]}`) the tensor values of the tags that are
        (or may be) ours among one file's new records; returns how many values were read."""
        if records.local:
            return self._read_local(records, found)
        return self._read_each(records.new(), found)[1]

    def _read_each(self, records, found):
        """`_read_records` over serialized records one by one; returns `(records parsed, values
        read)`, stopping before the first record that does not parse.

        The per-value work inlined: the tag looked up once (`_note_tag` for a tag's first value
        or metadata), a tensor serialized as bytes read as a read-only array over them with its
        layout kept per dtype and serialized shape.
        """
        from tensorboard.compat.proto import event_pb2

        parse, tags, values, parsed = event_pb2.Event.FromString, self._tags, 0, 0
        for record in records:
            try:
                event = parse(record)
            except Exception:  # noqa: BLE001 - protobuf's DecodeError: corrupt, or not whole
                return parsed, values
            parsed += 1
            for value in event.summary.value:
                values += 1
                tag = tags.get(value.tag)
                if tag is None or (tag.metadata is None and value.HasField("metadata")):
                    tag = self._note_tag(event, value)
                if not tag.maybe_ours or not value.HasField("tensor"):
                    continue
                array = tensor_to_numpy_view(value.tensor)
                series = found.get(value.tag)  # not setdefault: no list made per value read
                if series is None:
                    found[value.tag] = [(event.step, array)]
                elif isinstance(series, list):
                    series.append((event.step, array))
                else:  # a `Column` of an earlier chunk
                    found[value.tag] = [*series, (event.step, array)]
        return parsed, values

    def _read_local(self, records, found):
        """`_read_records` of a local file: its new records framed and decoded in bulk where
        they are alike (`bulk_records`), the others parsed one by one; a record that does not
        parse ends the read there (read again at the next one)."""
        values = 0
        while True:
            data, starts, lengths, end = records.new_bytes()
            if not end:
                return values
            parsed, count = 0, 0
            if starts.size:
                parsed, count = self._decode(data, starts, lengths, found, records.templates)
            values += count
            if parsed < len(starts):
                records.offset += int(starts[parsed] - bulk_records.HEADER)
                return values
            records.offset += end

    def _decode(self, data, starts, lengths, found, templates):
        """Adds the plugin's values of framed records to `found` (as `_read_records`); returns
        `(records parsed, values read)`: all of them, or those before the first that does not
        parse. `templates`: the file's (`bulk_records.bulk_groups`' `known`)."""
        if len(starts) < BULK_RECORDS:
            return self._read_each(_records_of(data, starts, lengths), found)
        from tensorboard.compat.proto import event_pb2

        parse = event_pb2.Event.FromString
        groups, rest = bulk_records.bulk_groups(data, starts, lengths, _layout, parse, templates)
        noted_before = {name: dataclasses.replace(tag) for name, tag in self._tags.items()}
        items, noted, parsed, values = {}, {}, len(starts), 0
        for number in rest.tolist():
            try:
                event = parse(data[starts[number] : starts[number] + lengths[number]])
            except Exception:  # noqa: BLE001 - protobuf's DecodeError: corrupt, or not whole
                parsed = number
                break
            values += self._add_event(event, number, items, noted)
        bulk = {}  # tag -> its groups
        for template, numbers, rows in sorted(groups, key=lambda group: group[1][0]):
            keep = numbers < parsed
            numbers, rows = numbers[keep], rows[keep]
            if not numbers.size:
                continue
            if noted.get(template.tag, -1) > numbers[0]:
                # A value of its tag parsed one by one noted the tag after these: every record
                # one by one, in order, from the tags as they were.
                self._tags = noted_before
                return self._read_each(_records_of(data, starts, lengths), found)
            tag = self._note_template(template, rows[:1])
            values += len(numbers)
            if tag.maybe_ours:
                bulk.setdefault(template.tag, []).append((template, numbers, rows))
        for name, tag_groups in bulk.items():
            items.setdefault(name, []).extend(_bulk_parts(data, tag_groups))
        for name, parts in items.items():
            points = _in_record_order(parts)
            found[name] = columns.joined(found[name], points) if name in found else points
        return parsed, values

    def _add_event(self, event, number, items, noted):
        """Adds the plugin's values of one parsed record (number `number`) to `items`
        (`{tag: [(numbers, steps, values)]}`); returns how many values it holds."""
        for value in event.summary.value:
            tag = self._tags.get(value.tag)
            if tag is None or (tag.metadata is None and value.HasField("metadata")):
                noted.setdefault(value.tag, number)
                tag = self._note_tag(event, value)
            if not tag.maybe_ours or not value.HasField("tensor"):
                continue
            array = tensor_to_numpy_view(value.tensor)
            items.setdefault(value.tag, []).append(([number], [event.step], [array]))
        return len(event.summary.value)

    def _note_template(self, template, first_row):
        """`_note` for the values of a bulk template (groups taken in record order)."""
        step = int(template.steps(first_row)[0])
        return self._note(template.tag, template.metadata, step, template.wall_time)

    def _note_tag(self, event, value):
        """`_note` for a value parsed one by one."""
        metadata = value.metadata if value.HasField("metadata") else None
        return self._note(value.tag, metadata, event.step, event.wall_time)

    def _note(self, name, metadata, step, wall_time):
        """The `_Tag` of tag `name`, noted at its first value (`step`, `wall_time`) and given
        the first `metadata` it comes with."""
        tag = self._tags.get(name)
        if tag is None:
            tag = self._tags[name] = _Tag(metadata, step, wall_time)
        elif tag.metadata is None and metadata is not None:
            tag.metadata = metadata
        else:
            return tag
        tag.maybe_ours = self._names_us(tag.metadata)
        return tag

    def _names_us(self, metadata):
        """Whether a tag whose first metadata is `metadata` may be ours (None: not known yet)."""
        return metadata is None or metadata.plugin_data.plugin_name == self._plugin

    def _is_ours(self, tag):
        """Whether `tag`'s metadata names the plugin with the tensor data class."""
        from tensorboard.compat.proto import summary_pb2

        info = self._tags.get(tag)
        return (
            info is not None
            and info.metadata is not None
            and info.metadata.plugin_data.plugin_name == self._plugin
            and info.metadata.data_class == summary_pb2.DATA_CLASS_TENSOR
        )
