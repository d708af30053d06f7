"""The probe's one step axis: the step every family records at, kept in one host variable.

The variable holds the *current* step (the step of the latest record); beside it, slot k of a
second one is the last step caller k recorded at outside a step scope (a caller: a family, or one
watched name), what the rule below needs. What one step means:

- A step scope (`ReplicaProbe.step()`, the train step `ReplicaCallback` instruments) is one step:
  it records at the current step + 1, and every `observe_*` call inside it without `step=`
  records there too.
- A call outside a scope without `step=` records at the current step, unless its caller already
  recorded there: then that step is complete and it records at the next one. So one call of each
  family per step records the same step numbers, and a family called after the others (the
  variables' check after the step, eagerly) records at the step it follows.
- A call with `step=` records there and leaves the axis as it is.

`set_step(n)` makes the next scope, and the next call of every caller, record at n. The status
family's heartbeat reads the current step from the host (`current`), and `ReplicaCallback`
starts each `fit` from it (or from the optimizer's iterations when they are ahead).
"""

import numpy as np
import tensorflow as tf

from tb_replica_plugin.core.recorder import host_variable

# Callers (families, watched names) that count their own calls outside a step scope.
MAX_CALLERS = 128


class StepAxis:
    """The step axis of one probe (see the module docstring).

    Attributes:
      variable: the int64 scalar host variable of the current step once created, else None.
      callers: the int64 [MAX_CALLERS] host variable of each caller's last step outside a scope.
    """

    def __init__(self):
        self.variable = None
        self.callers = None
        self._slots = {}
        self._start = 0

    def create(self, start):
        """Creates the variables (host side, once), the next record at `start`."""
        self._start = int(start)
        with tf.init_scope(), tf.device("/cpu:0"):
            self.variable = host_variable(tf.constant(self._start - 1, tf.int64), name="probe_step")
            self.callers = host_variable(
                tf.constant(np.full([MAX_CALLERS], self._start - 1, np.int64)),
                name="probe_step_callers",
            )

    def slot(self, caller):
        """The slot of `caller` (a name), assigned at its first use.

        Raises:
          ValueError: past `MAX_CALLERS` callers.
        """
        if caller not in self._slots:
            if len(self._slots) >= MAX_CALLERS:
                raise ValueError(f"more than {MAX_CALLERS} callers count their own steps")
            self._slots[caller] = len(self._slots)
        return self._slots[caller]

    def scope_step(self):
        """In-graph: the step of a step scope (current + 1), made the current step (int64)."""
        # One read for every use (an assign's returned value is read again by each consumer).
        self.variable.assign_add(tf.constant(1, tf.int64), read_value=False)
        return self.variable.read_value()

    def caller_step(self, caller):
        """In-graph: the step a call of `caller` outside a scope records at (the rule above)."""
        slot = self.slot(caller)
        current = self.variable.read_value()
        last = self.callers.read_value()[slot]
        step = tf.where(last < current, current, current + 1)
        self.variable.assign(step)
        tf.raw_ops.ResourceScatterUpdate(resource=self.callers.handle, indices=slot, updates=step)
        return step

    def set(self, step):
        """Host side: the next scope and the next call of every caller record at `step`."""
        if self.variable is None:
            self._start = int(step)
            return
        self.variable.assign(int(step) - 1)
        self.callers.assign(np.full([MAX_CALLERS], int(step) - 1, np.int64))

    @property
    def start(self):
        """The step the first record is at when nothing was recorded (`create`'s, `set`'s)."""
        return self._start

    def current(self):
        """Host side: the current step (the latest record's; the start - 1 before any), or None
        before the variables exist. Safe from another thread."""
        if self.variable is None:
            return None
        with tf.init_scope():
            return int(self.variable.numpy())

    def next_for(self, caller):
        """Host side: the step the next call of `caller` outside a scope would record at."""
        if self.variable is None:
            return None
        with tf.init_scope():
            current = int(self.variable.numpy())
            last = int(self.callers.numpy()[self.slot(caller)])
        return current if last < current else current + 1
