"""Request arguments of the plugin routes.

Each family's `present.ARGS` maps argument names to these parsers. A malformed argument raises
TensorBoard's own `tensorboard.errors.InvalidArgumentError`, and what a route cannot find its
`NotFoundError`: TensorBoard's application answers them with 400 and 404 and their message as
plain text. No TensorFlow.
"""

from tensorboard import errors

from tb_replica_plugin.core.downsample import DEFAULT_MAX_POINTS, MAX_POINTS_RANGE


class Download:
    """A route body that is a file to download rather than JSON (e.g. a captured batch).

    Attributes:
      data: the bytes; filename: the name offered to the browser; content_type: its MIME type.
    """

    def __init__(self, data, filename, content_type="application/octet-stream"):
        self.data = data
        self.filename = filename
        self.content_type = content_type


def parse_int(name, raw, default, bounds=None):
    """An integer query argument: `default` when absent.

    Raises:
      errors.InvalidArgumentError: if it is not an integer, or outside `bounds` (inclusive)
        when given.
    """
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidArgumentError(f"{name} must be an integer, got {raw!r}") from None
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise errors.InvalidArgumentError(
            f"{name} must be between {bounds[0]} and {bounds[1]}, got {value}"
        )
    return value


def parse_optional_int(name):
    """A parser of an optional integer argument `name` (absent or empty: None).

    Raises (the parser):
      errors.InvalidArgumentError: if the argument is not an integer.
    """
    return lambda raw: None if raw in (None, "") else parse_int(name, raw, None)


def parse_step(raw):
    """Parses the optional `step` argument (an integer; empty means absent).

    Raises:
      errors.InvalidArgumentError: if it is not an integer.
    """
    return None if raw == "" else parse_int("step", raw, None)


def parse_max_points(raw):
    """Parses the `max_points` argument.

    Raises:
      errors.InvalidArgumentError: if it is not an integer in `MAX_POINTS_RANGE`.
    """
    return parse_int("max_points", raw, DEFAULT_MAX_POINTS, MAX_POINTS_RANGE)


# Blocks per side of a match matrix (`matrix_side`), or of the replicas of per-replica values
# (`replica_blocks`).
BLOCKS_RANGE = (2, 100_000)


def parse_matrix_side(raw):
    """Parses the optional `matrix_side` argument of `/rng` and `/data` (absent: None).

    Raises:
      errors.InvalidArgumentError: if it is not an integer in `BLOCKS_RANGE`.
    """
    return parse_int("matrix_side", raw, None, BLOCKS_RANGE)


def parse_replica_blocks(raw):
    """Parses the optional `replica_blocks` argument (absent: None).

    Raises:
      errors.InvalidArgumentError: if it is not an integer in `BLOCKS_RANGE`.
    """
    return parse_int("replica_blocks", raw, None, BLOCKS_RANGE)
