"""The variables family: weight drift and placement of each variable's copies.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.core.family import Family, Presenter, Rules
from tb_replica_plugin.families.variables import merge, present, read, rules, schema


def write_side():
    """The write side (TensorFlow), imported when a probe is created."""
    from tb_replica_plugin.families.variables.record import Recorder, Recording

    return Recorder, Recording


FAMILY = Family(
    name="variables",
    attribute="variables",
    tags=schema.TAGS,
    read=read.from_samples,
    merger=merge.VariablesMerger,
    rules=Rules(find=rules.find, kinds=rules.FINDING_KINDS, group_message=rules.group_message),
    present=Presenter(
        body=present.body,
        args=present.ARGS,
        report_json=present.report_json,
        report_text=present.report_text,
        identity=present.identity,
        recorded_steps=present.recorded_steps,
        runs_fields=present.runs_fields,
    ),
    write_side=write_side,
    versions=schema.VERSIONS,
    route="/variables",
    text_order=30,
    json_order=30,
)
