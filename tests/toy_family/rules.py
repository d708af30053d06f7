"""The toy family's one rule: a replica counted 0 at some logged step."""

import numpy as np

from tb_replica_plugin.analysis import Finding, Thresholds

FINDING_KINDS = {
    "toy_zero": {
        "severity": "info",
        "thresholds": (),
        "summary": "A replica counted 0 at some logged step.",
    }
}


def find(run_data, thresholds=Thresholds()):
    """One `toy_zero` finding per replica that counted 0."""
    series = run_data.toy
    if series is None:
        return []
    findings = []
    for column in np.flatnonzero((series.counts == 0).any(axis=0)):
        steps = series.steps[series.counts[:, column] == 0]
        findings.append(
            Finding(
                kind="toy_zero",
                severity="info",
                run=series.run,
                first_step=int(steps[0]),
                last_step=int(steps[-1]),
                count=int(steps.size),
                replicas=[series.replicas[column]],
                name=None,
                value=0,
                threshold=None,
                message=f"Replica {series.replicas[column]} counted 0.",
                view="toy",
            )
        )
    return findings
