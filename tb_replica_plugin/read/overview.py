"""What a run is, across families: its replicas, devices, source and step span.

Used by `/runs`, `/overview` (`worst_first`) and by the report header. Each family's present
module may give `identity(run_data)` (`{"replicas", "devices", "source", "steps"}` or None) and
`recorded_steps(run_data)` (arrays of steps). No TensorFlow.
"""

import numpy as np

from tb_replica_plugin import registry


def overview(run_data):
    """The replicas, devices, source and step axis of a run, from its families' identities.

    The first family (registry order) giving an identity with steps gives the step axis (the
    first identity if none has steps); replicas and devices come from the first identity with
    any replica (inputs, else variables, else watch); the source is the first one that is not
    empty.

    Args:
      run_data: a `reader.RunData`.

    Returns:
      `{"replicas": list, "devices": list, "source": str, "steps": int array}`.
    """
    identities = []
    for family in registry.families():
        identity = family.present.identity
        found = identity(run_data) if identity is not None else None
        if found is not None:
            identities.append(found)
    if not identities:
        return {"replicas": [], "devices": [], "source": "", "steps": np.zeros(0, np.int64)}
    # The step axis of the first family that recorded steps (a run may only watch values).
    first = next((i for i in identities if len(i["steps"])), identities[0])
    with_replicas = next((i for i in identities if i["replicas"]), first)
    return {
        "replicas": with_replicas["replicas"],
        "devices": with_replicas["devices"],
        "source": next((i["source"] for i in identities if i["source"]), first["source"]),
        "steps": first["steps"],
    }


def _all_steps(run_data):
    """The recorded steps of every family of a run (for its first and last step)."""
    parts = [np.zeros(0, np.int64)]
    for family in registry.families():
        recorded = family.present.recorded_steps
        if recorded is not None:
            parts += [np.asarray(p, np.int64) for p in recorded(run_data)]
    return np.concatenate(parts)


def first_step(run_data):
    """The first step any family recorded (None without any)."""
    steps = _all_steps(run_data)
    return int(steps.min()) if steps.size else None


def last_step(run_data):
    """The last step any family recorded (None without any)."""
    steps = _all_steps(run_data)
    return int(steps.max()) if steps.size else None


def worst_first(entries):
    """`/runs` entries ordered for the runs overview: most errors first, then warnings, infos.

    Args:
      entries: `/runs` entries (dicts with "run" and "findings": `{"error", "warning", "info"}`).

    Returns:
      A new list: by descending error, warning and info counts, then by run name.

    Example:
      >>> [e["run"] for e in worst_first([
      ...     {"run": "a", "findings": {"error": 0, "warning": 1, "info": 0}},
      ...     {"run": "b", "findings": {"error": 1, "warning": 0, "info": 0}}])]
      ['b', 'a']
    """

    def key(entry):
        counts = entry.get("findings") or {}
        return (
            -counts.get("error", 0),
            -counts.get("warning", 0),
            -counts.get("info", 0),
            entry["run"],
        )

    return sorted(entries, key=key)
