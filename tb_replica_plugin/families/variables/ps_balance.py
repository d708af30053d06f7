"""Parameter-server balance under `ParameterServerStrategy`: the bytes each ps holds, and the
`ps_imbalance` rule.

Read from the variables family's placement event the coordinator writes under that strategy
(`families/variables/pss.py`: each variable's or shard's `bytes` and `ps`). Pure Python.
"""

from tb_replica_plugin.analysis import Finding

STRATEGY = "ParameterServerStrategy"
# A parameter server holding more than this many times its fair share (1 / number of ps) of the
# variable bytes is out of balance...
SHARE_FACTOR = 1.5
# ...when the variables hold at least this many bytes (a tiny model's few variables cannot be
# spread evenly and do not load a ps).
MIN_BYTES = 64 * 1024

FINDING_KINDS = {
    "ps_imbalance": {
        "severity": "warning",
        "thresholds": (),
        "summary": (
            "Under ParameterServerStrategy one parameter server holds far more than its share "
            "of the variable bytes."
        ),
    },
}


def _size(count):
    """Bytes as text: "250 KiB", "1.5 MiB"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} B"


def balance(series):
    """What each parameter server holds, from the latest placement (None unless the run was
    recorded under `ParameterServerStrategy`).

    Args:
      series: a `read.VariablesSeries`, or None.

    Returns:
      `{"servers", "total_bytes", "off_ps_bytes", "fair_share", "share_threshold",
      "variables"}`: per ps (its task index order) `{"ps", "device", "bytes", "share",
      "variables", "largest", "largest_bytes"}`; the bytes on parameter servers; those of
      variables on no ps (e.g. the coordinator's); 1 / number of ps; the share above which a
      ps is out of balance; per variable (or shard) `{"name", "ps", "bytes", "shape"}`.
    """
    if series is None or not series.placement_events:
        return None
    document = series.placement_events[-1][1]
    if document.get("strategy") != STRATEGY:
        return None
    devices = [str(d) for d in document.get("parameter_servers") or []]
    servers = [_server(i, device) for i, device in enumerate(devices)]
    variables, off_ps = [], 0
    for variable in series.variables:
        size, ps = int(variable.get("bytes") or 0), variable.get("ps")
        variables.append(
            {"name": variable["name"], "ps": ps, "bytes": size, "shape": variable.get("shape")}
        )
        if ps is None:
            off_ps += size
            continue
        while ps >= len(servers):  # a ps the cluster spec did not name
            servers.append(_server(len(servers), f"/job:ps/replica:0/task:{len(servers)}"))
        server = servers[ps]
        server["bytes"] += size
        server["variables"] += 1
        if server["largest"] is None or size > server["largest_bytes"]:
            server["largest"], server["largest_bytes"] = variable["name"], size
    total = sum(server["bytes"] for server in servers)
    for server in servers:
        server["share"] = server["bytes"] / total if total else 0.0
    fair = 1.0 / len(servers) if servers else 1.0
    return {
        "servers": servers,
        "total_bytes": total,
        "off_ps_bytes": off_ps,
        "fair_share": fair,
        "share_threshold": min(1.0, SHARE_FACTOR * fair),
        "variables": variables,
    }


def _server(index, device):
    return {
        "ps": index,
        "device": device,
        "bytes": 0,
        "share": 0.0,
        "variables": 0,
        "largest": None,
        "largest_bytes": 0,
    }


def find(series):
    """The `ps_imbalance` findings of a run (none unless recorded under the strategy).

    Args:
      series: a `read.VariablesSeries`, or None.

    Returns:
      A list of `Finding` (one per parameter server above its share).
    """
    held = balance(series)
    if held is None or len(held["servers"]) < 2 or held["total_bytes"] < MIN_BYTES:
        return []
    step = int(series.placement_events[-1][0])
    findings = []
    for server in held["servers"]:
        if server["share"] <= held["share_threshold"]:
            continue
        count = len(held["servers"])
        findings.append(
            Finding(
                kind="ps_imbalance",
                severity="warning",
                run=series.run,
                first_step=step,
                last_step=step,
                count=1,
                replicas=[],
                name=server["largest"],
                value=round(server["share"], 4),
                threshold=round(held["share_threshold"], 4),
                message=(
                    f"Parameter server {server['ps']} ({server['device']}) holds "
                    f"{100 * server['share']:.1f} % of the variable bytes "
                    f"({_size(server['bytes'])} of {_size(held['total_bytes'])}; its share with "
                    f"{count} parameter servers is {100 * held['fair_share']:.0f} %), so it "
                    "serves most of every step's reads and updates. Its largest variable is "
                    f"'{server['largest']}' ({_size(server['largest_bytes'])}): partition large "
                    "variables over the parameter servers, e.g. ParameterServerStrategy(resolver, "
                    "variable_partitioner=tf.distribute.experimental.partitioners."
                    f"MinSizePartitioner(min_shard_bytes=64 << 10, max_shards={count})) or "
                    f"FixedShardsPartitioner({count})."
                ),
                view="placement",
                cause="unpartitioned",
            )
        )
    return findings


def report_text(held):
    """The report's lines of the parameter servers (`balance`'s dict)."""
    lines = [
        f"  parameter servers: {len(held['servers'])}, variable bytes "
        f"{_size(held['total_bytes'])} (one copy of each variable; drift does not apply):"
    ]
    for server in held["servers"]:
        largest = (
            f", largest '{server['largest']}' {_size(server['largest_bytes'])}"
            if server["largest"] is not None
            else ""
        )
        lines.append(
            f"    ps {server['ps']} ({server['device']}): {_size(server['bytes'])} "
            f"({100 * server['share']:.1f} %), {server['variables']} "
            f"variable{'' if server['variables'] == 1 else 's'}{largest}"
        )
    if held["off_ps_bytes"]:
        lines.append(f"    on no parameter server: {_size(held['off_ps_bytes'])}")
    return lines
