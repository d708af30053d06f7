"""The status family: how a run is going and how it ended (heartbeats, crashes, stalls, lost
workers), recorded on the host, never inside the training step.

A *live* family (`registry.Family.live`): its heartbeats change a running job every few seconds
and its findings depend on when they are asked for (a run whose heartbeats stopped is silent only
once enough time has passed), so the tab reads it apart from the other families and judges it at
each request. Submodules: `schema`, `read`, `states`, `rules`, `present`, `attribution` (numpy and
the standard library); `record` is the write side (TensorFlow), loaded by the probe only.
"""

from tb_replica_plugin.core.family import Family, Presenter, Rules
from tb_replica_plugin.families.status import present, read, rules, schema


def write_side():
    """The write side (TensorFlow), imported when a probe is created."""
    from tb_replica_plugin.families.status.record import Recorder

    return Recorder, None


FAMILY = Family(
    name="status",
    attribute="status",
    tags=schema.TAGS,
    read=read.from_samples,
    merge=read.merge_status,
    rules=Rules(find=rules.find, kinds=rules.FINDING_KINDS),
    present=Presenter(
        body=present.body,
        args=present.ARGS,
        report_json=present.report_json,
        report_text=present.report_text,
        live_fields=present.live_fields,
    ),
    write_side=write_side,
    route="/status",
    worker_of=read.worker_identity,
    live=True,
    text_order=-2,
    json_order=5,
)
