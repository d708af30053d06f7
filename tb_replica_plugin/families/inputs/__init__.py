"""The inputs family: per-replica batch sizes and input shapes.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.core.family import Family, Presenter, Rules
from tb_replica_plugin.families.inputs import present, read, rules, schema


def write_side():
    """The write side (TensorFlow), imported when a probe is created."""
    from tb_replica_plugin.families.inputs.record import Recorder, Recording

    return Recorder, Recording


FAMILY = Family(
    name="inputs",
    attribute="inputs",
    tags=schema.TAGS,
    read=read.from_samples,
    merger=read.InputsMerger,
    rules=Rules(find=rules.find, kinds=rules.FINDING_KINDS, annotate=rules.annotate),
    present=Presenter(
        body=present.body,
        args=present.ARGS,
        report_json=present.report_json,
        report_text=present.report_text,
        listed=present.listed,
        identity=present.identity,
        recorded_steps=present.recorded_steps,
    ),
    write_side=write_side,
    route="/inputs",
    worker_of=read.worker_identity,
    text_order=0,
    json_order=0,
)
