"""The probe's summary writes: each one `tf.cond` on its condition joined with the recording gate.

`SummaryWrites` is the part of `ProbeCore` that queues summaries in the run's writer, in a
training step's graph or eagerly.
"""

import weakref

import tensorflow as tf

from tb_replica_plugin import metadata


class SummaryWrites:
    """`ProbeCore`'s summary writes (a mixin: it uses the probe's `recording`, `_decision`,
    `when` and `_writer`, and keeps `_gated`, `{id: weakref}` of the tensors `gated` returned,
    which the probe creates)."""

    def gated(self, condition):
        """`condition` and the recording gate (a bool tensor, or False): what a write's one
        `tf.cond` runs on. The gate is read once per step (`recording`) and joined with a
        condition once per step (a shared decision, such as `logged`, is joined once for every
        family); `recording()` itself, or a value this returned, is taken as it is.

        Args:
          condition: a bool scalar tensor, or a Python bool.

        Returns:
          A bool scalar tensor, or False when `condition` is False.
        """
        if isinstance(condition, bool):
            return self.recording() if condition else False
        recording = self.recording()
        if condition is recording or self._is_gated(condition):
            return condition
        joined = self._decision(
            "gated", condition, lambda: tf.logical_and(condition, recording, name="gated")
        )
        key = id(joined)
        self._gated[key] = weakref.ref(joined, lambda _, key=key: self._gated.pop(key, None))
        return joined

    def _is_gated(self, condition):
        ref = self._gated.get(id(condition))
        return ref is not None and ref() is condition

    def write(self, condition, tag, value_fn, step, kind):
        """Queues one summary in the writer when `condition` holds and recording is on
        (in-graph or eagerly). See `write_all`."""
        self.write_all(condition, [(tag, value_fn, kind)], step)

    def write_all(self, condition, writes, step, gate=True):
        """Queues summaries in the writer when `condition` holds and recording is on (in-graph
        or eagerly): one `tf.cond` for all of them, on `gated(condition)`.

        `tf.summary.write` inside `writer.as_default()` would add a flush op to the step's graph
        on exit, and so an I/O error (full disk, removed directory) would fail the training step.
        The raw `WriteSummary` op only queues the event; host-side flushes write the file. The
        values are computed in the taken branch only, in the order given. In the step's graph
        the writes of one condition share one cond with other writes and bodies of that
        condition (`when`).

        Args:
          condition: a bool scalar tensor, or a Python bool.
          writes: `[(tag, value_fn, kind)]`: the summary's tag, a function of no arguments
            returning its value, its kind (`metadata.create_summary_metadata`).
          step: the step the summaries are at (an integer or int tensor).
          gate: False where the caller runs under `gated(...)` already (a body given to
            `when` with such a condition): then `condition` alone decides.
        """
        predicate = self.gated(condition) if gate else condition
        if predicate is False or not writes:
            return
        resource = self._writer._resource  # noqa: SLF001 - the writer's resource handle
        serialized = [
            (tag, value_fn, metadata.create_summary_metadata(kind).SerializeToString())
            for tag, value_fn, kind in writes
        ]

        def write():
            with tf.device("/cpu:0"):
                at = tf.cast(step, tf.int64)
                for tag, value_fn, summary_metadata in serialized:
                    tf.raw_ops.WriteSummary(
                        writer=resource,
                        step=at,
                        tensor=tf.convert_to_tensor(value_fn()),
                        tag=tag,
                        summary_metadata=summary_metadata,
                    )

        self.when(predicate, write)

    def write_now(self, tag, value_fn, step, kind):
        """Host side: queues one summary now (outside any graph)."""
        with tf.init_scope():
            self.write(True, tag, value_fn, step, kind)
