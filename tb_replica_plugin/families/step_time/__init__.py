"""The step_time family: each replica's ready time per window (every run), and per-worker step
timing of a multi-worker job.

Its write side (`record`) hears every step's transfer (`Recorder.delivered`): the step's start and
each replica's arrival times, timed by the core.

Submodules: `schema` (tags, tensor layouts), `read`, `merge` (a job's), `rules`, `present`;
`record` is the write side (TensorFlow), loaded lazily by the probe only. Importing this package
imports no TensorFlow.
"""

from tb_replica_plugin.core.family import Family, Presenter, Rules
from tb_replica_plugin.families.step_time import merge, present, read, rules, schema


def write_side():
    """The write side (TensorFlow), imported when a probe is created."""
    from tb_replica_plugin.families.step_time.record import Recorder

    return Recorder, None


FAMILY = Family(
    name="step_time",
    attribute="step_time",
    tags=schema.TAGS,
    read=read.from_samples,
    merger=merge.StepTimeMerger,
    rules=Rules(find=rules.find, kinds=rules.FINDING_KINDS),
    present=Presenter(
        body=present.body,
        args=present.ARGS,
        report_json=present.report_json,
        report_text=present.report_text,
        listed=present.listed,
    ),
    write_side=write_side,
    needs=("inputs",),
    route="/step_time",
    text_order=-1,
    json_order=60,
)
