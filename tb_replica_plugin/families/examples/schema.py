"""Tags of the examples family (placeholder until the read side moves here)."""

from tb_replica_plugin.metadata import (  # noqa: F401
    KIND_DATA_EXAMPLES,
    KIND_DATA_OVERLAP,
    TAG_DATA_EXAMPLES,
    TAG_DATA_OVERLAP,
)
