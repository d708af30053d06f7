"""Tags of the rng family (placeholder until the read side moves here)."""

from tb_replica_plugin.metadata import (  # noqa: F401
    KIND_RNG_GENERATORS,
    KIND_RNG_STREAMS,
    TAG_RNG_GENERATORS,
    TAG_RNG_STREAMS,
)
