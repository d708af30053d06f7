"""Gradients family: the device fault record of plain steps (`write.variants`).

At a plain step no value leaves a replica's device, yet a NaN/Inf in its gradients or loss is
still reported with its replica and step. Each replica checks its own values on its device:

    l2_loss per variable (as the full step) → AddN (with the loss) → IsFinite
    ResourceCountUpTo(its step counter)     → If(finite, nothing, record)

four kernels per replica besides the `l2_loss`es. The `If` is built on the replica's device, so
it takes the replica's tensors where they are. Its branch runs only where the sum is not finite:
it counts the NaN/Inf values exactly (a finite sum of squares means no gradient value is NaN or
Inf; an overflowing one is not a fault), leaves out an empty batch's NaN loss with finite
gradients (the inputs family's `empty_shard` is its cause), and updates the replica's record, a
small int64 variable on its device: the number of faulty plain steps, the first and the last,
and the NaN/Inf counts of each. Each replica's step counter is set with the step axis
(`Recorder.step_set`) and advances at every step (the full step's scope adds 1 on the device).

The host reads the records (one small read per replica) at each background flush (the status
family's heartbeat), each window write (epoch ends) and the end of the run, and writes what is
new: `gradients/nonfinite` events at the first and the last faulty plain step of each replica
(steps between two reads other than these two are counted, not listed), and
`gradients/plain_faults` (counts, first and last per replica).
"""

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tb_replica_plugin.core.recorder import cond_value, host_variable, run_if
from tb_replica_plugin.families.gradients import capture as capture_lib
from tb_replica_plugin.families.gradients import replica, schema

# Slots of a replica's record (int64 [RECORD_SIZE]).
COUNT, FIRST, LAST = 0, 1, 2
FIRST_COUNTS = slice(3, 7)  # NaN/Inf counts (`schema.NONFINITE_ROWS`) at the first faulty step
LAST_COUNTS = slice(7, 11)  # ... and at the last
CAPTURED_AT, CAPTURES = 11, 12  # the step of the batch kept on the device (-1: none), how many
RECORD_SIZE = 13
_EMPTY = np.array([0, -1, -1] + [0] * 8 + [-1, 0], np.int64)
_NO_LIMIT = np.iinfo(np.int64).max


class _Fault(NamedTuple):
    """What one replica's fault branch takes (see `DeviceFaults.record`)."""

    index: int
    device: str
    values: replica.ReplicaGradients
    has_loss: bool
    leaves: list
    step: tf.Tensor


class DeviceFaults:
    """Every local replica's step counter and fault record, and the host's view of them.

    Args:
      recorder: the gradients family's `Recorder` (its probe writes).
    """

    def __init__(self, recorder):
        self._recorder = recorder
        self.counters = []  # int64 scalar per replica: the step its next step runs
        self.records = []  # int64 [RECORD_SIZE] per replica
        self.captures = []  # string vector per replica (CPU devices only), or None
        self._seen = []  # the records as last written
        self._steps = {}  # graph id -> each replica's step tensor in that step (one per step)

    def create(self, devices, start):
        """Creates the variables on the replicas' devices (host side, outside any graph).

        A replica on a CPU device also keeps the culprit batch of a plain step there (a string
        variable: string tensors do not live on accelerators, where only full steps capture).
        """
        with tf.init_scope():
            for index, device in enumerate(devices):
                with tf.device(device):
                    on_cpu = tf.DeviceSpec.from_string(device).device_type == "CPU"
                    self.captures.append(
                        host_variable(
                            tf.constant([""]),
                            shape=tf.TensorShape(None),
                            name=f"probe_fault_batch_{index}",
                        )
                        if on_cpu
                        else None
                    )
                    self.counters.append(
                        host_variable(
                            tf.constant(int(start), tf.int64), name=f"probe_fault_step_{index}"
                        )
                    )
                    self.records.append(
                        host_variable(tf.constant(_EMPTY), name=f"probe_fault_record_{index}")
                    )
        self._seen = [_EMPTY.copy() for _ in devices]

    def set_step(self, step):
        """Host side: the next step of every replica is `step`."""
        with tf.init_scope():
            for counter in self.counters:
                counter.assign(int(step))

    # ------------------------------------------------------------------ in the step

    def advance(self, devices):
        """The full step: each replica's counter advances by one (once per step)."""
        if self._first_in_step():
            for device, counter in zip(devices, self.counters, strict=True):
                with tf.device(device):
                    counter.assign_add(1, read_value=False)

    def record(self, devices, per_replica, has_loss, batches, capture):
        """The plain step: each replica checks its values and records a fault on its device.

        Args:
          devices: the local replicas' devices.
          per_replica: each replica's `replica.ReplicaGradients` (on its device).
          has_loss: whether a loss was given.
          batches: each replica's batch leaves (the first one's size tells an empty batch),
            or None.
          capture: `(replicas, names, capture_limit, capture_bytes)` to keep the culprit batch
            (`capture.capture_blocks`; `batches` are then its leaves), or None.
        """
        steps = self._step_tensors(devices)
        for index, values in enumerate(per_replica):
            leaves = None if batches is None else batches[index]
            with tf.device(devices[index]):
                total = tf.add_n([*values.sq, *([values.loss] if has_loss else [])])
                fault = _Fault(index, devices[index], values, has_loss, leaves, steps[index])

                def branch(fault=fault):
                    self._record_fault(fault, capture)

                cond_value(tf.math.is_finite(total), lambda: None, branch, as_function=True)

    def _first_in_step(self):
        """Whether this is the step's first call (the counters advance once per step; eagerly,
        each call is taken as its own step)."""
        if tf.executing_eagerly():
            return True
        key = id(tf.compat.v1.get_default_graph())
        if key in self._steps:
            return False
        if len(self._steps) > 64:
            self._steps.clear()
        self._steps[key] = None
        return True

    def _step_tensors(self, devices):
        """Each replica's step at this step: `ResourceCountUpTo` reads and advances its counter
        in one kernel; a second call in the same step reuses the first's."""
        key = None if tf.executing_eagerly() else id(tf.compat.v1.get_default_graph())
        found = self._steps.get(key) if key is not None else None
        if found is None:
            found = []
            for device, counter in zip(devices, self.counters, strict=True):
                with tf.device(device):
                    found.append(
                        tf.raw_ops.ResourceCountUpTo(
                            resource=counter.handle, limit=_NO_LIMIT, T=tf.int64
                        )
                    )
            if key is not None:
                if len(self._steps) > 64:
                    self._steps.clear()
                self._steps[key] = found
        return found

    def _record_fault(self, fault, capture):
        """The branch: exact counts; a fault unless only an empty batch's loss is NaN/Inf; the
        batch kept at the first step of a run of faulty steps (while under the limit)."""
        counts = replica.nonfinite_counts(fault.values.values, fault.values.loss, fault.has_loss)
        grads_bad = counts[schema.GRAD_NAN] + counts[schema.GRAD_INF] > 0
        loss_bad = counts[schema.LOSS_NAN] + counts[schema.LOSS_INF] > 0
        if fault.leaves:
            size = tf.shape(fault.leaves[0], out_type=tf.int64)[0]
            loss_bad = tf.logical_and(loss_bad, size > 0)
        record, step = self.records[fault.index], fault.step
        kept = self.captures[fault.index] if capture is not None and fault.leaves else None

        def update():
            before = record.read_value()
            fresh = before[FIRST] < 0
            now = tf.cast(counts, tf.int64)
            take = tf.constant(False)
            if kept is not None:
                replicas, names, limit, budget = capture
                take = tf.logical_and(
                    tf.not_equal(before[LAST], step - 1), before[CAPTURES] < limit
                )

                def keep():
                    blocks = capture_lib.capture_blocks(
                        [replicas[fault.index]], names, [fault.leaves], budget, [fault.device]
                    )
                    kept.assign(tf.reshape(blocks, [-1]))

                run_if(take, keep)
            captured = tf.cast(take, tf.int64)
            head = [
                before[COUNT] + 1,
                tf.where(fresh, step, before[FIRST]),
                step,
            ]
            tail = [tf.where(take, step, before[CAPTURED_AT]), before[CAPTURES] + captured]
            record.assign(
                tf.concat(
                    [
                        tf.stack(head),
                        tf.where(fresh, now, before[FIRST_COUNTS]),
                        now,
                        tf.stack(tail),
                    ],
                    axis=0,
                )
            )

        run_if(tf.logical_or(grads_bad, loss_bad), update)

    # ------------------------------------------------------------------ host side

    def write_new(self, probe):
        """Host side: writes the faults recorded since the last call (see the module
        docstring). Safe from the flush thread; the caller holds the probe's host lock."""
        if not self.records or probe.disabled_reason:
            return
        with tf.init_scope():
            now = [record.numpy() for record in self.records]
        if all(a[COUNT] == b[COUNT] for a, b in zip(now, self._seen, strict=True)):
            return
        events = {}  # step -> int32 [4, R]
        for index, (record, seen) in enumerate(zip(now, self._seen, strict=True)):
            if record[COUNT] == seen[COUNT]:
                continue
            if seen[FIRST] < 0:
                self._event(events, record[FIRST], index, record[FIRST_COUNTS], len(now))
            self._event(events, record[LAST], index, record[LAST_COUNTS], len(now))
        self._write_batches(probe, now)
        for step in sorted(events):
            counts = events[step]
            probe.write_now(
                schema.TAG_GRAD_NONFINITE,
                lambda counts=counts: tf.constant(counts),
                int(step),
                schema.KIND_GRAD_NONFINITE,
            )
        table = np.stack([r[[COUNT, FIRST, LAST]] for r in now], axis=1)  # [3, R]
        probe.write_now(
            schema.TAG_GRAD_PLAIN_FAULTS,
            lambda: tf.constant(table),
            int(max(r[LAST] for r in now)),
            schema.KIND_GRAD_PLAIN_FAULTS,
        )
        self._seen = [record.copy() for record in now]

    def _write_batches(self, probe, now):
        """The culprit batches kept on the devices since the last read, as `gradients/batch`
        events (one per step, the blocks of its replicas)."""
        blocks = {}
        for index, (record, seen) in enumerate(zip(now, self._seen, strict=True)):
            if record[CAPTURED_AT] < 0 or record[CAPTURED_AT] == seen[CAPTURED_AT]:
                continue
            with tf.init_scope():
                value = self.captures[index].numpy()
            blocks.setdefault(int(record[CAPTURED_AT]), []).append(value)
        for step, parts in sorted(blocks.items()):
            value = np.concatenate(parts)
            probe.write_now(
                schema.TAG_GRAD_BATCH,
                lambda value=value: tf.constant(value),
                step,
                schema.KIND_GRAD_BATCH,
            )

    @staticmethod
    def _event(events, step, index, counts, replicas):
        row = events.setdefault(int(step), np.zeros([4, replicas], np.int32))
        row[:, index] = counts
