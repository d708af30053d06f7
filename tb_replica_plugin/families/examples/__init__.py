"""The examples family: which examples each replica was fed.

Its RunData attribute and route are `data`.

Submodules: `schema` (tags, tensor layouts), `read`, `rules`, `present`; `record` is the write side
(TensorFlow), loaded lazily by the probe only. Importing this package imports no TensorFlow.
"""

from tb_replica_plugin.families.examples import schema
from tb_replica_plugin.registry import Family

FAMILY = Family(
    name="examples",
    attribute="data",
    package=__name__,
    tags=schema.TAGS,
    needs=("inputs",),
    route="/data",
    text_order=20,
    json_order=20,
)
