"""The watch family: any tensor per replica (`ReplicaProbe.watch`, model outputs in `fit`).

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.families.watch import schema
from tb_replica_plugin.registry import Family

FAMILY = Family(
    name="watch",
    attribute="watch",
    package=__name__,
    tags=schema.TAGS,
    needs=(),
    route="/watch",
    text_order=60,
    json_order=60,
)
