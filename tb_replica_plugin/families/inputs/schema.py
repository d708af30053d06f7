"""Tags of the inputs family (placeholder until the read side moves here)."""

from tb_replica_plugin.metadata import KIND_BATCH_SIZE, KIND_SHAPES, TAG_BATCH_SIZE, TAG_SHAPES  # noqa: F401
