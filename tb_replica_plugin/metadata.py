"""Plugin name, summary tags and the versioned summary metadata of tb_replica_plugin.

Every summary this package writes carries `SummaryMetadata.plugin_data` with
`plugin_name == PLUGIN_NAME` and a small JSON `content`:

    {"version": 1, "kind": "batch_size"}

`version` is the schema version of the tensor layout described in docs/data-format.md. A
reader that meets a newer version skips that series and says so instead of misreading it.

The tags, kinds and tensor layouts of each family live in its schema
(`tb_replica_plugin/families/<name>/schema.py`); `registry.tag_kinds()` gathers them.

This module imports no TensorFlow: it is shared by the writers and by the TensorBoard plugin.
"""

import json

from tensorboard.compat.proto import summary_pb2

# The plugin's name and the parse of the content are the ground floor's (`core.plugin_data`).
from tb_replica_plugin.core.plugin_data import (  # noqa: F401
    PLUGIN_NAME,
    SCHEMA_VERSION,
    UnsupportedSchemaError,
    parse_plugin_content,
)


def create_summary_metadata(kind, description=""):
    """Creates the `SummaryMetadata` proto for one series of this plugin.

    Args:
      kind: a kind of some registered family's schema (`registry.tag_kinds()`), e.g.
        `families.inputs.schema.KIND_BATCH_SIZE`.
      description: optional human-readable description shown by TensorBoard.

    Returns:
      A `summary_pb2.SummaryMetadata` with `plugin_name == PLUGIN_NAME`, the JSON content and
      `data_class` DATA_CLASS_TENSOR (needed by RustBoard and the data provider).

    Raises:
      ValueError: if `kind` is unknown.

    Example:
      >>> create_summary_metadata("shapes").plugin_data.plugin_name
      'replicas'
    """
    from tb_replica_plugin import registry

    kinds = registry.tag_kinds().values()
    if kind not in kinds:
        raise ValueError(f"Unknown series kind {kind!r}; expected one of {sorted(kinds)}.")
    version = registry.kind_version(kind)
    content = json.dumps({"version": version, "kind": kind}, sort_keys=True)
    return summary_pb2.SummaryMetadata(
        summary_description=description,
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=content.encode("utf-8")
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )
