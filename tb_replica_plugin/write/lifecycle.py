"""A stretch of training as the probe sees it: when it begins, which step the host is at, how it
ends.

`Lifecycle` is the part of `ProbeCore` that tells every family's recorder (`Recorder.begun`,
`Recorder.ended`) when training begins and how it ended: `end_run` builds a `RunEnd` from what
ended it (nothing: a clean end; an exception; the findings of `halt_on`); the status family
writes it down. Imports nothing heavy.
"""

from tb_replica_plugin.core.run_end import (  # noqa: F401 - the states, re-exported
    CRASHED,
    FINISHED,
    HALTED,
    INTERRUPTED,
    STATES,
    RunEnd,
    run_end,
)


class Lifecycle:
    """`ProbeCore`'s begin, end and host steps of a stretch of training (a mixin: it uses the
    probe's `_lock`, `_core`, `_disabled_reason`, `_recorders`, `_axis`, `flush`, `flush_soon`,
    `_flush_writer` and `warn_failed`)."""

    def begin_run(self, how):
        """Host side: a stretch of training begins (the first record; each Keras `fit`).

        Every family's `Recorder.begun(how)` runs (the status family writes a start record
        unless the previous stretch has not ended), then the file is flushed. A failure warns
        once.
        """
        with self._lock:
            if self._core is None or self._disabled_reason:
                return
            self._tell_recorders("begun", how)
            self._flush_writer()  # what begun wrote is on disk even if the process dies now

    def end_run(
        self, how, error=None, step=None, findings=(), context=(), wait=None, unreturned=False
    ):
        """Host side: the stretch of training ended; every family hears how, then the file is
        flushed (`run_end` for the arguments). A failure warns once.

        Args:
          how, error, step, findings, context, unreturned: see `run_end`.
          wait: at most this many seconds to wait for the probe's host lock (None: as long as
            it takes); the process hooks (`sys.excepthook`, `atexit`) pass a bound, so a
            flush stuck on a dead file system never holds up the interpreter's exit.

        Example:
          >>> probe.end_run("close")  # a clean end; `close()` does this itself
        """
        ended = run_end(how, error, step, findings, context, unreturned)
        if not self._lock.acquire(timeout=-1 if wait is None else wait):
            return
        try:
            if self._core is None or self._disabled_reason:
                return
            self._tell_recorders("ended", ended)
        finally:
            self._lock.release()
        self.flush()

    def _tell_recorders(self, hook, argument):
        """Calls `Recorder.<hook>(argument)` of every family (`begun`, `ended`, `before_flush`,
        `delivered`); a recorder that fails warns once and the others still hear it."""
        for recorder in list(self._recorders.values()):
            try:
                getattr(recorder, hook)(argument)
            except Exception as error:  # noqa: BLE001 - never break the training
                self.warn_failed(recorder.name, error)

    def _init_lifecycle(self):
        self._host_origin = None  # the step the host's count starts from (`set_step`)
        self._host_returned = 0  # steps of the step function's calls that returned since
        self._host_in_call = False

    def _set_host_origin(self, step):
        self._host_origin, self._host_returned, self._host_in_call = step, 0, False

    def mark_call(self, returned=None):
        """Host side, for what calls the step function itself (the callback's train function):
        before a call (`returned=None`), and after it returned `returned` steps. The host's
        view of where training is (`host_steps`) counts these calls from the step `set_step`
        set: no step number is kept here, and nothing is read from the device. The first call
        that returns asks for a flush at once (`flush_soon`): the status family's heartbeat
        then records that a step completed, for a process killed in its first seconds."""
        if returned is None:
            self._host_in_call = True
        else:
            first = not self._host_returned
            self._host_returned += int(returned)
            self._host_in_call = False
            if first:  # a heartbeat now says a step ran (the status family's first beats)
                self.flush_soon()

    def next_host_step(self):
        """The step the next call of the step function runs first, as the host counts the
        calls (`mark_call`), or None for a probe whose owner does not mark them."""
        origin = self._host_origin
        return None if origin is None else origin + self._host_returned

    @property
    def host_steps(self):
        """`(step being run or next to run, last step completed)` as the host counts the step
        function's calls (`mark_call`), `(None, None)` for a probe whose owner does not mark
        them (custom loops)."""
        origin = self._host_origin
        if origin is None:
            return (None, None)
        current = origin + self._host_returned
        completed = current - 1 if self._host_returned else None
        return (current if self._host_in_call else completed, completed)

    def recorded_step(self):
        """The step training is at: the later of the step axis's current step (`write.steps`:
        the latest record's; the start - 1 before any) and the step the host entered
        (`host_steps`: a step whose call has not returned, so none of its records may have
        arrived: a crash or a hang in it is at that step). None before the probe is built.
        Safe from another thread."""
        known = [s for s in (self._axis.current(), self.host_steps[0]) if s is not None]
        return max(known) if known else None
