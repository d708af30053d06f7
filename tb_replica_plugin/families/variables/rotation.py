"""Rotating drift checks: which slice of each variable a logged step fingerprints.

A full check reads every element of every copy at each logged step, so its cost grows with the
model. With a budget of B elements, the variables larger than `WHOLE_ELEMENTS` are cut into P
slices (P = ceil(their total size / B)), and logged check number i fingerprints slice i mod P of
each of them (the smaller ones whole): every element is checked once every P logged checks, and
the cost of a check stays near B elements per replica whatever the size of the model. A
`ReplicaCallback` with an integer `update_freq` adds the full check at each epoch end.

Every copy of a variable is cut the same way at a given step, so the copies' hashes and sketches
stay comparable: a drift is seen at the first check whose slice holds a drifted element, and the
drift measured there is that of the slice. Slices are runs of the flattened (row-major) elements;
slice j of a variable of n elements with chunk c = ceil(n / P) starts at min(j * c, n - c), so the
last slice overlaps the one before it instead of being shorter (every slice has the same static
size).

Pure Python (the write side builds the slices' starts in-graph, `record._slicer`).
"""

# Elements per replica a rotating check reads (about; the whole small variables come on top).
DEFAULT_BUDGET = 1 << 15
# A variable of at most this many elements is always checked whole (slicing it saves nothing).
WHOLE_ELEMENTS = 4096


def check_budget(budget, name="variables_budget"):
    """Raises ValueError unless `budget` is None or an integer >= 1.

    Args:
      budget: elements per replica of a rotating check, or None (full checks).
      name: the argument's name in the error message.
    """
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int) or budget < 1
    ):
        raise ValueError(
            f"`{name}` must be an integer >= 1, or None for a full check at every logged step. "
            f"Received: {budget!r}"
        )


def plan(sizes, budget):
    """The rotation of a variable list: the period P and each variable's slice size.

    Args:
      sizes: element count of each variable (None: unknown or not numeric; checked whole).
      budget: elements per replica of a check, or None (full checks).

    Returns:
      `(period, chunks)`: P (1: every check is full) and a list of slice sizes (a variable's
      own size when it is checked whole; None where `sizes` has None).

    Example:
      >>> plan([100_000, 300, 60_000], 40_000)
      (4, [25000, 300, 15000])
    """
    large = [n for n in sizes if n is not None and n > WHOLE_ELEMENTS]
    period = 1 if budget is None or not large else max(1, -(-sum(large) // budget))
    chunks = [
        n if n is None or n <= WHOLE_ELEMENTS or period == 1 else -(-n // period) for n in sizes
    ]
    return period, chunks
