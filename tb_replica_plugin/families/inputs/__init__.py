"""The inputs family: per-replica batch sizes and input shapes.

Its write side also records step_time on multi-worker jobs.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.families.inputs import schema
from tb_replica_plugin.registry import Family

FAMILY = Family(
    name="inputs",
    attribute="inputs",
    package=__name__,
    tags=schema.TAGS,
    needs=(),
    route="/inputs",
    annotates_findings=True,
    text_order=0,
    json_order=0,
)
