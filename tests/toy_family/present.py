"""The toy family's route body and report blocks."""

from tb_replica_plugin.core import args

ARGS = {"max_points": args.parse_max_points}


def body(run, run_data, parsed):
    """`{"run", "replicas", "steps", "counts"}` (empty lists when the run has no toy data)."""
    series = run_data.toy
    if series is None:
        return {"run": run, "replicas": [], "steps": [], "counts": []}
    return {
        "run": run,
        "replicas": series.replicas,
        "steps": series.steps.tolist(),
        "counts": series.counts.tolist(),
    }


def report_json(run_data, thresholds):
    series = run_data.toy
    return {"toy": None if series is None else series.counts.tolist()}


def report_text(run_data, thresholds):
    series = run_data.toy
    if series is None:
        return []
    return [f"  toy counts: {series.counts.tolist()}"]
