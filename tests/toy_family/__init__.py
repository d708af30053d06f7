"""A throwaway family for tests/test_registry.py: one [R] int count per replica and step.

Registered only inside that test (one entry added to `registry.FAMILY_MODULES`), to show that a
family is its own package plus one registry line.
"""

from tb_replica_plugin.registry import Family
from toy_family import schema

FAMILY = Family(
    name="toy",
    attribute="toy",
    package=__name__,
    tags=schema.TAGS,
    needs=("inputs",),
    route="/toy",
)
