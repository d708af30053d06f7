"""Tags of the gradients family (placeholder until the read side moves here)."""

from tb_replica_plugin.metadata import (  # noqa: F401
    KIND_GRAD_NONFINITE,
    KIND_GRAD_NORMS,
    KIND_GRAD_VARIABLES,
    TAG_GRAD_NONFINITE,
    TAG_GRAD_NORMS,
    TAG_GRAD_VARIABLES,
)
