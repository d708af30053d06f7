"""Fail fast: the host-side decision to stop training on a replica fault (`halt_on`).

Two kinds of faults:

- every-step faults (`nonfinite_gradients`): the gradients family's in-graph NaN/Inf check already
  runs at every step and, only at a step with a fault, updates a small fault state on the host
  CPU, which its recorder gives as a `FaultState` (`core.recorder`: `Recorder.fault_state`, read
  through `ProbeCore.fault_state`). The host reads it after each step: no extra op in the step, no
  extra device-to-host copy of any tensor the step computes.
- check-time faults (`variable_drift`, `identical_rng_streams`, `duplicate_examples`, ...): the
  families write them at their checks (logged steps, epoch ends); at such a check the event file
  is flushed and read back, and the same rules as `tb-replica report` decide.

Either way the findings that stop training are the rules' own (`analysis.Finding`), so the message
printed is the one the report and the tab show.

In a multi-worker job every worker must stop at the same step, or the others wait forever in the
next step's all-reduce. With `sync_faults` the gradients family all-reduces one float per replica
per step (the count of replicas with a stopping fault), so every worker's fault state records the
same job-level fault at the same step (`FaultState.synced`, `FaultState.job`), and every worker
decides from that flag alone. This module names no family: it reads the fault state through the
probe.
"""

import os

EVERY_STEP_KINDS = frozenset({"nonfinite_gradients"})
HALT_ON_WORDS = ("error",)


class ReplicaFaultError(RuntimeError):
    """Raised by `ReplicaProbe.raise_faults` when a watched fault was found.

    Attributes:
      findings: the `analysis.Finding`s that stopped training.
    """

    def __init__(self, findings):
        self.findings = list(findings)
        super().__init__("\n".join(describe(f) for f in self.findings))


def resolve_halt_on(halt_on):
    """Checks `halt_on` and returns it normalised.

    Args:
      halt_on: None (record only), "error" (every finding of severity error), or an iterable of
        finding kinds (`read.judge.finding_kinds()`), whose error and warning findings stop.

    Returns:
      None, "error" or a frozenset of kinds.

    Raises:
      ValueError: on another word or an unknown kind (the message lists the known kinds).
    """
    if halt_on is None:
        return None
    if isinstance(halt_on, str):
        if halt_on in HALT_ON_WORDS:
            return halt_on
        raise ValueError(
            f"`halt_on` must be None, 'error' or a list of finding kinds. Received: {halt_on!r}"
        )
    from tb_replica_plugin.read import judge

    known = judge.finding_kinds()
    try:
        kinds = frozenset(str(kind) for kind in halt_on)
    except TypeError:
        raise ValueError(
            f"`halt_on` must be None, 'error' or a list of finding kinds. Received: {halt_on!r}"
        ) from None
    unknown = sorted(kinds - set(known))
    if unknown or not kinds:
        raise ValueError(
            f"`halt_on` names unknown finding kind(s) {unknown or '(none given)'}; known kinds: "
            f"{', '.join(known)}"
        )
    return kinds


def matches(finding, halt_on):
    """Whether `finding` stops training under the resolved `halt_on` (info never stops)."""
    if halt_on is None or finding.severity == "info":
        return False
    if halt_on == "error":
        return finding.severity == "error"
    return finding.kind in halt_on


def describe(finding):
    """One line: kind, replicas, step and the rule's message."""
    replicas = ", ".join(str(r) for r in finding.replicas) or "-"
    return (
        f"[{finding.severity}] {finding.kind} (replica {replicas}, step {finding.first_step}): "
        f"{finding.message}"
    )


class Watch:
    """Decides, host side, whether a probe's run holds a fault that stops training.

    Args:
      probe: the `ReplicaProbe`.
      halt_on: as `resolve_halt_on` accepts.
    """

    def __init__(self, probe, halt_on):
        self.probe = probe
        self.halt_on = resolve_halt_on(halt_on)
        self._seen_steps = 0
        self._reported = set()

    @property
    def watches_every_step(self):
        return self.halt_on == "error" or bool(self.halt_on and self.halt_on & EVERY_STEP_KINDS)

    @property
    def watches_checks(self):
        return self.halt_on == "error" or bool(self.halt_on and self.halt_on - EVERY_STEP_KINDS)

    def new_fault(self):
        """The fault state if a fault happened since the last call (host read), else None."""
        state = self.probe.fault_state()
        if state is None or state.steps <= self._seen_steps:
            return None
        self._seen_steps = state.steps
        return state

    def run_findings(self):
        """Flushes the probe and runs every rule on its run (this worker's run in a job)."""
        from tb_replica_plugin import group
        from tb_replica_plugin.read import judge

        self.probe.flush()
        run_dir = self.probe.run_dir
        if not run_dir or not os.path.isdir(run_dir):
            return []
        findings = []
        name = os.path.basename(os.path.normpath(run_dir))
        for run_data in group.read_log_dir(run_dir).values():
            for finding in judge.find_run(run_data):
                finding.run = name
                findings.append(finding)
        return findings

    def check(self, at_check=False):
        """The findings that stop training now (empty when none); each is returned once.

        Args:
          at_check: also run the check-time rules (the caller is at a logged step or an epoch
            end); otherwise only the every-step fault state is read.

        Returns:
          A list of `analysis.Finding`.
        """
        if self.halt_on is None:
            return []
        state = self.new_fault() if self.watches_every_step else None
        if state is None and not (at_check and self.watches_checks):
            return []
        sync = state is not None and state.synced
        job_fault = sync and state.job

        def stops(finding):
            if finding.kind not in EVERY_STEP_KINDS:
                return at_check  # each worker's own rules decide, at checks
            # One worker: the rules (a loss-scale overflow is info and does not stop). A job:
            # the all-reduced flag every worker got (0 at an expected loss-scale overflow).
            return job_fault or not sync

        stopping = [f for f in self.run_findings() if matches(f, self.halt_on) and stops(f)]
        if job_fault and not any(f.kind in EVERY_STEP_KINDS for f in stopping):
            stopping.insert(0, _remote_fault(self.probe, state.last))
        fresh = []
        for finding in stopping:
            key = (finding.kind, finding.first_step, tuple(finding.replicas), finding.name)
            if key not in self._reported:
                self._reported.add(key)
                fresh.append(finding)
        return fresh


def _remote_fault(probe, step):
    """The finding a worker reports when the fault was on another worker's replica."""
    from tb_replica_plugin import analysis

    run = os.path.basename(os.path.normpath(probe.run_dir or probe.log_dir))
    return analysis.Finding(
        kind="nonfinite_gradients",
        severity="error",
        run=run,
        first_step=step,
        last_step=step,
        count=1,
        replicas=[],
        name=None,
        value=None,
        threshold=0,
        message=(
            f"Another worker's replica had non-finite gradients or loss at step {step}; every "
            "worker stops at this step (that worker's run names the replica and holds its batch)."
        ),
        view="gradients",
    )
