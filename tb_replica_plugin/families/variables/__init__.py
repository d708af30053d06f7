"""The variables family: weight drift and placement of each variable's copies.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.families.variables import schema
from tb_replica_plugin.registry import Family

FAMILY = Family(
    name="variables",
    attribute="variables",
    package=__name__,
    tags=schema.TAGS,
    versions=schema.VERSIONS,
    needs=(),
    route="/variables",
    text_order=30,
    json_order=30,
)
