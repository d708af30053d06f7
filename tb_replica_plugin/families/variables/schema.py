"""Tags and tensor layouts of the variables family (weight drift and placement).

Written at logged steps only. Axis V is the variable list of the latest `variables/placement`
event, axis R the local replica devices. Imported by the writer and the reader; no imports.
"""

# Sparse: a scalar string tensor holding JSON: every variable's name, shape, dtype, trainable,
# sync, copy devices and whether it is mirrored on every replica device (docs/data-format.md).
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

TAGS = {
    TAG_VARIABLE_PLACEMENT: KIND_VARIABLE_PLACEMENT,
    TAG_VARIABLE_HASH: KIND_VARIABLE_HASH,
    TAG_VARIABLE_FINGERPRINT: KIND_VARIABLE_FINGERPRINT,
    TAG_VARIABLE_EXACT: KIND_VARIABLE_EXACT,
}
