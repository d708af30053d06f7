"""The rng family: random streams per replica, which replicas draw the same numbers.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.families.rng import schema
from tb_replica_plugin.registry import Family

FAMILY = Family(
    name="rng",
    attribute="rng",
    package=__name__,
    tags=schema.TAGS,
    needs=(),
    route="/rng",
    text_order=10,
    json_order=10,
)
