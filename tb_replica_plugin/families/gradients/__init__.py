"""The gradients family: local (pre all-reduce) gradient health per replica.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.families.gradients import schema
from tb_replica_plugin.registry import Family

FAMILY = Family(
    name="gradients",
    attribute="gradients",
    package=__name__,
    tags=schema.TAGS,
    needs=(),
    route="/gradients",
    text_order=40,
    json_order=40,
)
