"""The stat families, one line each (placeholder until the read side moves to the registry)."""

FAMILY_MODULES = (
    "tb_replica_plugin.families.inputs",
    "tb_replica_plugin.families.step_time",
    "tb_replica_plugin.families.gradients",
    "tb_replica_plugin.families.rng",
    "tb_replica_plugin.families.examples",
    "tb_replica_plugin.families.variables",
)
