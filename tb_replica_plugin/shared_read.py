"""A large job's first read shared with a helper process: `first_reads`.

Reading a job's workers the first time is bound by CPU (about 10 ms per worker of 8 replicas
and 1,000 logged steps: parsing its event files and building its series), and TensorBoard
serves the plugin from one process. When the tab asks for a large job that the plugin has not
read yet (local event files, `MIN_RUNS` workers and `MIN_BYTES` or more), a helper process
(a new interpreter, `python -m tb_replica_plugin.shared_read`, no TensorFlow) reads workers
beside this process, which merges every worker in worker order:

- the helper reads the workers in order, skipping those this process claimed, and announces
  each before it reads it; it sends each read as a file (a pickle of the worker's
  `member_read.MemberRead`, `member_read.trimmed`, and its `read.event_files.RunTail`, so that later
  refreshes read on from where the helper stopped) in a temporary directory, and a line on
  its pipe saying it is there;
- this process takes each worker in order: the helper's read when the helper announced it,
  else its own (claimed first). While the helper reads the worker this process needs next,
  this process reads a later one ahead (at most `AHEAD`), so neither waits for the other for
  long. A worker both took is read twice, and this process keeps its own read;
- the helper reads at most `LEAD` workers past the one this process merges, so its files
  stay few;
- any failure of the helper (it cannot start, dies, sends what does not load, or sends nothing
  for `RESULT_TIMEOUT` seconds) is logged once, the helper is ended, and this process reads
  the workers it has not got. Nothing of the job is lost.

Set `SHARED_READ_ENV` (`TB_REPLICA_SHARED_READ=0`) to read every worker in this process.

Why not a one-process `concurrent.futures.ProcessPoolExecutor` (as `read.processes` for the
report), measured (docs/architecture.md, "Multi-worker jobs"): its futures are "running" once
queued to the process, two at a time, so this process cannot claim a worker the helper has not
begun; its results come back through a pipe that its manager thread reads and unpickles, waiting
on the GIL at each 64 kB while this process merges (a 12 MB read cost this process 11-27 ms of
CPU and arrived 77-418 ms after it was returned, against 6-12 ms to load it from its file in
`/dev/shm`); a prototype read a 48-worker job no faster; and a `spawn` process imports
TensorBoard's main module again.
"""

import contextlib
import copyreg
import logging
import mmap
import os
import pickle
import select
import shutil
import struct
import subprocess
import sys
import tempfile

__all__ = ["AHEAD", "LEAD", "MIN_BYTES", "MIN_RUNS", "RESULT_TIMEOUT", "first_reads"]

# A job is read with a helper from this many workers and this many bytes of event files on.
MIN_RUNS = 8
MIN_BYTES = 64 * 1024 * 1024
# Workers this process reads ahead of the one it merges while the helper reads that one.
AHEAD = 4
# Workers the helper reads past the one this process merges.
LEAD = 8
# Seconds this process waits for a worker the helper announced before it reads it itself.
RESULT_TIMEOUT = 60.0
SHARED_READ_ENV = "TB_REPLICA_SHARED_READ"
# The helper's files are written to /dev/shm when it has this many bytes free.
SHM_FREE = 1024 * 1024 * 1024

_FRAME = struct.Struct("<cI")  # what (a byte), a worker's index
_TAKING, _DONE, _ERROR = b"T", b"R", b"E"  # from the helper; an error ends its frames
_CLAIM, _MERGING = b"C", b"M"  # to the helper: a worker read here; the worker merged now
_warned = False


@contextlib.contextmanager
def first_reads(members):
    """The first reads of a job's members (`group.Member`, in order), shared with a helper.

    Args:
      members: the job's members; their tails (`read.sources` file tails) have read nothing.

    Yields:
      None when the job is not worth a helper (`worth_sharing`), else an iterator of each
      member's `member_read.MemberRead` in order, for `GroupState.refresh`'s first read. A member
      read by the helper reads on from the helper's tail.
    """
    if not worth_sharing(members):
        yield None
        return
    helper = _Helper([(m.run, m.tail.directory) for m in members])
    try:
        yield _reads(members, helper)
    finally:
        helper.close()


def worth_sharing(members):
    """Whether a helper reads part of the job: local event files, `MIN_RUNS` members and
    `MIN_BYTES` or more, 2 CPUs or more, and `SHARED_READ_ENV` not "0"."""
    if os.environ.get(SHARED_READ_ENV, "1") == "0" or len(members) < MIN_RUNS:
        return False
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        return False
    directories = [getattr(m.tail, "directory", None) for m in members]
    if any(d is None or "://" in d for d in directories):
        return False
    from tb_replica_plugin.read.event_files import event_bytes

    return event_bytes(directories, MIN_BYTES) >= MIN_BYTES


def _reads(members, helper):
    """Each member's `MemberRead` in order: the helper's, or read here (some ahead)."""
    held = {}  # index -> a MemberRead read here ahead of its turn
    for index, member in enumerate(members):
        helper.merging(index)
        got = held.pop(index, None)
        while got is None:
            helper.look()
            if helper.announced(index):
                got = helper.take(index, member)
                if got is None and helper.announced(index):  # not there yet: read ahead
                    ahead = _next_ahead(members, index, helper, held)
                    if ahead is None:
                        helper.wait()
                    else:
                        held[ahead] = _read_here(members[ahead], ahead, helper)
            else:
                got = _read_here(member, index, helper)
        yield got


def _next_ahead(members, index, helper, held):
    """The next worker after `index` neither side took, or None (or `AHEAD` held already)."""
    if len(held) >= AHEAD:
        return None
    for later in range(index + 1, len(members)):
        if later not in held and not helper.announced(later):
            return later
    return None


def _read_here(member, index, helper):
    from tb_replica_plugin import member_read

    helper.claim(index)
    return member_read.read_member(member.run, member.tail.read(), None, True)


class _Frames:
    """The whole `_FRAME`s of a pipe read in pieces (a piece may end inside a frame)."""

    def __init__(self):
        self._pending = b""

    def whole(self, data):
        """`[(what, index)]` of the frames that `data` completes."""
        self._pending += data
        whole = len(self._pending) // _FRAME.size * _FRAME.size
        frames = list(_FRAME.iter_unpack(self._pending[:whole]))
        self._pending = self._pending[whole:]
        return frames


class _Helper:
    """The helper process of one job's first read: its pipes and its files."""

    def __init__(self, runs):
        self._announced, self._done = set(), set()
        self._ended = False
        self._frames = _Frames()
        self._directory = tempfile.mkdtemp(prefix="tb_replica_read_", dir=_files_directory())
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)
        try:
            self._process = subprocess.Popen(
                _helper_command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": path},
            )
            start = pickle.dumps((runs, self._directory))
            self._tell(struct.pack("<Q", len(start)) + start)
        except OSError as error:
            self._process = None
            self._end(f"it could not start ({error})")
            return
        self._fd = self._process.stdout.fileno()
        os.set_blocking(self._fd, False)

    def announced(self, index):
        """Whether the helper took worker `index` (and has it, or is still reading it)."""
        return index in self._announced and (index in self._done or not self._ended)

    def look(self):
        """Takes in what the helper sent so far, without waiting."""
        while not self._ended:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            if not data:  # the helper ended: a warning if it left a worker it took
                self._end("it stopped" if self._announced - self._done else None)
                return
            for what, index in self._frames.whole(data):
                self._take_frame(what, index)

    def _take_frame(self, what, index):
        if what == _TAKING:
            self._announced.add(index)
        elif what == _DONE:
            self._done.add(index)
        else:
            self._end(self._error_text())

    def wait(self):
        """Waits until the helper sends something (at most `RESULT_TIMEOUT` seconds)."""
        if self._ended:
            return
        ready, _, _ = select.select([self._fd], [], [], RESULT_TIMEOUT)
        if not ready:
            self._end(f"it sent nothing for {RESULT_TIMEOUT:.0f} s")

    def take(self, index, member):
        """The helper's `MemberRead` of worker `index` (its tail adopted by `member`), or None
        when it has not sent it yet."""
        if index not in self._done:
            return None
        path = self._path(index)
        try:
            with (
                open(path, "rb") as handle,
                mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ) as m,
            ):
                got, run_tail = pickle.loads(m)
            os.unlink(path)
        except Exception as error:  # noqa: BLE001 - what the helper sent does not load: read here
            self._done.discard(index)
            self._end(f"its read of worker {index} did not load ({error})")
            return None
        member.tail.adopt(run_tail)
        return got

    def claim(self, index):
        """Tells the helper that worker `index` is read here."""
        self._tell(_FRAME.pack(_CLAIM, index))

    def merging(self, index):
        """Tells the helper which worker is merged now (it reads at most `LEAD` past it)."""
        self._tell(_FRAME.pack(_MERGING, index))

    def _tell(self, data):
        if self._ended:
            return
        try:
            self._process.stdin.write(data)
            self._process.stdin.flush()
        except (OSError, ValueError):
            pass  # the helper ended; `look` tells

    def _path(self, index):
        return os.path.join(self._directory, f"{index}.pickle")

    def _error_text(self):
        try:
            with open(os.path.join(self._directory, "error.txt")) as handle:
                return handle.read()
        except OSError:
            return "it failed"

    def _end(self, why):
        """Ends the helper, warning once why, if a why (this process reads the rest)."""
        if not self._ended and why is not None:
            _warn(why)
        self._ended = True
        if self._process is not None and self._process.poll() is None:
            self._process.kill()

    def close(self):
        """Ends the helper and removes its files. It has nothing left to do, so it is killed
        rather than left to exit: its interpreter's exit (tearing down numpy and the rest) took
        65 ms, while the first read waited for it."""
        self._ended = True
        if self._process is not None:
            with contextlib.suppress(OSError, ValueError):
                self._process.stdin.close()
            if self._process.poll() is None:
                self._process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # reaped later by Popen
                self._process.wait(timeout=5)
            self._process.stdout.close()
        shutil.rmtree(self._directory, ignore_errors=True)


def _files_directory():
    """Where the helper's files go: memory (`/dev/shm`) where it is writable with `SHM_FREE`
    bytes free (a container's is often 64 MB), else the temporary directory (None)."""
    try:
        if os.access("/dev/shm", os.W_OK) and shutil.disk_usage("/dev/shm").free >= SHM_FREE:
            return "/dev/shm"
    except OSError:
        pass
    return None


def _helper_command():
    """The command starting the helper: this module run by this interpreter."""
    return [sys.executable, "-m", __name__]


def _warn(why):
    global _warned
    if not _warned:
        _warned = True
        logging.getLogger(__name__).warning(
            "tb_replica_plugin: the helper process reading a large job stopped, so TensorBoard's "
            "process reads the rest itself (%s). Set %s=0 to read without it.",
            why,
            SHARED_READ_ENV,
        )


# ------------------------------------------------------------------------------ the helper


def _serve(stdin_fd, stdout, runs, directory):
    """The helper's loop: reads the workers in order, skipping those the other process
    claimed and staying at most `LEAD` past the one it merges; announces each and tells
    when its file is written (in `directory`)."""
    other = _OtherProcess(stdin_fd)
    for index, (run, run_directory) in enumerate(runs):
        if not other.wait_for_turn(index):
            return
        if index in other.claimed:
            continue
        _send(stdout, _TAKING, index)
        path = os.path.join(directory, f"{index}.pickle")
        with open(path + ".part", "wb") as handle:
            _read_worker(run, run_directory, handle)
        os.rename(path + ".part", path)
        _send(stdout, _DONE, index)


def _read_exactly(fd, size):
    """`size` bytes of `fd` (unbuffered: what follows is read without waiting)."""
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("the other process closed the pipe")
        data += chunk
    return data


def _read_worker(run, directory, handle):
    """Reads a worker and pickles its `MemberRead` (`member_read.trimmed`) and `RunTail` into the
    file `handle` (broadcast views and arrays of one value compact:
    `read.processes.reduce_array`). Straight into the file: through a buffer first, pickling
    and writing a worker of the 256-worker benchmark took twice as long."""
    import numpy as np

    from tb_replica_plugin import member_read, metadata
    from tb_replica_plugin.read import event_files, processes

    tail = event_files.RunTail(directory, metadata.PLUGIN_NAME)
    with event_files.reading_in_bulk():
        got = member_read.trimmed(member_read.read_member(run, tail.read(), None, True))
    if got.data is not None:
        got.data.samples = _merged_samples(got.data.samples)
    pickler = pickle.Pickler(handle, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {**copyreg.dispatch_table, np.ndarray: processes.reduce_array}
    pickler.dump((got, tail))


def _merged_samples(samples):
    """Of a job worker's `RunData.samples`, those its families' mergers read (all of them
    when a merger does not say: `core.jobs.Merger.sample_tags`)."""
    from tb_replica_plugin import registry

    tags = set()
    for family in registry.families():
        if family.merger is not None and not family.live:
            if family.merger.sample_tags is None:
                return samples
            tags.update(family.merger.sample_tags)
    return {tag: points for tag, points in samples.items() if tag in tags}


def _send(stdout, what, index):
    stdout.write(_FRAME.pack(what, index))
    stdout.flush()


class _OtherProcess:
    """What the other process told the helper: the workers it claimed, the one it merges."""

    def __init__(self, fd):
        self._fd = fd
        self._frames = _Frames()
        self.claimed = set()
        self.merging = -1
        self.gone = False

    def wait_for_turn(self, index):
        """Reads what the other process sent; waits while `index` is more than `LEAD` past the
        worker it merges. False when it closed the pipe (it has every worker)."""
        while True:
            self._look(timeout=0)
            if self.gone:
                return False
            if index <= self.merging + LEAD:
                return True
            self._look(timeout=RESULT_TIMEOUT)

    def _look(self, timeout):
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if not ready:
            return
        data = os.read(self._fd, 65536)
        if not data:
            self.gone = True
            return
        for what, index in self._frames.whole(data):
            if what == _CLAIM:
                self.claimed.add(index)
            else:
                self.merging = max(self.merging, index)


def main():
    """The helper's entry point (`python -m tb_replica_plugin.shared_read`)."""
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the frames
    stdin_fd = sys.stdin.fileno()
    try:
        (size,) = struct.unpack("<Q", _read_exactly(stdin_fd, 8))
        runs, directory = pickle.loads(_read_exactly(stdin_fd, size))  # [(run, dir)], dir
        _serve(stdin_fd, stdout, runs, directory)
    except (BrokenPipeError, EOFError):
        pass  # the other process is done
    except Exception as error:  # noqa: BLE001 - told to the other process, which reads on
        with contextlib.suppress(OSError):
            with open(os.path.join(directory, "error.txt"), "w") as handle:
                handle.write(f"{type(error).__name__}: {error}")
            _send(stdout, _ERROR, 0)


if __name__ == "__main__":
    main()
