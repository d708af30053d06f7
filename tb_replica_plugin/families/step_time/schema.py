"""Tags of the step_time family (placeholder until the read side moves here)."""

from tb_replica_plugin.metadata import KIND_STEP_TIME, TAG_STEP_TIME  # noqa: F401
