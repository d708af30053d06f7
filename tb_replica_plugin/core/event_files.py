"""A data provider over a log dir's event files for `tb-replica report` and `load()`.

TensorBoard's `MultiplexerDataProvider` first loads every run into memory (as protos and
reservoirs: about 2.4× the event bytes) and then converts each tensor. A report reads each run
once, so this provider keeps nothing but each run's tag list: `list_tensors` scans every event
file once for it, and `read_tensors` reads the files of the runs asked for again and decodes only
the tags asked for. A 4.4 GB log dir is read without holding it. A provider of one run
(`for_run_read_once`) does both in one pass: it keeps the plugin's samples of the listing for its
first `read_tensors` (what `reader.read_log_dir` uses: every run it lists it reads).

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
from tensorboard.data import provider

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

    def __init__(self, logdir):
        self._logdir = os.fspath(logdir)
        self._files = None  # {run: [event file paths]}, found by the first `list_tensors`
        self._listed = None  # {run: {tag: _Tag}} of every tag, after the first `list_tensors`
        self._kept = None  # {run: {tag: [TensorDatum]}}: `for_run_read_once`
        self._kept_plugin = None

    def run_names(self):
        """The runs: directories holding event files, with or without this plugin's data."""
        if self._files is None:
            self._files = self._runs()
        return list(self._files)

    def for_run_read_once(self, run, plugin_name):
        """A provider of one run (of `run_names`) that lists and reads its files in one pass.

        Its first `list_tensors` keeps the samples of the tags that are (or may be) the plugin's
        for its first `read_tensors`, which answers from them and lets them go; later calls read
        the files again. Small to send to another process (no listing yet).

        Args:
          run: the run.
          plugin_name: the plugin whose samples are kept.

        Returns:
          The provider.
        """
        self.run_names()
        view = EventFilesProvider(self._logdir)
        view._files = {run: self._files[run]}
        view._kept = {}
        view._kept_plugin = plugin_name
        return view

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
                runs[name] = sorted(
                    os.path.join(directory, n)
                    for n in names
                    if "tfevents" in n and not n.endswith(".profile-empty")
                )
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
            self.run_names()
            self._listed = {}
            for run, paths in self._files.items():
                kept = None if self._kept is None else self._kept.setdefault(run, {})
                self._listed[run] = _list_run(paths, kept, self._kept_plugin)
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
            kept = (self._kept or {}).pop(run, None)
            if kept is None:
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


def _list_run(paths, kept=None, plugin_name=None):
    """`{tag: _Tag}` of every summary value in one run's event files.

    Args:
      paths: the run's event files, in order.
      kept: a dict that gets `{tag: [TensorDatum]}` of the tensor values of
        every tag whose metadata names `plugin_name` (or has come with none yet), or None.
      plugin_name: see `kept`.
    """
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
        if kept is not None and value.HasField("tensor") and _ours(tag, plugin_name):
            kept.setdefault(value.tag, []).append(_datum(event, value))
    return tags


def _ours(tag, plugin_name):
    """Whether a tag's metadata names the plugin (or has come with none yet)."""
    return tag.metadata is None or tag.metadata.plugin_data.plugin_name == plugin_name


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
