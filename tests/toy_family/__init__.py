"""A throwaway family for tests/test_registry.py: one [R] int count per replica and step.

Registered only inside those tests (`registry.registered(FAMILY)`), to show that a family is its
own package plus one registry entry: recorded in a custom loop and under Keras `fit`, read,
merged over a job's workers, judged and served.
"""

from tb_replica_plugin.core.family import Family, Presenter, Rules
from toy_family import present, read, rules, schema


def write_side():
    """The write side (TensorFlow): the recorder only (no public `observe_*` method)."""
    from toy_family.record import Recorder

    return Recorder, None


FAMILY = Family(
    name="toy",
    attribute="toy",
    tags=schema.TAGS,
    read=read.from_samples,
    merge=read.merge,
    rules=Rules(find=rules.find, kinds=rules.FINDING_KINDS),
    present=Presenter(
        body=present.body,
        args=present.ARGS,
        report_json=present.report_json,
        report_text=present.report_text,
    ),
    write_side=write_side,
    needs=("inputs",),
    route="/toy",
)
