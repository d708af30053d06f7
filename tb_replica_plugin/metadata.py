"""Plugin name, summary tags and the versioned summary metadata of tb_replica_plugin.

Every summary this package writes carries `SummaryMetadata.plugin_data` with
`plugin_name == PLUGIN_NAME` and a small JSON `content`:

    {"version": 1, "kind": "batch_size"}

`version` is the schema version of the tensor layout described in README ("Data written"). A
reader that meets a newer version skips that series and says so instead of misreading it.

This module imports no TensorFlow: it is shared by the writers and by the TensorBoard plugin.
"""

import json

from tensorboard.compat.proto import summary_pb2

PLUGIN_NAME = "replicas"

# Version of the tensor layouts written by this package. Bump on any incompatible change and keep
# readers able to read every older version.
SCHEMA_VERSION = 1

# Dense series, written every `update_freq` steps: int32 tensor [3, R] with rows
# (batch size at this step, min over the window, max over the window); the window is every step
# observed since the previous write of this tag, this step included.
TAG_BATCH_SIZE = "inputs/batch_size"
# Sparse series, written at the first observed step and at every step whose per-replica shapes or
# dtypes differ from the previous observed step: a scalar string tensor holding JSON (see README).
TAG_SHAPES = "inputs/shapes"

# RNG family (README "Data written"), written every `update_freq` steps. `rng/streams`: int64
# [G, R, 1 + W]: per generator and replica, the stream fingerprint of the next draw then the state
# words (zero-padded to W). `rng/generators`: scalar JSON string naming the G generators, written
# at the first written step of each layout.
TAG_RNG_STREAMS = "rng/streams"
TAG_RNG_GENERATORS = "rng/generators"
# Data family, written every `update_freq` steps. `data/examples`: int64 [R, 4 + K]: per replica
# the batch size, distinct examples, examples also on another replica (this step, then summed over
# the window) and a bottom-K sketch of the per-example fingerprints. `data/overlap`: int64
# [3, R, R]: examples shared by two replicas (this step, summed over the window) and the window's
# steps with any shared example.
TAG_DATA_EXAMPLES = "data/examples"
TAG_DATA_OVERLAP = "data/overlap"

KIND_BATCH_SIZE = "batch_size"
KIND_SHAPES = "shapes"
KIND_RNG_STREAMS = "rng_streams"
KIND_RNG_GENERATORS = "rng_generators"
KIND_DATA_EXAMPLES = "data_examples"
KIND_DATA_OVERLAP = "data_overlap"
# Multi-worker jobs only, dense like `inputs/batch_size` (same steps): float64 tensor [3] with
# (host wall-clock time in seconds since the epoch when this worker's step inputs were ready,
# seconds since the previous observed step, mean seconds per step over the window).
TAG_STEP_TIME = "workers/step_time"

KIND_BATCH_SIZE = "batch_size"
KIND_SHAPES = "shapes"
KIND_STEP_TIME = "step_time"
# Variables family (weight drift and placement), written at logged steps only. Axis V is the
# variable list of the latest `variables/placement` event, axis R the local replica devices.
# Sparse: a scalar string tensor holding JSON: every variable's name, shape, dtype, trainable,
# sync, copy devices and whether it is mirrored on every replica device (see README).
TAG_VARIABLE_PLACEMENT = "variables/placement"
# int64 [V, R]: 64-bit hash of the raw bits of each copy (0 where the replica holds no copy).
TAG_VARIABLE_HASH = "variables/hash"
# float64 [V, R, 4 + K]: (min, max, sum, sum of squares, K-wide linear sketch) of each copy.
TAG_VARIABLE_FINGERPRINT = "variables/fingerprint"
# float64 [V, R, 2]: exact (max |copy_r - copy_0|, ||copy_r - copy_0||_2); only with exact=True.
TAG_VARIABLE_EXACT = "variables/exact"

KIND_VARIABLE_PLACEMENT = "variable_placement"
KIND_VARIABLE_HASH = "variable_hash"
KIND_VARIABLE_FINGERPRINT = "variable_fingerprint"
KIND_VARIABLE_EXACT = "variable_exact"
# Gradients family (see README "Data written"). Dense, every `update_freq` steps: float32 tensor
# [2 + V, R]: row 0 each replica's local gradient global norm, row 1 its local loss, rows 2.. the
# norm of each variable's gradient (variables named by the last TAG_GRAD_VARIABLES event).
TAG_GRAD_NORMS = "gradients/norms"
# Sparse, written only at steps where some replica's gradients or loss hold NaN or Inf: int32
# tensor [4, R]: rows (NaN values in gradients, Inf values in gradients, loss is NaN, loss is Inf).
TAG_GRAD_NONFINITE = "gradients/nonfinite"
# Sparse, written at the first observed step and whenever the observed variables change: a scalar
# string tensor holding JSON {"variables", "shapes", "loss", "scaling", "replicas", "source"}.
TAG_GRAD_VARIABLES = "gradients/variables"

KIND_GRAD_NORMS = "grad_norms"
KIND_GRAD_NONFINITE = "grad_nonfinite"
KIND_GRAD_VARIABLES = "grad_variables"

TAG_KINDS = {
    TAG_BATCH_SIZE: KIND_BATCH_SIZE,
    TAG_SHAPES: KIND_SHAPES,
    TAG_RNG_STREAMS: KIND_RNG_STREAMS,
    TAG_RNG_GENERATORS: KIND_RNG_GENERATORS,
    TAG_DATA_EXAMPLES: KIND_DATA_EXAMPLES,
    TAG_DATA_OVERLAP: KIND_DATA_OVERLAP,
    TAG_STEP_TIME: KIND_STEP_TIME,
    TAG_VARIABLE_PLACEMENT: KIND_VARIABLE_PLACEMENT,
    TAG_VARIABLE_HASH: KIND_VARIABLE_HASH,
    TAG_VARIABLE_FINGERPRINT: KIND_VARIABLE_FINGERPRINT,
    TAG_VARIABLE_EXACT: KIND_VARIABLE_EXACT,
    TAG_GRAD_NORMS: KIND_GRAD_NORMS,
    TAG_GRAD_NONFINITE: KIND_GRAD_NONFINITE,
    TAG_GRAD_VARIABLES: KIND_GRAD_VARIABLES,
}


class UnsupportedSchemaError(ValueError):
    """Raised when summary metadata was written by a newer (or unknown) schema."""


def create_summary_metadata(kind, description=""):
    """Creates the `SummaryMetadata` proto for one series of this plugin.

    Args:
      kind: one of the `KIND_*` constants, e.g. `KIND_BATCH_SIZE`.
      description: optional human-readable description shown by TensorBoard.

    Returns:
      A `summary_pb2.SummaryMetadata` with `plugin_name == PLUGIN_NAME`, the JSON content and
      `data_class` DATA_CLASS_TENSOR (needed by RustBoard and the data provider).

    Raises:
      ValueError: if `kind` is unknown.

    Example:
      >>> create_summary_metadata(KIND_SHAPES).plugin_data.plugin_name
      'replicas'
    """
    if kind not in TAG_KINDS.values():
        raise ValueError(
            f"Unknown series kind {kind!r}; expected one of {sorted(TAG_KINDS.values())}."
        )
    content = json.dumps({"version": SCHEMA_VERSION, "kind": kind}, sort_keys=True)
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
        parsed = json.loads(bytes(content).decode("utf-8"))
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
