"""A bounded, thread-safe cache: least recently used entries go first once a byte budget is full.

Used by `tb_replica_plugin.store` to keep the runs read by the tab, their findings and their
`/runs` entries between requests. Sizes are estimates (`approx_bytes`): numpy arrays count their
buffers, containers their items, anything else a fixed overhead. No TensorFlow.
"""

import collections
import dataclasses
import sys
import threading

import numpy as np

# What one Python object costs besides what it holds (header, dict slot, pointers).
_OBJECT_BYTES = 64
# Lists longer than this are measured on this many evenly spaced items.
_LONG = 256


def approx_bytes(value, limit=10_000_000):
    """An estimate of the memory held by `value` and what it references (shared parts once).

    Args:
      value: any object: numpy arrays, dataclasses, dicts, lists, tuples, sets, strings and
        objects with a `__dict__` are walked; anything else counts `_OBJECT_BYTES`.
      limit: walk at most this many objects (the estimate of the rest is dropped).

    Returns:
      An int, in bytes.

    Example:
      >>> approx_bytes({"a": np.zeros(1000)}) >= 8000
      True
    """
    seen = set()
    todo = [value]
    total = 0
    while todo and len(seen) < limit:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, np.ndarray):
            total += item.nbytes + _OBJECT_BYTES
            if item.dtype == object:
                todo.extend(item.ravel().tolist())
        elif isinstance(item, (str, bytes)):
            total += sys.getsizeof(item)
        elif isinstance(item, dict):
            total += _OBJECT_BYTES + 16 * len(item)
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)) and len(item) > _LONG:
            # A long list (e.g. a tag's samples): measure evenly spaced items and scale up.
            stride = len(item) / _LONG
            picked = [item[int(i * stride)] for i in range(_LONG)]
            total += _OBJECT_BYTES + 8 * len(item)
            total += int(approx_bytes(picked, limit) * len(item) / _LONG)
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += _OBJECT_BYTES + 8 * len(item)
            todo.extend(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            total += _OBJECT_BYTES
            todo.extend(getattr(item, f.name) for f in dataclasses.fields(item))
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            total += _OBJECT_BYTES
            todo.extend(vars(item).values())
        else:
            total += _OBJECT_BYTES
    return total


class ByteLRU:
    """A cache bounded by the estimated bytes of its values, least recently used evicted first.

    Each entry may name a `slot` (e.g. the run a value belongs to, without its data version):
    putting a new value in a slot drops the slot's previous entry, so an old version of a run
    does not wait for eviction.

    Attributes:
      max_bytes: the budget; a value larger than half of it is returned but not kept, so one
        large read (a big job's arrays) cannot evict every small answer and findings.
      bytes: the estimated bytes held now.

    Example:
      >>> cache = ByteLRU(1 << 20)
      >>> cache.get_or_compute(("findings", "run", 1), lambda: [1, 2])
      [1, 2]
      >>> cache.get(("findings", "run", 1))
      [1, 2]
    """

    def __init__(self, max_bytes):
        """Args:
        max_bytes: the budget in bytes (int > 0).

        Raises:
          ValueError: if `max_bytes` is not positive.
        """
        if max_bytes <= 0:
            raise ValueError(f"cache budget must be positive, got {max_bytes!r} bytes")
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self._entries = collections.OrderedDict()  # key -> (value, size, slot)
        self._slots = {}  # slot -> key
        self._computing = SingleFlight()
        self._lock = threading.Lock()

    def __len__(self):
        return len(self._entries)

    def get(self, key, default=None):
        """The value of `key` (now the most recently used), or `default`."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return default
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key, value, size=None, slot=None):
        """Keeps `value` under `key` (replacing the entry of `slot`), then evicts to the budget.

        Args:
          key: a hashable key.
          value: the value.
          size: its bytes (default: `approx_bytes(value)`).
          slot: optional hashable; the slot's previous entry (another key) is dropped.

        Returns:
          `value`.
        """
        size = approx_bytes(value) if size is None else int(size)
        with self._lock:
            self._drop(key)
            if slot is not None:
                previous = self._slots.get(slot)
                if previous is not None:
                    self._drop(previous)
            if size > self.max_bytes // 2:
                return value
            self._entries[key] = (value, size, slot)
            self.bytes += size
            if slot is not None:
                self._slots[slot] = key
            while self.bytes > self.max_bytes and self._entries:
                self._drop(next(iter(self._entries)))
        return value

    def get_or_compute(self, key, compute, slot=None):
        """The cached value of `key`, else `compute()` kept under `key` (see `put`).

        One thread computes a key at a time: another thread missing the same key meanwhile
        waits for that computation and gets its value (even one too large to keep); if it
        raised, the waiting thread computes the key itself.
        """
        missing = object()
        value = self.get(key, missing)
        if value is not missing:
            return value

        def compute_and_keep():
            kept = self.get(key, missing)  # by a computation that ended since the look above
            return self.put(key, compute(), slot=slot) if kept is missing else kept

        return self._computing.run(key, compute_and_keep)

    def clear(self):
        """Drops every entry."""
        with self._lock:
            self._entries.clear()
            self._slots.clear()
            self.bytes = 0

    def _drop(self, key):
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry[1]
            if entry[2] is not None and self._slots.get(entry[2]) == key:
                del self._slots[entry[2]]


class SingleFlight:
    """Runs a computation of a key in one thread at a time.

    A thread asking for a key being computed waits for that computation and gets its value; if
    it raised, the waiting thread computes the key itself. Nothing is kept afterwards.

    Example:
      >>> SingleFlight().run("listing", lambda: [1, 2])
      [1, 2]
    """

    def __init__(self):
        self._running = {}  # key -> _Computation
        self._lock = threading.Lock()

    def __len__(self):
        """The number of keys being computed now."""
        return len(self._running)

    def run(self, key, compute):
        """`compute()`, or the value of the computation of `key` under way in another thread.

        Args:
          key: a hashable key.
          compute: `fn() -> value`.

        Returns:
          The value.

        Raises:
          Whatever `compute` raises (in the thread that ran it).
        """
        with self._lock:
            computation = self._running.get(key)
            computing = computation is None
            if computing:
                computation = self._running[key] = _Computation()
        if not computing:
            computation.done.wait()
            return computation.value if computation.succeeded else self.run(key, compute)
        try:
            computation.value = compute()
            computation.succeeded = True
            return computation.value
        finally:
            with self._lock:
                del self._running[key]
            computation.done.set()


class _Computation:
    """A value being computed by one thread of `SingleFlight.run`, awaited by others."""

    def __init__(self):
        self.done = threading.Event()
        self.succeeded = False
        self.value = None
