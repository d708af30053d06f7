"""Tags and tensor layouts of the variables family (weight drift and placement).

Written at logged steps only. Axis V is the variable list of the latest `variables/placement`
event, axis R the local replica devices. Imported by the writer and the reader; no imports.
"""

# Sparse: a scalar string tensor holding JSON: every variable's name, shape, dtype, trainable,
# sync, copy devices and whether it is mirrored on every replica device (docs/data-format.md).
TAG_VARIABLE_PLACEMENT = "variables/placement"
# int64 [V, R]: 64-bit hash of the raw bits of each copy (0 where the replica holds no copy).
TAG_VARIABLE_HASH = "variables/hash"
# float64 [U, 2 + 4 + K], one row per summarized copy: (variable index v, replica position r,
# min, max, sum, sum of squares, K-wide linear sketch). Written: every copy on replica 0 and
# every other copy except those whose hash equals replica 0's copy's (when the variable is
# `shareable`: the row would be replica 0's exactly, so the reader takes replica 0's row). Rows
# are in (v, r) order. Version 1 of this kind (read still): float64 [V, R, 4 + K], every copy.
TAG_VARIABLE_FINGERPRINT = "variables/fingerprint"
FINGERPRINT_ID_COLUMNS = 2  # (v, r) in front of each row of the version-2 layout
# float64 [V, R, 2]: exact (max |copy_r - copy_0|, ||copy_r - copy_0||_2); only with exact=True.
TAG_VARIABLE_EXACT = "variables/exact"
# int64 [V, 2]: (first element, element count) of the part of each variable (flattened, row-major)
# that this check's hash and fingerprint cover; written by every check of a rotating plan (the
# placement's "rotation"), the full ones too ((0, size); count -1: a variable checked whole whose
# size is unknown). No event at a step: every variable was checked whole.
TAG_VARIABLE_WINDOW = "variables/window"

KIND_VARIABLE_PLACEMENT = "variable_placement"
KIND_VARIABLE_HASH = "variable_hash"
KIND_VARIABLE_FINGERPRINT = "variable_fingerprint"
KIND_VARIABLE_EXACT = "variable_exact"
KIND_VARIABLE_WINDOW = "variable_window"

# Schema version written per kind (kinds not listed: 1); readers read every older version.
VERSIONS = {KIND_VARIABLE_FINGERPRINT: 2}

TAGS = {
    TAG_VARIABLE_PLACEMENT: KIND_VARIABLE_PLACEMENT,
    TAG_VARIABLE_HASH: KIND_VARIABLE_HASH,
    TAG_VARIABLE_FINGERPRINT: KIND_VARIABLE_FINGERPRINT,
    TAG_VARIABLE_EXACT: KIND_VARIABLE_EXACT,
    TAG_VARIABLE_WINDOW: KIND_VARIABLE_WINDOW,
}
