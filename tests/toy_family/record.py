"""The toy family write side: one int32 count per replica, written at every logged step.

Under Keras `fit` its `Recorder.fit_step` counts each replica's batch, with no line of
`ReplicaCallback` about it.

A family's whole write side: a `Recorder` whose `observe` is called in replica context; the probe
(`probe.recorder("toy")`) creates it from the registry. Its cross-replica part puts each replica's
count in the step's transfer (`probe.transfer()`: one vector per replica and step, whatever the
families) and registers what the host does with them once delivered, at the step of the step
axis (`probe.step_of`).
"""

import functools

import tensorflow as tf

from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from toy_family import schema

_COUNT = ("toy", "count")


class Recorder(RecorderBase):
    """Counts observed per replica, written every `update_freq` steps."""

    name = "toy"

    def observe(self, count):
        """Records this replica's `count` (an int scalar) at the next step (replica context)."""
        probe = self.probe
        if not probe.build():
            return
        try:
            tf.distribute.get_replica_context().merge_call(self._merge, args=(count,))
        except Exception as error:  # noqa: BLE001 - never break the training it watches
            probe.warn_failed(self.name, error)

    def fit_step(self, fit):
        """Under Keras `fit`: each replica counts the examples of its batch (`x`'s first dim)
        before the model's step; the same `observe` as a custom loop's."""

        def before(batch):
            self.observe(tf.shape(tf.nest.flatten(batch["x"])[0])[0])

        return before, None

    def _merge(self, strategy, count):
        probe = self.probe
        transfer = probe.transfer()
        for packet, value in zip(
            transfer.packets, probe.local_values(strategy, count), strict=True
        ):
            with tf.device(packet.device):  # the reshape on the replica's device: no copy
                packet.ints(_COUNT, tf.reshape(value, [1]))
        transfer.on_host(self.name, functools.partial(self._deliver))
        probe.ship(transfer)

    def _deliver(self, delivery):
        probe = self.probe
        counts = tf.cast(delivery.value(_COUNT)[:, 0], tf.int32)
        step = probe.step_of(delivery, self.name)
        probe.write(
            tf.logical_and(probe.logged(step), probe.recording()),
            schema.TAG_TOY_COUNTS,
            lambda: counts,
            step,
            schema.KIND_TOY_COUNTS,
        )
