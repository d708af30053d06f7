"""The toy family write side: one int32 count per replica, written at every logged step.

A family's whole write side: a `Recorder` (its state, created before any trace) whose `observe`
is called in replica context; the probe (`probe.recorder("toy")`) creates it from the registry.
"""

import tensorflow as tf

from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from toy_family import schema


class Recorder(RecorderBase):
    """Counts observed per replica, written every `update_freq` steps."""

    name = "toy"

    def create_state(self):
        self.variable("step", int(self._start_step), tf.int64)

    def observe(self, count):
        """Records this replica's `count` (an int scalar) at the next step (replica context)."""
        probe = self.probe
        if not probe.build():
            return
        try:
            tf.distribute.get_replica_context().merge_call(self._merge, args=(count,))
        except Exception as error:  # noqa: BLE001 - never break the training it watches
            probe.warn_failed(self.name, error)

    def _merge(self, strategy, count):
        probe = self.probe
        counts = tf.cast(tf.stack(probe.local_values(strategy, count)), tf.int32)
        step = self.state["step"].read_value()
        probe.write(
            tf.logical_and(probe.logged(step), probe.recording()),
            schema.TAG_TOY_COUNTS,
            lambda: counts,
            step,
            schema.KIND_TOY_COUNTS,
        )
        self.state["step"].assign_add(1)
