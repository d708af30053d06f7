"""Tag and tensor layout of the step_time family (multi-worker jobs; written by inputs).

Imported by the writer and the reader; no imports.
"""

# Multi-worker jobs only, dense like `inputs/batch_size` (same steps): float64 tensor [3] with
# (host wall-clock time in seconds since the epoch when this worker's step inputs were ready,
# seconds since the previous observed step, mean seconds per step over the window).
TAG_STEP_TIME = "workers/step_time"

KIND_STEP_TIME = "step_time"

TAGS = {TAG_STEP_TIME: KIND_STEP_TIME}
