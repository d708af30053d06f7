"""ReplicaProbe: per-replica collection for `strategy.run` loops, written as TensorBoard summaries.

`ReplicaProbe` is the probe's core (`write.probe.ProbeCore`: writer, recording gate, step decision,
warn-once, dispatch) plus the `observe_*` methods of every family in the registry (each family's
`record.Recording` mixin). `ReplicaCallback` uses a probe for Keras `fit`; custom loops use it
directly.
"""

from tb_replica_plugin.core.distribute import worker_info  # noqa: F401 - public helper
from tb_replica_plugin.families.gradients.capture import (
    DEFAULT_CAPTURE_BYTES,
    DEFAULT_CAPTURE_LIMIT,
    check_capture,
)
from tb_replica_plugin.families.status.record import DEFAULT_STALL_SECS, check_stall_secs
from tb_replica_plugin.families.variables.rotation import (  # noqa: F401 - ReplicaCallback's
    DEFAULT_BUDGET,
    check_budget,
)
from tb_replica_plugin.write import halt
from tb_replica_plugin.write.halt import ReplicaFaultError  # noqa: F401 - public exception
from tb_replica_plugin.write.probe import (  # noqa: F401 - public constants
    DEFAULT_EXAMPLES_EVERY,
    DEFAULT_FLUSH_SECS,
    SOURCES,
    ProbeCore,
    check_examples_every,
    check_flush_secs,
    check_update_freq,
    recording_mixins,
)


class ReplicaProbe(*recording_mixins(), ProbeCore):
    """Records, per replica and step, what each replica of a `tf.distribute` strategy was fed.

    Use it in a custom training loop, inside the function given to `strategy.run` (replica
    context) or on the per-replica values after it (cross-replica context). Works eagerly and
    inside `tf.function`. Summaries go to `log_dir` (one TensorBoard run).

    Failures never reach the training step: an exception while tracing the collectors, a log dir
    that cannot be created, removed while training or on a full disk each warn once
    (`RuntimeWarning`) and stop recording; training goes on.

    Args:
      log_dir: directory of the run to write, e.g. `"logs/replicas"`.
      strategy: the `tf.distribute.Strategy`; defaults to the current one
        (`tf.distribute.get_strategy()`).
      update_freq: write the dense batch-size series every this many steps (int >= 1), or only
        from the host (`write_window`, `flush`, `close`) with None. Shape and
        dtype changes, and so every odd batch, are written at the step they happen whatever
        this is, and the dense series keeps per-window minima and maxima.
      source: what drives the probe, stored with the data: "custom_loop" (default), "fit" or
        "inspect_dataset".
      flush_secs: seconds between background flushes of the event file (default 5): a process
        killed without running Python (SIGKILL) loses at most the data recorded in this
        interval. `flush` and `close` write everything at once.
      per_worker_run: under a multi-worker strategy (`MultiWorkerMirroredStrategy` with 2 or
        more workers), write to `log_dir/<task_type>_<task_index>` (e.g. `worker_1`) so every
        worker has its own run; the tab and the report show the runs of one job as one job
        (see `run_dir`). With False every worker writes `log_dir` itself: give each worker its
        own `log_dir` then.
      examples_every: the examples family fingerprints and compares the examples every this
        many steps and at every logged step (default 16; 1: every step).
      halt_on: which findings `faults()` returns: "error" (default when None: every finding of
        severity error) or a list of finding kinds. Given explicitly in a multi-worker job, the
        gradients family also all-reduces one fault flag per replica per step so that every
        worker sees a fault at the same step (and so stops at the same step).
      capture_limit, capture_bytes: culprit capture of `observe_gradients(..., batch=...)`, as
        for `ReplicaCallback` (default 3 steps, 4 MB per replica batch).
      heartbeat: write a heartbeat at every background flush (every `flush_secs`, and a few more
        in a stretch's first seconds: the last step recorded, whether the training thread is
        inside a step, when it last made progress; 192 bytes on disk each), so a hang or a
        killed process shows in the tab and the report (default True). How the run ends
        (`close`, the `with` block, an uncaught exception, interpreter exit) is recorded either
        way. See docs/status.md.
      stall_secs: after this many seconds without progress the heartbeat also writes every
        thread's Python stack, once per stall (default 60; `SIGUSR1` asks for them at once);
        recorded in the start event, the reader calls the run `stalled` after the same time
        unless told another (`Thresholds.stall_seconds`).

    Raises:
      ValueError: if `update_freq`, `source`, `flush_secs`, `examples_every`, `halt_on`,
        `capture_limit`, `capture_bytes` or `stall_secs` is invalid (raised at construction,
        never during training).

    Example:
      ```python
      probe = tb_replica_plugin.ReplicaProbe("logs/replicas", strategy)

      @tf.function
      def train_step(batch):
          def step_fn(x, y):
              probe.observe_inputs({"x": x, "y": y})  # replica context
              ...
          strategy.run(step_fn, args=batch)

      for batch in dist_dataset:
          train_step(batch)
      probe.close()  # writes the last window and flushes
      ```

    Methods:
      observe_inputs, observe_gradients, observe_rng, observe_examples, observe_variables: one
      per stat family (see each); watch: any tensor per replica (dense, ragged or sparse leaves,
      e.g. what `strategy.run` returns); step: one training step as one transfer per replica,
      timed (each replica's ready time); set_step, next_step, flush, write_window, close: the
      step axis and the event file; faults, raise_faults: fail fast on a replica fault.
    """

    def __init__(
        self,
        log_dir,
        *args,
        halt_on=None,
        capture_limit=DEFAULT_CAPTURE_LIMIT,
        capture_bytes=DEFAULT_CAPTURE_BYTES,
        heartbeat=True,
        stall_secs=DEFAULT_STALL_SECS,
        **kwargs,
    ):
        check_capture(capture_limit, capture_bytes)
        check_stall_secs(stall_secs)
        watch = halt.Watch(self, "error" if halt_on is None else halt_on)
        super().__init__(log_dir, *args, **kwargs)
        self._watch = watch
        self._sync_requested = halt_on is not None and watch.watches_every_step
        # `halt_on`'s fault check reads the host at every step: no plain variant
        # (`write.variants`).
        self.every_step_full = halt_on is not None
        gradients = self._recorders.get("gradients")
        if gradients is not None:
            gradients.capture_limit = capture_limit
            gradients.capture_bytes = capture_bytes
        status = self._recorders.get("status")
        if status is not None:
            status.heartbeat = bool(heartbeat)
            status.stall_secs = float(stall_secs)
        self._stopped_by = []  # findings `faults` returned: the run was halted

    def build(self):
        built = super().build()
        gradients = self._recorders.get("gradients")
        if built and gradients is not None and self.worker is not None:
            # A job: every worker must learn of a fault at the step it happens.
            gradients.sync_faults = self._sync_requested
        return built

    @property
    def watches_checks(self):
        """Whether `halt_on` names kinds seen at checks (beyond the every-step NaN/Inf)."""
        return self._watch.watches_checks

    def faults(self, check=False):
        """The findings that should stop training now (host side; empty list when none).

        Call it after each step of a custom loop. Without `check` it reads only the small fault
        state the gradients family updates at a step whose gradients or loss are not finite
        (no extra work in the step); a `nonfinite_gradients` finding comes back after the step
        it happened in. With `check=True` (at a logged step, every few hundred steps, ...) it
        also flushes the event file and runs every rule on the run, so check-time findings
        (`variable_drift`, `identical_rng_streams`, `duplicate_examples`, ...) come back too.
        Each finding is returned once.

        Args:
          check: also run the check-time rules (reads the run back; costs milliseconds).

        Returns:
          A list of `analysis.Finding` matching `halt_on`.

        Example:
          ```python
          for step, batch in enumerate(dist_dataset):
              train_step(batch)
              found = probe.faults(check=step % 100 == 0)
              if found:
                  print(found[0].message)
                  break
          probe.close()
          ```
        """
        if self._core is None:
            return []
        found = self._watch.check(at_check=check)
        self._stopped_by.extend(found)
        return found

    def close(self):
        """Ends the run ("halted" if `faults` returned findings), flushes and closes the writer.
        The probe records nothing afterwards."""
        if self._stopped_by:
            self.end_run("close", findings=self._stopped_by)
        super().close()

    def raise_faults(self, check=False):
        """Raises `ReplicaFaultError` when `faults(check)` finds something (after a flush).

        Raises:
          ReplicaFaultError: holding the findings (`error.findings`).
        """
        found = self.faults(check=check)
        if found:
            raise ReplicaFaultError(found)


def _not_converted(cls):
    """Marks every method of `cls` (and its bases) not to be converted by AutoGraph.

    The probe is called from inside users' `tf.function`s; AutoGraph would otherwise rewrite its
    Python (host-side decisions, try/except, warnings) into graph control flow at every trace.
    """
    import tensorflow as tf

    # Resolved as attribute lookup does (the most derived class wins), before any is replaced:
    # a method a class overrides (e.g. `build`) keeps its override.
    members = {}
    for klass in reversed(cls.__mro__[:-1]):
        members.update(vars(klass))
    for name, member in members.items():
        if callable(member) and not name.startswith("__") and not isinstance(member, type):
            setattr(cls, name, tf.autograph.experimental.do_not_convert(member))
    return cls


_not_converted(ReplicaProbe)
