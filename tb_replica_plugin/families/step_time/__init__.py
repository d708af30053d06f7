"""The step_time family: each replica's ready time, and per-worker step timing of a job.

The per-worker timing is recorded by the inputs family's write side.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.families.step_time import present, read, rules, schema
from tb_replica_plugin.registry import Family, Presenter, Rules

FAMILY = Family(
    name="step_time",
    attribute="step_time",
    tags=schema.TAGS,
    read=read.from_samples,
    merge=read.merge_step_time,
    rules=Rules(find=rules.find, kinds=rules.FINDING_KINDS),
    present=Presenter(
        body=present.body,
        args=present.ARGS,
        report_json=present.report_json,
        report_text=present.report_text,
        listed=present.listed,
    ),
    needs=("inputs",),
    merge_tags=(schema.TAG_STEP_TIME,),
    route="/step_time",
    text_order=-1,
    json_order=60,
)
