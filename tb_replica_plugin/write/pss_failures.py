"""ParameterServerStrategy: the worker failures and recoveries the `ClusterCoordinator` handles,
recorded as status events of the run.

When a worker's server stops mid-run, the coordinator's thread for that worker sees the scheduled
step fail, puts it back in its queue (another worker runs it) and waits until the worker is back;
training goes on. TensorFlow offers no public hook for this: each `Worker` of
`coordinator._cluster.workers` (tensorflow/python/distribute/coordinator/cluster_coordinator.py)
calls its own `_on_closure_failure(closure, error)` when a step it ran failed because the worker
is gone (the closure goes back in the queue) and `_on_worker_recovery()` once the coordinator
reconnected to it. These private names are the same from TensorFlow 2.12 to 2.21 (the supported
2.16 included); where they are missing, the probe warns once that worker failures are not
recorded and training goes on.

`watch(probe, coordinator)` (from `ReplicaProbe.schedule`) wraps both methods on each `Worker`
*instance*, once per coordinator; the wrappers always call TensorFlow's own method and, on the
coordinator's worker threads, hand a "worker_failed" or "worker_recovered" event to the status
recorder of every probe watching (`Recorder.note_event`: a thread-safe list, no lock of the
probe's); the probe writes them on the coordinator under its host lock (at each `schedule`, each
background flush, `flush` and `close`).
"""

import contextlib
import threading
import time
import weakref

from tb_replica_plugin.families.status import schema

# Where the watch of a coordinator is kept (on its `_cluster`).
_ATTRIBUTE = "_tb_replica_plugin_failures"
_NOT_RECORDED = (
    "tb_replica_plugin: worker failures and recoveries under ParameterServerStrategy are not "
    "recorded with this TensorFlow ({why}); training goes on."
)


class _Watch:
    """The wrapped workers of one coordinator and the status recorders listening to them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.listeners = weakref.WeakSet()  # status recorders of the probes watching
        self.retried = {}  # worker index -> closures put back after its failures

    def failed(self, worker, error):
        """A worker thread: `worker` failed with `error` (its closure was put back)."""
        with self.lock:
            index = int(worker.worker_index)
            self.retried[index] = self.retried.get(index, 0) + 1
            retried = self.retried[index]
        lines = str(error).strip().splitlines()
        self._tell(
            schema.EVENT_WORKER_FAILED,
            worker=index,
            device=str(worker.device_name),
            error_class=type(error).__name__,
            error=(lines[0] if lines else "")[: schema.MESSAGE_CHARS],
            retried=retried,
        )

    def recovered(self, worker):
        """A worker thread: `worker` came back."""
        self._tell(
            schema.EVENT_WORKER_RECOVERED,
            worker=int(worker.worker_index),
            device=str(worker.device_name),
        )

    def _tell(self, event_type, **fields):
        wall = time.time()
        with self.lock:
            listeners = [r for r in self.listeners if r.probe.__dict__.get("_core") is not None]
        for recorder in listeners:  # (a closed probe's recorder is left out)
            recorder.note_event(event_type, wall, step=_next_step(recorder.probe), **fields)


def _next_step(probe):
    """The next step the coordinator writes (`write.pss`), read without a lock (an int)."""
    state = probe.__dict__.get("_pss_state")
    return None if state is None else int(state.next_step)


def _wrap(worker, watch):
    """Wraps `worker`'s two methods (on the instance; TensorFlow's own is always called)."""
    on_failure, on_recovery = worker._on_closure_failure, worker._on_worker_recovery  # noqa: SLF001

    def _on_closure_failure(closure, error):
        try:
            return on_failure(closure, error)
        finally:
            with contextlib.suppress(Exception):  # never in the coordinator's way
                watch.failed(worker, error)

    def _on_worker_recovery():
        result = on_recovery()
        with contextlib.suppress(Exception):  # never in the coordinator's way
            watch.recovered(worker)
        return result

    worker._on_closure_failure = _on_closure_failure  # noqa: SLF001
    worker._on_worker_recovery = _on_worker_recovery  # noqa: SLF001


def _install(cluster):
    """The `_Watch` of `cluster` (made and its workers wrapped on the first call).

    Raises:
      AttributeError: if the cluster or a worker lacks what is wrapped.
    """
    watch = getattr(cluster, _ATTRIBUTE, None)
    if watch is not None:
        return watch
    workers = list(cluster.workers)
    for worker in workers:
        for name in ("_on_closure_failure", "_on_worker_recovery", "worker_index", "device_name"):
            if not hasattr(worker, name):
                raise AttributeError(f"its cluster coordinator's Worker has no {name}")
    watch = _Watch()
    for worker in workers:
        _wrap(worker, watch)
    setattr(cluster, _ATTRIBUTE, watch)
    return watch


def watch(probe, coordinator):
    """Records `coordinator`'s worker failures and recoveries in `probe`'s run (the status
    family's events), and writes those seen since the last call. Never raises: where the
    coordinator lacks TensorFlow's private names, warns once that they are not recorded.

    Args:
      probe: a built `ReplicaProbe` under `ParameterServerStrategy`.
      coordinator: its `ClusterCoordinator`.
    """
    try:
        recorder = probe.recorder("status")
    except KeyError:
        return
    watched = probe.__dict__.get("_pss_failures_watched")
    if watched is None:
        try:
            cluster = coordinator._cluster  # noqa: SLF001
            watcher = _install(cluster)
            with watcher.lock:
                watcher.listeners.add(recorder)
        except Exception as error:  # noqa: BLE001 - a TensorFlow without these names
            probe.warn_once("pss_failures", _NOT_RECORDED.format(why=error))
        probe.__dict__["_pss_failures_watched"] = True
    try:
        recorder.write_noted()
    except Exception as error:  # noqa: BLE001 - never break training
        probe.warn_failed("status", error, "the worker failures")
