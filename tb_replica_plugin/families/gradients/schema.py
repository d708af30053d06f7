"""Tags and tensor layouts of the gradients family (docs/data-format.md).

Imported by the writer and the reader; no imports.
"""

# Dense, every `update_freq` steps: float32 tensor [2 + V, R]: row 0 each replica's local gradient
# global norm, row 1 its local loss, rows 2.. the norm of each variable's gradient (variables
# named by the last TAG_GRAD_VARIABLES event).
TAG_GRAD_NORMS = "gradients/norms"
# Sparse, written only at steps where some replica's gradients or loss hold NaN or Inf: int32
# tensor [4, R], rows NONFINITE_ROWS: NaN values in gradients, Inf values in gradients, loss is
# NaN, loss is Inf.
TAG_GRAD_NONFINITE = "gradients/nonfinite"
# Sparse, written at the first observed step and whenever the observed variables change (by the
# host, when the step observing them is traced): a scalar string tensor holding JSON
# {"variables", "shapes", "loss", "scaling", "replicas", "source"}.
TAG_GRAD_VARIABLES = "gradients/variables"

# Sparse, written at the first step of a run of steps where some replica's gradients or loss turn
# non-finite (at most `capture_limit` times): the local batch of every such replica. A string
# vector of blocks, one per captured replica: a JSON header {"replica", "names", "dtypes",
# "leaves"} then, per input leaf, the serialized TensorProto of its full shape (int64) and of its
# kept rows (the first rows that fit the leaf's share of `capture_bytes`).
TAG_GRAD_BATCH = "gradients/batch"

# Sparse, written by the host when a replica's device fault record of plain steps changed
# (`device_faults`: steps neither logged nor sampled): int64 tensor [3, R], rows
# PLAIN_FAULT_ROWS: faulty plain steps so far, the first and the last (-1: none), at the latest.
TAG_GRAD_PLAIN_FAULTS = "gradients/plain_faults"
PLAIN_FAULT_ROWS = ("count", "first", "last")

# Rows of TAG_GRAD_NORMS before the per-variable norms.
NORM_GLOBAL, NORM_LOSS = 0, 1
NORM_VARIABLES = 2  # the first variable's row

# Rows of TAG_GRAD_NONFINITE.
NONFINITE_ROWS = ("grad_nan", "grad_inf", "loss_nan", "loss_inf")
GRAD_NAN, GRAD_INF, LOSS_NAN, LOSS_INF = range(len(NONFINITE_ROWS))

KIND_GRAD_NORMS = "grad_norms"
KIND_GRAD_NONFINITE = "grad_nonfinite"
KIND_GRAD_VARIABLES = "grad_variables"
KIND_GRAD_BATCH = "grad_batch"
KIND_GRAD_PLAIN_FAULTS = "grad_plain_faults"

TAGS = {
    TAG_GRAD_NORMS: KIND_GRAD_NORMS,
    TAG_GRAD_NONFINITE: KIND_GRAD_NONFINITE,
    TAG_GRAD_VARIABLES: KIND_GRAD_VARIABLES,
    TAG_GRAD_BATCH: KIND_GRAD_BATCH,
    TAG_GRAD_PLAIN_FAULTS: KIND_GRAD_PLAIN_FAULTS,
}
