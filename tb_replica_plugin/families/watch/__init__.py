"""The watch family: any tensor per replica (`ReplicaProbe.watch`, model outputs in `fit`).

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.core.family import Family, Presenter, Rules
from tb_replica_plugin.families.watch import present, read, rules, schema


def write_side():
    """The write side (TensorFlow), imported when a probe is created."""
    from tb_replica_plugin.families.watch.record import Recorder, Recording

    return Recorder, Recording


FAMILY = Family(
    name="watch",
    attribute="watch",
    tags=schema.TAGS,
    read=read.from_samples,
    merger=read.WatchMerger,
    rules=Rules(find=rules.find, kinds=rules.FINDING_KINDS),
    present=Presenter(
        body=present.body,
        args=present.ARGS,
        report_json=present.report_json,
        report_text=present.report_text,
        identity=present.identity,
        recorded_steps=present.recorded_steps,
    ),
    write_side=write_side,
    uses=("inputs",),
    route="/watch",
    text_order=60,
    json_order=60,
)
