"""Tags and tensor layouts of the watch family (docs/data-format.md).

One set of tags per watched name (`ReplicaProbe.watch(name, ...)`; in `fit`, `outputs`): the tags
below with `*` standing for the name, e.g. `watch/logits/stats`. Imported by the writer and the
reader; no imports.
"""

# Sparse: a scalar JSON string written at the first call and at every step whose per-replica
# kinds, dtypes or shapes of any leaf differ from the previous call's (as `inputs/shapes`).
TAG_SHAPES = "watch/*/shapes"
# float64 [L, len(STAT_ROWS), R]: per leaf, stat and replica, at logged (sampled) steps.
TAG_STATS = "watch/*/stats"
# The same layout as stats, written at EVERY step where some replica's value holds a NaN or Inf.
TAG_NONFINITE = "watch/*/nonfinite"

KIND_SHAPES = "watch_shapes"
KIND_STATS = "watch_stats"
KIND_NONFINITE = "watch_nonfinite"

TAGS = {TAG_SHAPES: KIND_SHAPES, TAG_STATS: KIND_STATS, TAG_NONFINITE: KIND_NONFINITE}

# Rows of a stats tensor. min, max, mean, l2 are over the finite values (NaN when there is none
# or the dtype is not numeric); nan, inf count the others; values: number of scalar values
# (dense: size, ragged: size of flat_values, sparse: nnz); nrows: leading dimension (ragged:
# nrows, sparse: dense_shape[0]; 1 for a scalar); row_min, row_max: shortest and longest row of a
# ragged leaf's outermost ragged dimension (NaN for dense and sparse leaves).
STAT_ROWS = ("min", "max", "mean", "l2", "nan", "inf", "values", "nrows", "row_min", "row_max")


def tag(pattern, name):
    """The tag of watched value `name` for one of the patterns above."""
    return pattern.replace("*", name, 1)


def name_of(pattern, tag_name):
    """The watched name in a tag of `pattern`, or None if it is not one."""
    head, tail = pattern.split("*", 1)
    if tag_name.startswith(head) and tag_name.endswith(tail) and len(tag_name) > len(head + tail):
        return tag_name[len(head) : len(tag_name) - len(tail)]
    return None
