"""The leaf entries of a shapes event (one per input or watched leaf: its name, and per replica
its dtype, shape and, for a ragged or sparse leaf, its kind and structure), as the inputs and
watch families' readers parse them. No TensorFlow.
"""


def mismatch_dims(dtypes, shapes, kinds=None):
    """Which parts of one input disagree across replicas ("kind", "dtype", "rank", dim indices).

    A ragged dimension is recorded as -1 on every replica (`families.inputs.record.shape_vector`),
    so ragged leaves disagree only in their structure (kind, ragged rank, uniform inner
    dimensions).
    """
    dims = []
    if kinds and len(set(kinds)) > 1:
        dims.append("kind")
    if len(set(dtypes)) > 1:
        dims.append("dtype")
    ranks = {len(shape) for shape in shapes}
    if len(ranks) > 1:
        dims.append("rank")
    else:
        rank = ranks.pop() if ranks else 0
        dims.extend(d for d in range(1, rank) if len({shape[d] for shape in shapes}) > 1)
    return dims


def parse_leaf_entries(entries):
    """Parses the leaf entries of a shapes event (`name`, `dtypes`, `shapes`, for a ragged or
    sparse leaf `kinds` and `structure`), adding `mismatch` and `mismatch_dims`.

    Raises:
      KeyError, TypeError, ValueError: if an entry is malformed.
    """
    inputs = []
    for entry in entries:
        dtypes = [str(d) for d in entry["dtypes"]]
        shapes = [[int(d) for d in shape] for shape in entry["shapes"]]
        kinds = [str(k) for k in entry["kinds"]] if "kinds" in entry else None
        dims = mismatch_dims(dtypes, shapes, kinds)
        parsed_entry = {
            "name": str(entry["name"]),
            "dtypes": dtypes,
            "shapes": shapes,
            "mismatch": bool(dims),
            "mismatch_dims": dims,
        }
        if kinds is not None:
            # Ragged or sparse: per replica its kind and (values, shortest row, longest row) or
            # (nnz, -1, -1) at this step.
            parsed_entry["kinds"] = kinds
            parsed_entry["structure"] = [[int(v) for v in row] for row in entry["structure"]]
        inputs.append(parsed_entry)
    return inputs
