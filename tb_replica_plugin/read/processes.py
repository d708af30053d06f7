"""Process pools that read event files the way this process does (`tb-replica report`).

A large log dir is read faster by several processes: each reads and builds whole runs (the
workers of a job), and sends back their series. TensorBoard's event reader checks CRCs in C++
when TensorFlow is imported and in Python with its stub (`tensorboard.compat.notf`), so a pool's
processes make the same choice as the process that starts them. No TensorFlow import here unless
this process has one.
"""

import concurrent.futures
import multiprocessing
import os
import sys
import types

__all__ = [
    "event_reader",
    "import_tensorflow_quietly",
    "reading_pool",
    "reduce_array",
    "use_deferred_event_reader",
    "use_event_reader",
]

_STUB_MODULE = "tensorboard.compat.notf"


def import_tensorflow_quietly():
    """Imports TensorFlow with its start-up lines on stderr (oneDNN, CUDA) silenced.

    Those lines are written by native code before any log level applies, so file descriptor 2 is
    pointed at /dev/null during the import. Without TensorFlow, TensorBoard uses its stub.
    """
    if "tensorflow" in sys.modules:
        return
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401 - TensorBoard's event reader uses it once imported
    except ImportError:
        pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def event_reader():
    """How TensorBoard reads event files in this process: "tensorflow", "stub", or None (not
    chosen yet: TensorBoard tries TensorFlow at its first read)."""
    if "tensorflow" in sys.modules:
        return "tensorflow"
    return "stub" if _STUB_MODULE in sys.modules else None


def use_event_reader(choice, defer=False):
    """Makes TensorBoard read event files as `choice` (an `event_reader()` value) says.

    Args:
      choice: "tensorflow", "stub" or None (TensorBoard's own choice at its first read).
      defer: with "tensorflow", import it only when this process reads events itself
        (`use_deferred_event_reader`); the processes of `reading_pool` still import it at their
        start. A process that merges what its pool read saves the import (~3 s of CPU).
    """
    global _deferred_reader
    if choice == "tensorflow" and defer:
        _deferred_reader = choice
    elif choice == "tensorflow":
        import_tensorflow_quietly()
    elif choice == "stub" and "tensorflow" not in sys.modules:
        sys.modules.setdefault(_STUB_MODULE, types.ModuleType(_STUB_MODULE))


def use_deferred_event_reader():
    """Before this process reads events: the reader `use_event_reader(..., defer=True)` chose."""
    if _deferred_reader == "tensorflow":
        import_tensorflow_quietly()


# The reader chosen by `use_event_reader(..., defer=True)`, not imported here yet.
_deferred_reader = None


def _start_reading_process(choice):
    """A pool process's initializer: the event reader, and broadcast arrays sent compact."""
    from multiprocessing.reduction import ForkingPickler

    import numpy as np

    use_event_reader(choice)
    ForkingPickler.register(np.ndarray, reduce_array)


def reduce_array(array):
    """Pickles a numpy array; a broadcast view (a stride of 0) as its one repeated block, and an
    array holding one value throughout as that value.

    numpy pickles a view as a full copy: a series' "not checked" arrays, one `np.broadcast_to`
    of NaN, would reach the parent process as full arrays (a few MB per worker of a large job).
    The block is sent with the shape instead, and the parent gets the same read-only view. An
    array of at least `CONSTANT_MIN_BYTES` whose elements are bitwise one value (a healthy job's
    drift arrays: zeros) comes back the same way, as a read-only broadcast of that value.

    Args:
      array: a numpy array.

    Returns:
      The `(callable, args)` pair of `pickle`'s `__reduce__` protocol.

    Example:
      >>> import pickle, numpy as np
      >>> view = np.broadcast_to(np.nan, (1000, 64))
      >>> function, args = reduce_array(view)
      >>> function(*args).shape, len(pickle.dumps(args)) < 1000
      ((1000, 64), True)
    """
    import numpy as np

    if array.dtype.hasobject:
        return array.__reduce__()
    repeated = [s == 0 and n > 1 for s, n in zip(array.strides, array.shape, strict=True)]
    if any(repeated):
        block = array[tuple(slice(0, 1) if r else slice(None) for r in repeated)].copy()
        return np.broadcast_to, (block, array.shape)
    if array.nbytes >= CONSTANT_MIN_BYTES and _one_value(array):
        return np.broadcast_to, (array.reshape(-1)[:1].copy(), array.shape)
    return array.__reduce__()


# Arrays at least this large are checked for holding one value (`reduce_array`).
CONSTANT_MIN_BYTES = 512


def _one_value(array):
    """Whether every element of a non-empty array has the bits of its first (NaN included)."""
    import numpy as np

    if array.dtype.itemsize not in (1, 2, 4, 8) or array.dtype.kind not in "biuf":
        return False
    bits = np.ascontiguousarray(array).reshape(-1).view(f"u{array.dtype.itemsize}")
    first = bits[0]
    if bits[-1] != first or bits[bits.size // 2] != first:  # most arrays differ here
        return False
    return bool((bits == first).all())


def reading_pool(processes):
    """A `ProcessPoolExecutor` of `processes` new processes reading as this one does.

    New interpreters (`spawn`), not forks: a fork of a process running TensorFlow's threads may
    hang. Each starts in about a second (3 s more when it imports TensorFlow).

    Args:
      processes: the number of processes (>= 1).

    Returns:
      The executor (a context manager that waits for its processes and stops them).
    """
    return concurrent.futures.ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_reading_process,
        initargs=(event_reader() or _deferred_reader,),
    )
