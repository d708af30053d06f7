"""Named leaves of nested structures (dicts, lists, tuples, namedtuples), shared by the families
that record a batch or a value leaf by leaf (inputs, examples, gradients' culprit capture, watch).

Imports nothing: the leaves may be tensors or anything else.
"""


def flatten_with_names(structure, prefix=""):
    """Flattens nested dicts/lists/tuples of tensors into `(name, leaf)` pairs.

    Dict keys are sorted (as `tf.nest` does), sequence items are numbered, namedtuple fields keep
    their names, `None` leaves are dropped. Any other object is a leaf.

    Args:
      structure: the nested structure, e.g. `{"image": t1, "label": t2}` or `(t1, t2)`.
      prefix: the name of `structure` itself ("" for the root).

    Returns:
      A list of `(name, leaf)` pairs; names are joined with "/", e.g. `"x/image"`.

    Example:
      >>> flatten_with_names({"b": 1, "a": (2, None)})
      [('a/0', 2), ('b', 1)]
    """

    def join(key):
        return f"{prefix}/{key}" if prefix else str(key)

    if structure is None:
        return []
    if isinstance(structure, dict):
        pairs = []
        for key in sorted(structure, key=str):
            pairs.extend(flatten_with_names(structure[key], join(key)))
        return pairs
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        pairs = []
        for key in structure._fields:
            pairs.extend(flatten_with_names(getattr(structure, key), join(key)))
        return pairs
    if isinstance(structure, (list, tuple)):
        pairs = []
        for index, item in enumerate(structure):
            pairs.extend(flatten_with_names(item, join(index)))
        return pairs
    return [(prefix or "input", structure)]


# Names Keras gives to the parts of a `fit` batch, in `unpack_x_y_sample_weight` order.
FIT_BATCH_NAMES = ("x", "y", "sample_weight")


def name_fit_batch(data):
    """Names the parts of a Keras `fit` batch `(x,)`, `(x, y)` or `(x, y, sample_weight)`.

    Args:
      data: the batch as `train_step` receives it.

    Returns:
      A dict `{"x": ..., "y": ..., "sample_weight": ...}` without the missing parts.
    """
    if isinstance(data, tuple) and not hasattr(data, "_fields") and 1 <= len(data) <= 3:
        return {
            name: part
            for name, part in zip(FIT_BATCH_NAMES, data, strict=False)
            if part is not None
        }
    return {"x": data}
