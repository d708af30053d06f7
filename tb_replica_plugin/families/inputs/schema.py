"""Tags and tensor layouts of the inputs family (per-replica batch sizes and input shapes).

Imported by the writer and the reader; no imports.
"""

# Dense series, written every `update_freq` steps: int32 tensor [3, R] with rows
# (batch size at this step, min over the window, max over the window); the window is every step
# observed since the previous write of this tag, this step included.
TAG_BATCH_SIZE = "inputs/batch_size"
# Sparse series, written at the first observed step and at every step whose per-replica shapes or
# dtypes differ from the previous observed step: a scalar string tensor holding JSON
# (docs/data-format.md).
TAG_SHAPES = "inputs/shapes"

KIND_BATCH_SIZE = "batch_size"
KIND_SHAPES = "shapes"

TAGS = {TAG_BATCH_SIZE: KIND_BATCH_SIZE, TAG_SHAPES: KIND_SHAPES}
