"""The step_time family: per-worker step timing of a multi-worker job.

Recorded by the inputs family's write side.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.families.step_time import schema
from tb_replica_plugin.registry import Family

FAMILY = Family(
    name="step_time",
    attribute="step_time",
    package=__name__,
    tags=schema.TAGS,
    needs=("inputs",),
    merge_tags=(schema.TAG_STEP_TIME,),
    route="/step_time",
    text_order=-1,
    json_order=60,
)
