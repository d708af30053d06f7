"""A data provider over a log dir's event files for `tb-replica report` and `load()`.

TensorBoard's `MultiplexerDataProvider` first loads every run into memory (as protos and
reservoirs: about 2.4× the event bytes) and then converts each tensor. A report reads each run
once, so this provider keeps nothing but each run's tag list: `list_tensors` scans every event
file once for it, and `read_tensors` reads the files of the runs asked for again and decodes only
the tags asked for. A 4.4 GB log dir is read without holding it.

It answers as `MultiplexerDataProvider` does for what the reader asks (`list_tensors`,
`read_tensors`): runs are the directories holding `*tfevents*` files, named by their path relative
to the log dir (`.` for the log dir itself); a tag belongs to the plugin whose metadata came with
its first value; samples keep their order of writing (files by name, then records); `downsample`
keeps the last sample and a seeded random choice of the others (TensorBoard's own function).
Records are read by TensorBoard's event file reader (TensorFlow's once it is imported; a
truncated last record is left for later, as TensorBoard does). No TensorFlow import.
"""

import dataclasses
import gc
import os

import numpy as np

__all__ = ["EventFilesProvider"]


@dataclasses.dataclass
class _Tag:
    metadata: object  # the SummaryMetadata of the tag's first value that had one
    max_step: int
    max_wall_time: float


class EventFilesProvider:
    """The `list_tensors` / `read_tensors` part of TensorBoard's `DataProvider`, over event files.

    Args:
      logdir: the log directory (local, or any path TensorBoard's file reader opens).

    Example:
      >>> provider = EventFilesProvider("logs")
      >>> reader.list_runs(provider, None, "")["replicas"]["inputs/batch_size"].max_step
      2
    """

    def __init__(self, logdir, executor=None):
        self._logdir = os.fspath(logdir)
        self._executor = executor  # lists the runs in parallel when given (`list_runs_with`)
        self._files = None  # {run: [event file paths]}, found by the first `list_tensors`
        self._listed = None  # {run: {tag: _Tag}} of every tag, after the first `list_tensors`

    def __getstate__(self):
        return {**self.__dict__, "_executor": None}  # a copy sent to another process lists alone

    def list_runs_with(self, executor):
        """Lists the runs' files with `executor.map` (e.g. a process pool) at the first
        `list_tensors`; returns self."""
        self._executor = executor
        return self

    def for_runs(self, runs):
        """A provider of these runs alone, sharing this one's listing (small to send to another
        process that reads them)."""
        self._list_all()
        view = EventFilesProvider(self._logdir)
        view._files = {run: self._files[run] for run in runs}
        view._listed = {run: self._listed[run] for run in runs}
        return view

    def _runs(self):
        """`{run: [event file paths, sorted]}`, as TensorBoard's `AddRunsFromDirectory` names
        runs."""
        from tensorboard.backend.event_processing import io_wrapper

        runs = {}
        for directory in io_wrapper.GetLogdirSubdirectories(self._logdir):
            name = os.path.relpath(directory, self._logdir)
            files = [
                path
                for path in io_wrapper.ListDirectoryAbsolute(directory)
                if io_wrapper.IsSummaryEventsFile(path)
            ]
            runs[name] = sorted(files)
        return runs

    @staticmethod
    def _values(paths):
        """`(event, value)` of every summary value in the files, in order of writing.

        Python's cyclic garbage collector is paused meanwhile (reading allocates millions of
        objects, none in a cycle; collections triggered by them cost about a tenth of the read).
        """
        from tensorboard.backend.event_processing import event_file_loader
        from tensorboard.compat.proto import event_pb2

        collecting = gc.isenabled()
        gc.disable()
        try:
            for path in paths:
                for record in event_file_loader.RawEventFileLoader(path).Load():
                    event = event_pb2.Event.FromString(record)
                    for value in event.summary.value:
                        yield event, value
        finally:
            if collecting:
                gc.enable()

    def _list_all(self):
        if self._listed is None:
            self._files = self._runs()
            map_runs = map if self._executor is None else self._executor.map
            listings = map_runs(_list_run, self._files.values())
            self._listed = dict(zip(self._files, listings, strict=True))
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
        from tensorboard.data import provider

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
        from tensorboard.data import provider

        index = self._index(plugin_name, run_tag_filter)
        result = {}
        for run, tags in index.items():
            data = {tag: [] for tag in tags}
            for event, value in self._values(self._files[run]):
                series = data.get(value.tag)
                if series is not None and value.HasField("tensor"):
                    series.append(
                        provider.TensorDatum(
                            step=event.step,
                            wall_time=event.wall_time,
                            numpy=tensor_to_numpy(value.tensor),
                        )
                    )
            if downsample is not None:
                # TensorBoard's own choice of samples (the last one and a seeded random subset).
                data = {tag: data_provider._downsample(xs, downsample) for tag, xs in data.items()}
            result[run] = data
        return result


def _list_run(paths):
    """`{tag: _Tag}` of every summary value in one run's event files."""
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


def tensor_to_numpy(tensor):
    """A `TensorProto` as a numpy array, the same as TensorBoard's `tensor_util.make_ndarray`.

    Tensors serialized as bytes (`tensor_content`: every non-scalar numeric one the probe
    writes) are copied out in one call; the rest go through TensorBoard's function.
    """
    content = tensor.tensor_content
    if content:
        dtype = _NUMPY_DTYPES.get(tensor.dtype)
        if dtype is None:
            from tensorboard.compat.tensorflow_stub import dtypes

            dtype = _NUMPY_DTYPES[tensor.dtype] = dtypes.as_dtype(tensor.dtype).as_numpy_dtype
        shape = [dim.size for dim in tensor.tensor_shape.dim]
        return np.frombuffer(content, dtype=dtype).copy().reshape(shape)
    from tensorboard.util import tensor_util

    return tensor_util.make_ndarray(tensor)


# DataType enum value -> numpy dtype, filled on first use.
_NUMPY_DTYPES = {}
