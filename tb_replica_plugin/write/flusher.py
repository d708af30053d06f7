"""One background thread that flushes every live probe's event file every `flush_secs`.

Nothing in a training step's graph touches the event file: in-graph writes only queue events in
the writer; the file is written by host-side flushes (this thread, the probe's `flush`/`close`, the
callback's epoch and train ends, interpreter exit). So an I/O error surfaces on the host, where the
probe catches it, warns once and stops recording; it can never fail a training step.
"""

import atexit
import logging
import threading
import time
import weakref

logger = logging.getLogger("tb_replica_plugin.probe")


class Flusher:
    """One daemon thread that flushes every live probe's writer every `flush_secs`.

    Probes are held by weak reference, so a forgotten probe is still collected. `atexit` stops
    the thread and flushes every live probe before the interpreter shuts down.
    """

    def __init__(self):
        self._probes = weakref.WeakSet()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread = None

    def register(self, probe):
        with self._lock:
            if self._stopped:
                return
            self._probes.add(probe)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tb_replica_plugin-flush", daemon=True
                )
                self._thread.start()
                atexit.register(self.stop)
        self._wake.set()  # re-plan with this probe's interval

    def wake(self):
        """Wakes the thread now (a probe whose next flush is due at once: `flush_soon`)."""
        self._wake.set()

    def unregister(self, probe):
        with self._lock:
            self._probes.discard(probe)

    def _run(self):
        while True:
            self._wake.clear()
            with self._lock:
                if self._stopped:
                    return
                probes = list(self._probes)
            now = time.monotonic()
            wait = 1.0
            for probe in probes:
                try:
                    wait = min(wait, probe.flush_if_due(now))
                except Exception:  # noqa: BLE001 - e.g. warnings turned into errors: keep going
                    logger.exception("tb_replica_plugin: background flush failed")
            del probes
            self._wake.wait(max(wait, 0.01))

    def stop(self):
        """Stops the thread and flushes every live probe (registered with `atexit`)."""
        with self._lock:
            self._stopped = True
            probes = list(self._probes)
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=10)
        for probe in probes:
            probe.flush()


FLUSHER = Flusher()
