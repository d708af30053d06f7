"""The rng family: random streams per replica, which replicas draw the same numbers.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.core.family import Family, Presenter, Rules
from tb_replica_plugin.families.rng import present, read, rules, schema


def write_side():
    """The write side (TensorFlow), imported when a probe is created."""
    from tb_replica_plugin.families.rng.record import Recorder, Recording

    return Recorder, Recording


FAMILY = Family(
    name="rng",
    attribute="rng",
    tags=schema.TAGS,
    read=read.from_samples,
    merger=read.RngMerger,
    rules=Rules(find=rules.find, kinds=rules.FINDING_KINDS, group_message=rules.group_message),
    present=Presenter(
        body=present.body,
        args=present.ARGS,
        report_json=present.report_json,
        report_text=present.report_text,
        run_view_args=present.RUN_VIEW_ARGS,
    ),
    write_side=write_side,
    route="/rng",
    text_order=10,
    json_order=10,
)
