"""JSON documents written piece by piece: a large array is held as numpy, not as Python lists.

A family's `report_json` block may put a `FloatRows` where an array of a job can be large
(`gradients.variable_norms` of a 2,048-replica job is 12 M floats: ~200 MB of JSON text and
several times that as Python floats). `chunks` encodes a value as `json.dumps(materialize(value),
allow_nan=False, default=str)` would, one outer row of each `FloatRows` at a time; `materialize`
gives the plain value (`Report.to_json`). Imports no TensorFlow.
"""

import json

from tb_replica_plugin.core.downsample import json_floats


class FloatRows:
    """An array written as `downsample.json_floats(array)` writes it, one outer row at a time.

    Attributes:
      array: the numpy array (at least one dimension).

    Example:
      >>> "".join(chunks({"norms": FloatRows(numpy.float32([[0.1, numpy.nan]]))}))
      '{"norms": [[0.1, "NaN"]]}'
    """

    def __init__(self, array):
        self.array = array

    def materialize(self):
        return json_floats(self.array)


def materialize(value):
    """`value` with every `FloatRows` in it (a value of its dicts, at any depth) as lists."""
    if isinstance(value, FloatRows):
        return value.materialize()
    if isinstance(value, dict):
        return {key: materialize(item) for key, item in value.items()}
    return value


def encode(value):
    """One plain JSON value, as `json.dumps(value, allow_nan=False, default=str)` encodes it."""
    return json.dumps(value, allow_nan=False, default=str)


def chunks(value):
    """Yields pieces of `value`'s compact JSON text (`encode(materialize(value))` joined).

    A `FloatRows` is found as a value of dicts (at any depth of dicts), not inside lists.

    Raises:
      ValueError: for a NaN or infinite float outside a `FloatRows` (strict JSON).
    """
    if isinstance(value, FloatRows):
        if value.array.ndim == 0 or not len(value.array):
            yield encode(value.materialize())
            return
        for index, row in enumerate(value.array):
            yield ("[" if index == 0 else ", ") + encode(json_floats(row))
        yield "]"
    elif isinstance(value, dict) and _holds_rows(value):
        separator = "{"
        for key, item in value.items():
            yield f"{separator}{encode(str(key))}: "
            yield from chunks(item)
            separator = ", "
        yield "}"
    else:
        yield encode(value)


def _holds_rows(value):
    """Whether a `FloatRows` is a value of `value` or of its dicts (at any depth)."""
    if isinstance(value, FloatRows):
        return True
    return isinstance(value, dict) and any(_holds_rows(item) for item in value.values())
