"""The plugin's name and the versioned content of its summary metadata (ground floor).

Every summary this package writes carries `SummaryMetadata.plugin_data` with
`plugin_name == PLUGIN_NAME` and a small JSON `content`, `{"version": 1, "kind": "batch_size"}`
(`metadata.create_summary_metadata` writes it; this module reads it). Imports nothing of the
package and no TensorFlow.
"""

import functools
import json

PLUGIN_NAME = "replicas"

# The newest version of any tensor layout written by this package (the version written for a kind
# is its family's `registry.kind_version`, 1 for most). Bump on any incompatible change of a
# kind's layout and keep readers able to read every older version.
SCHEMA_VERSION = 2


class UnsupportedSchemaError(ValueError):
    """Raised when summary metadata was written by a newer (or unknown) schema."""


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
