"""Variables family under `ParameterServerStrategy`: which parameter server holds which variable.

Under this strategy each variable (or each shard of a partitioned one) has one copy, on one
parameter server; drift does not apply. The coordinator writes the placement (the family's
`variables/placement` event, with each variable's bytes and parameter server) once per new
variable set, with no per-step cost: at an `observe_variables` call on the coordinator, or in
a step given to `probe.schedule` (handed on when the step is traced, once). The strategy keeps no
list of its variables, and the variables a step reads are not tracked under it (neither
`GradientTape.watched_variables` nor the step's `FuncGraph.variables` sees them), so the user names
them, e.g. `model.variables + optimizer.variables` (the slots count on their ps too). The read
side (`ps_balance.py`) computes the bytes per parameter server and the `ps_imbalance` rule.
"""

import json
import re

import tensorflow as tf

from tb_replica_plugin.families.variables import schema

_TASK = re.compile(r"/job:ps/(?:replica:\d+/)?task:(\d+)")


class Placement:
    """The coordinator's state: the variables whose placement was written (ids, in order)."""

    def __init__(self):
        self.seen = {}  # id -> variable (kept alive, so ids are not reused)
        self.written = 0  # len(seen) at the last write


def shards(variables):
    """Each variable's shards (a partitioned `ShardedVariable` gives its parts), flattened."""
    out = []
    for variable in variables:
        parts = getattr(variable, "variables", None)
        if type(variable).__name__ == "ShardedVariable" and parts:
            out.extend(parts)
        else:
            out.append(variable)
    return out


def ps_devices(strategy):
    """The parameter servers' devices (`/job:ps/replica:0/task:i/device:CPU:0`), from the
    strategy's count of them ([] when it has none)."""
    count = getattr(strategy, "_num_ps", None) or getattr(strategy.extended, "_num_ps", 0)
    return [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(count)]


def ps_index(device):
    """The parameter server's task index of a device string, or None (not on a ps)."""
    match = _TASK.search(device or "")
    return None if match is None else int(match.group(1))


def describe(variable):
    """The placement entry of one variable (or shard): the drift fields of any strategy's
    placement (one copy, on no replica device) plus `bytes` and `ps`."""
    name = getattr(variable, "path", None) or variable.name
    name = name[:-2] if name.endswith(":0") else name
    shape = variable.shape
    dims = None if shape.rank is None else shape.as_list()
    elements = shape.num_elements()
    dtype = tf.as_dtype(variable.dtype)
    return {
        "name": name,
        "shape": dims,
        "dtype": dtype.name,
        "trainable": bool(getattr(variable, "trainable", True)),
        "sync": "none",
        "devices": [variable.device],
        "columns": [-1],
        "mirrored": False,
        "bytes": None if elements is None else int(elements) * dtype.size,
        "ps": ps_index(variable.device),
    }


def placement_json(variables, static, strategy):
    """The placement document of `variables` under this strategy (a JSON string).

    Args:
      variables: the variables (shards flattened, `shards`).
      static: the probe's static fields (devices of the workers, strategy, source).
      strategy: the `ParameterServerStrategy` (its parameter servers).
    """
    entries, seen = [], {}
    for variable in variables:
        entry = describe(variable)
        count = seen.get(entry["name"], 0) + 1
        seen[entry["name"]] = count
        if count > 1:
            entry["name"] = f"{entry['name']}#{count}"
        entries.append(entry)
    document = dict(static, central=True, parameter_servers=ps_devices(strategy))
    document["variables"] = entries
    return json.dumps(document, sort_keys=True)


def add(recorder, variables, step):
    """On the coordinator: adds `variables` to the placement and writes it when any is new.

    Args:
      recorder: the variables family's `Recorder` (its `pss_placement`, a `Placement`).
      variables: variables (or `ShardedVariable`s) the run uses.
      step: the step to write at.

    Returns:
      Whether the placement was written.
    """
    if recorder.pss_placement is None:
        recorder.pss_placement = Placement()
    state = recorder.pss_placement
    for variable in shards(variables):
        state.seen.setdefault(id(variable), variable)
    if len(state.seen) == state.written:
        return False
    probe = recorder.probe
    document = placement_json(list(state.seen.values()), probe.static, probe.strategy)
    with probe.host_lock:
        probe.write_now(
            schema.TAG_VARIABLE_PLACEMENT,
            lambda: tf.constant(document),
            step,
            schema.KIND_VARIABLE_PLACEMENT,
        )
    state.written = len(state.seen)
    return True
