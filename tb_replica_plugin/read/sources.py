"""Where a run's samples come from: its event files read on, or TensorBoard's data provider.

A source makes one *tail* per run: an object whose `read(ctx, tags_of_run)` gives the samples
appended since its last read (`read.event_files.TailRead`). The plugin reads its tags through
`FileSource` when TensorBoard serves a log dir it can read (`--logdir`): each read parses only the
bytes appended since (`read.event_files.RunTail`). Otherwise (`--logdir_spec`, a remote data
server, a provider of another kind) `ProviderSource` reads through TensorBoard's data provider,
whose `read_tensors` answers every sample of a tag at each call (it has no step range nor cursor):
what is new is then told apart after the read (per-step filtering), not before it. No TensorFlow.
"""

import os

import numpy as np

from tb_replica_plugin import metadata
from tb_replica_plugin.read.event_files import RunTail, TailRead

__all__ = ["FileSource", "ProviderSource", "ProviderTail"]


class FileSource:
    """Tails over the event files of the runs of one log dir.

    Args:
      logdir: the log directory TensorBoard serves (runs are its sub-directories, named by
        their path relative to it, "." for the log dir itself, as TensorBoard names them).
      fallback: a `ProviderSource` for a run without a directory under `logdir` (a run the
        provider lists from elsewhere), or None (such a run reads nothing).

    Example:
      >>> tail = FileSource("logs").tail("", "job/worker_0")
      >>> sorted(tail.read().samples)[:2]
      ['data/examples', 'data/overlap']
    """

    def __init__(self, logdir, fallback=None):
        self.logdir = os.fspath(logdir)
        self._fallback = fallback

    def tail(self, experiment_id, run):
        """A new tail of `run` (nothing read yet)."""
        directory = self.logdir if run == "." else os.path.join(self.logdir, run)
        if self._fallback is not None and "://" not in directory and not os.path.isdir(directory):
            return self._fallback.tail(experiment_id, run)
        return _FileTail(RunTail(directory, metadata.PLUGIN_NAME))


class _FileTail:
    """A `RunTail` with the tails' `read(ctx, tags_of_run)` signature (both are unused)."""

    def __init__(self, tail):
        self._tail = tail

    @property
    def values_read(self):
        return self._tail.values_read

    @property
    def directory(self):
        """The run's directory."""
        return self._tail.directory

    def adopt(self, run_tail):
        """Reads on from `run_tail`: a `RunTail` of the same run that read its files elsewhere
        (`shared_read`), in place of this one's."""
        self._tail = run_tail

    def read(self, ctx=None, tags_of_run=None):
        return self._tail.read()


class ProviderSource:
    """Tails over TensorBoard's data provider.

    Args:
      provider: a TensorBoard `DataProvider`.
      downsample: samples per tag asked (`reader.ALL_SAMPLES`: every sample the provider kept).
    """

    def __init__(self, provider, downsample):
        self._provider = provider
        self._downsample = downsample

    def tail(self, experiment_id, run):
        """A new tail of `run` (nothing read yet)."""
        return ProviderTail(self._provider, experiment_id, run, self._downsample)


class ProviderTail:
    """One run's samples through a data provider; each read gives those new since the last.

    `read_tensors` answers every sample of a tag, so a read asks them all again (only when the
    provider's listing of the run changed) and keeps those past a cursor per tag: how many
    samples it had, and the step and wall time of the last. When the samples before the cursor
    are no longer the same (TensorBoard keeps a random sample of each tag unless told to keep
    all, or it dropped the steps of a restarted run) the read says `reset`: read the run again.

    Attributes:
      values_read: samples answered by the provider so far (what reading costs it).
    """

    def __init__(self, provider, experiment_id, run, downsample):
        self._provider = provider
        self._experiment_id = experiment_id
        self._run = run
        self._downsample = downsample
        self._cursor = {}  # tag -> (count, step, wall time) of what was read
        self._listed = None  # the run's listing at the last read
        self.values_read = 0

    def read(self, ctx=None, tags_of_run=None):
        """The samples new since the last read (`TailRead`).

        Args:
          ctx: the `RequestContext`.
          tags_of_run: `{tag: TensorTimeSeries}` of the run (the provider's listing), or None to
            list it here.
        """
        from tensorboard.data import provider as provider_lib

        if tags_of_run is None:
            listing = self._provider.list_tensors(
                ctx,
                experiment_id=self._experiment_id,
                plugin_name=metadata.PLUGIN_NAME,
                run_tag_filter=provider_lib.RunTagFilter(runs=[self._run]),
            )
            tags_of_run = listing.get(self._run, {})
        contents = {tag: series.plugin_content for tag, series in tags_of_run.items()}
        version = {tag: (s.max_step, s.max_wall_time) for tag, s in tags_of_run.items()}
        if version == self._listed or not tags_of_run:
            return TailRead(samples={}, contents=contents)
        data = self._provider.read_tensors(
            ctx,
            experiment_id=self._experiment_id,
            plugin_name=metadata.PLUGIN_NAME,
            downsample=self._downsample,
            run_tag_filter=provider_lib.RunTagFilter(runs=[self._run], tags=list(tags_of_run)),
        ).get(self._run, {})
        self._listed = version
        self.values_read += sum(len(points) for points in data.values())
        samples, reset = {}, False
        for tag, points in data.items():
            count, step, wall = self._cursor.get(tag, (0, None, None))
            if count and (len(points) < count or not _same(points[count - 1], step, wall)):
                reset = True
            new = points[count:]
            if new:
                samples[tag] = [(int(d.step), np.asarray(d.numpy)) for d in new]
                self._cursor[tag] = (len(points), new[-1].step, new[-1].wall_time)
        answered = sum(len(points) for points in data.values())
        return TailRead(samples, contents, files=1, values=answered, reset=reset)


def _same(datum, step, wall):
    return datum.step == step and datum.wall_time == wall
