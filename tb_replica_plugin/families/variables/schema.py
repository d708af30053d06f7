"""Tags of the variables family (placeholder until the read side moves here)."""

from tb_replica_plugin.metadata import (  # noqa: F401
    KIND_VARIABLE_EXACT,
    KIND_VARIABLE_FINGERPRINT,
    KIND_VARIABLE_HASH,
    KIND_VARIABLE_PLACEMENT,
    TAG_VARIABLE_EXACT,
    TAG_VARIABLE_FINGERPRINT,
    TAG_VARIABLE_HASH,
    TAG_VARIABLE_PLACEMENT,
)
