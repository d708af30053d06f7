"""The step in two variants: *full* at logged and sampled steps, *plain* at every other step.

A step that is neither logged nor sampled needs none of the families' values on the host: only
the promise "a NaN/Inf in a replica's gradients or loss is reported with its replica and step"
must hold at every step. So the step function is traced twice and chosen per call on the host:

- **full**: every family's values leave each replica's device as one vector (`write.shipping`),
  timed; used at each `fit`'s first `FIRST_FULL_STEPS` steps, at every step the probe logs
  (`update_freq`) or samples (`examples_every`, the last step of an epoch), and at every step
  under `halt_on` (its fault check reads the host);
- **plain**: the model's step, the step axis's `assign_add`, and the gradients family's device
  fault record (`families.gradients.device_faults`): each replica checks its own values on its
  device and keeps its faulty steps there; no value leaves a device. The host reads the records
  at each background flush (the heartbeat), each window write and the end of the run.

`Variants` is the part of `ProbeCore` that knows which variant is being traced (`plain_step`,
read by the families while tracing) and which steps need the full one (`full_needed`);
`StepFunctions` is the train function of both variants that `ReplicaCallback` hands to Keras
(`ReplicaProbe.function` the same for a custom loop).
"""

import contextlib

# The first steps of each stretch (each `fit`) are full: a short `fit` is recorded at every step,
# and a run's first batches (where a wrong split shows first) always are.
FIRST_FULL_STEPS = 16


class Variants:
    """`ProbeCore`'s variant decision (a mixin: it uses `update_freq`, `examples_every`)."""

    def _init_variants(self):
        self._plain = 0  # > 0 while a plain variant is called (and so traced)
        self._log_at_host = None  # the host's copy of `log_at` (`sample_last_of`)
        self.every_step_full = False  # `halt_on`: its check reads the host at every step

    @property
    def plain_step(self):
        """Whether the step being traced (or run eagerly) is the plain variant: families record
        nothing in it but the gradients family's device fault record."""
        return self._plain > 0

    @contextlib.contextmanager
    def plain_variant(self):
        """Host side: the step function called inside is the plain variant (its first call
        traces it as such)."""
        self._plain += 1
        try:
            yield
        finally:
            self._plain -= 1

    def full_needed(self, first, steps=1):
        """Host side: whether a call running steps `first` .. `first + steps - 1` needs the full
        variant: one of them is logged or sampled, it is among the first `FIRST_FULL_STEPS`
        since the step axis was set (each `fit`'s first steps), `halt_on` checks every step, or
        the step is unknown (None).

        Example:
          >>> probe.set_step(0)  # a fit's first 16 steps: full
          >>> [probe.full_needed(s) for s in (0, 15, 16, 17, 31, 32)]  # update_freq=None
          [True, True, True, False, False, True]
        """
        if first is None or self.every_step_full:
            return True
        if self._host_origin is not None and first - self._host_origin < FIRST_FULL_STEPS:
            return True
        for step in range(first, first + max(int(steps), 1)):
            if step % self.examples_every == 0 or step == self._log_at_host:
                return True
            if self.update_freq is not None and step % self.update_freq == 0:
                return True
        return False


class StepFunctions:
    """One step function in two variants, chosen per call (see the module docstring).

    Args:
      probe: the `ReplicaProbe`; it counts the calls (`mark_call`), so it knows the next step.
      full: the full variant (a `tf.function`, or any callable).
      plain: the plain variant, traced from the same Python function while
        `probe.plain_variant()` holds.
      steps_per_call: the steps one call runs (Keras `steps_per_execution`).
    """

    def __init__(self, probe, full, plain, steps_per_call=1):
        self.probe = probe
        self.full = full
        self.plain = plain
        self.steps_per_call = steps_per_call

    def __call__(self, *args, **kwargs):
        probe = self.probe
        if probe.full_needed(probe.next_host_step(), self.steps_per_call):
            return self.full(*args, **kwargs)
        with probe.plain_variant():
            return self.plain(*args, **kwargs)
