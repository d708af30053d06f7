"""ReplicaProbe: per-replica collection for `strategy.run` loops, written as TensorBoard summaries.

`ReplicaProbe` is the probe's core (`core.probe.ProbeCore`: writer, recording gate, step decision,
warn-once, dispatch) plus the `observe_*` methods of every family in the registry (each family's
`record.Recording` mixin). `ReplicaCallback` uses a probe for Keras `fit`; custom loops use it
directly.
"""

from tb_replica_plugin.core.distribute import worker_info  # noqa: F401 - public helper
from tb_replica_plugin.core.probe import (  # noqa: F401 - public constants
    DEFAULT_EXAMPLES_EVERY,
    DEFAULT_FLUSH_SECS,
    SOURCES,
    ProbeCore,
    check_examples_every,
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

    Raises:
      ValueError: if `update_freq`, `source`, `flush_secs` or `examples_every` is invalid
        (raised at construction, never during training).

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
      e.g. what `strategy.run` returns); set_step, flush, write_window, close: the step axis and
      the event file.
    """


def _not_converted(cls):
    """Marks every method of `cls` (and its bases) not to be converted by AutoGraph.

    The probe is called from inside users' `tf.function`s; AutoGraph would otherwise rewrite its
    Python (host-side decisions, try/except, warnings) into graph control flow at every trace.
    """
    import tensorflow as tf

    for klass in cls.__mro__[:-1]:
        for name, member in vars(klass).items():
            if callable(member) and not name.startswith("__") and not isinstance(member, type):
                setattr(cls, name, tf.autograph.experimental.do_not_convert(member))
    return cls


_not_converted(ReplicaProbe)
