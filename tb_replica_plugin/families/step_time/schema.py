"""Tags and tensor layouts of the step_time family (written by the probe's core and by inputs).

Imported by the writer and the reader; no imports.
"""

# Multi-worker jobs only, dense like `inputs/batch_size` (same steps): float64 tensor [3] with
# (host wall-clock time in seconds since the epoch when this worker's step inputs were ready,
# seconds since the previous observed step, mean seconds per step over the window).
TAG_STEP_TIME = "workers/step_time"

# Every run, dense like `inputs/batch_size` (same steps): float64 tensor [4, R] (R: this worker's
# replicas, in the order of its probe's `replicas`, global ids), over the steps of the window
# since the previous write. A replica's *ready time* at a step is the host time from the step's
# start to the arrival on the host of the vector that replica sends once per step (its values of
# every family, computed up to its local gradients: a data dependency, so on an accelerator it
# marks when its work was done, not when its kernels were launched). Rows:
#   0: the median over the window of each replica's ready seconds;
#   1: their maximum over the window;
#   2: the median over the window of the seconds each replica waited for the slowest replica of
#      its worker (the largest ready time at that step minus its own): what the fast ones wait
#      at the all-reduce;
#   3: the number of steps the window holds (the same for every replica).
# Not written at steps whose ready times were not measured (a probe without a per-step vector).
# Under ParameterServerStrategy (replica r: worker r, written by the coordinator) a worker's
# time at a step is its step's seconds on its own clock, from the scheduled function's start to
# its end (`write/pss.py`); the window holds the written steps (step k: every worker's k-th);
# row 2 is 0 (no all-reduce: the workers do not wait for each other).
TAG_REPLICA_TIME = "step_time/replicas"

# ParameterServerStrategy only, written by the coordinator at `flush`/`close` (at the last
# written step; 0 before any): float64 tensor [4, W] (W: the workers, replica r = worker r),
# each worker's totals over every step it ran so far, also those beyond the slowest worker that
# are never written as steps. Rows:
#   0: the steps it ran;
#   1: its seconds busy (the sum of its steps' seconds, each from start to end on its clock);
#   2: the seconds from its first step's start to its last step's end (0 before two stamps);
#   3: its steps per second (row 0 / row 2; 0 when row 2 is 0).
TAG_PSS_WORKERS = "step_time/pss_workers"

KIND_STEP_TIME = "step_time"
KIND_REPLICA_TIME = "replica_time"
KIND_PSS_WORKERS = "pss_workers"

# Rows of TAG_REPLICA_TIME.
READY_MEDIAN, READY_MAX, WAIT_MEDIAN, WINDOW_STEPS = range(4)
REPLICA_TIME_ROWS = 4
# Rows of TAG_PSS_WORKERS.
PSS_STEPS_RUN, PSS_BUSY, PSS_SPAN, PSS_RATE = range(4)
PSS_WORKERS_ROWS = 4

TAGS = {
    TAG_STEP_TIME: KIND_STEP_TIME,
    TAG_REPLICA_TIME: KIND_REPLICA_TIME,
    TAG_PSS_WORKERS: KIND_PSS_WORKERS,
}
