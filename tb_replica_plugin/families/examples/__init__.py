"""The examples family: which examples each replica was fed.

Its RunData attribute and route are `data`.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow; with `fingerprints` and `pss`, its `ParameterServerStrategy` path), loaded lazily by
the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.core.family import Family, Presenter, Rules
from tb_replica_plugin.families.examples import present, read, rules, schema


def write_side():
    """The write side (TensorFlow), imported when a probe is created."""
    from tb_replica_plugin.families.examples.record import Recorder, Recording

    return Recorder, Recording


FAMILY = Family(
    name="examples",
    attribute="data",
    tags=schema.TAGS,
    read=read.from_samples,
    merger=read.ExamplesMerger,
    rules=Rules(find=rules.find, kinds=rules.FINDING_KINDS),
    present=Presenter(
        body=present.body,
        args=present.ARGS,
        report_json=present.report_json,
        report_text=present.report_text,
    ),
    write_side=write_side,
    versions=schema.VERSIONS,
    needs=("inputs",),
    route="/data",
    text_order=20,
    json_order=20,
)
