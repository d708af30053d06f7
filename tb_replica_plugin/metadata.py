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

import functools
import json

from tensorboard.compat.proto import summary_pb2

PLUGIN_NAME = "replicas"

# The newest version of any tensor layout written by this package (the version written for a kind
# is its family's `registry.kind_version`, 1 for most). Bump on any incompatible change of a
# kind's layout and keep readers able to read every older version.
SCHEMA_VERSION = 2


class UnsupportedSchemaError(ValueError):
    """Raised when summary metadata was written by a newer (or unknown) schema."""


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


def parse_plugin_content(content):
    """Parses the `plugin_data.content` bytes written by `create_summary_metadata`.

    Args:
      content: the bytes of `SummaryMetadata.plugin_data.content`.

    Returns:
      A dict with at least `version` (int) and `kind` (str).

    Raises:
      UnsupportedSchemaError: if the content is not valid JSON of this plugin, or its version is
        newer than `SCHEMA_VERSION` (upgrade tb_replica_plugin to read it).

    Example:
      >>> parse_plugin_content(b'{"kind": "shapes", "version": 1}')["kind"]
      'shapes'
    """
    try:
        raw = bytes(content)
    except TypeError as error:
        raise UnsupportedSchemaError(f"Unreadable plugin metadata content: {error}") from None
    return dict(_parsed_content(raw))  # a copy: the parse is shared


@functools.lru_cache(maxsize=1024)
def _parsed_content(raw):
    """`parse_plugin_content` of bytes, parsed once per distinct content (every run of a log
    dir carries the same few, read again at each look)."""
    try:
        parsed = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError) as error:
        raise UnsupportedSchemaError(f"Unreadable plugin metadata content: {error}") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("version"), int):
        raise UnsupportedSchemaError(f"Plugin metadata content has no version: {parsed!r}")
    if parsed["version"] > SCHEMA_VERSION:
        raise UnsupportedSchemaError(
            f"Series written with schema version {parsed['version']}, this tb_replica_plugin "
            f"reads up to {SCHEMA_VERSION}; upgrade tb_replica_plugin to read it."
        )
    return parsed
