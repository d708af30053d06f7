"""The gradients family: local (pre all-reduce) gradient health per replica.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.core.family import Family, Presenter, Rules
from tb_replica_plugin.families.gradients import present, read, rules, schema


def write_side():
    """The write side (TensorFlow), imported when a probe is created."""
    from tb_replica_plugin.families.gradients.record import Recorder, Recording

    return Recorder, Recording


FAMILY = Family(
    name="gradients",
    attribute="gradients",
    tags=schema.TAGS,
    read=read.from_samples,
    merger=read.GradientsMerger,
    rules=Rules(find=rules.find, kinds=rules.FINDING_KINDS, annotate=rules.annotate),
    present=Presenter(
        body=present.body,
        args=present.ARGS,
        report_json=present.report_json,
        report_text=present.report_text,
        recorded_steps=present.recorded_steps,
    ),
    write_side=write_side,
    # Its rules read the inputs family's batch sizes (a NaN loss of an empty batch).
    uses=("inputs",),
    route="/gradients",
    text_order=40,
    json_order=40,
)
