"""One tag's samples as arrays: what a bulk read gives, and how the families take samples.

A tag's samples are `[(step, numpy value)]`. A local file's records of one tag decoded in bulk
(`bulk_records`) are already two arrays, its steps and its values stacked: a `Column` keeps them
so (it is a sequence of `(step, value)` too), and `by_shape` hands a family the samples of each
value shape stacked, from a `Column` without a loop over its samples, from a list with one.

No TensorFlow import.
"""

import collections.abc
import dataclasses

import numpy as np


class Column(collections.abc.Sequence):
    """A tag's samples `[(step, value)]` held as `steps` (int64 [n]) and `values` ([n, *shape],
    read-only): the same sequence of `(int step, value)` (0-d arrays for scalars).

    Example:
      >>> column = Column(np.array([3, 4]), np.array([[1.0, 2.0], [3.0, 4.0]]))
      >>> column[1]
      (4, array([3., 4.]))
    """

    __slots__ = ("steps", "values")

    def __init__(self, steps, values):
        self.steps = np.asarray(steps, np.int64)
        self.values = values
        if len(self.steps) != len(values):
            raise ValueError(f"{len(self.steps)} steps for {len(values)} values")

    def __len__(self):
        return len(self.steps)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Column(self.steps[index], self.values[index])
        return int(self.steps[index]), self._row(index)

    def __iter__(self):
        return zip(self.steps.tolist(), self.rows(), strict=True)

    def __repr__(self):
        return f"Column({len(self)} samples of {self.values.dtype} {self.values.shape[1:]})"

    def rows(self):
        """The values, one array each (a 0-d view for a scalar)."""
        return value_rows(self.values)

    def _row(self, index):
        if self.values.ndim > 1:
            return self.values[index]
        index = range(len(self.values))[index]
        return self.values[index : index + 1].reshape(())

    def by_step(self):
        """The column in step order (itself when it is; a stable sort, as `sorted` by step)."""
        if len(self.steps) < 2 or (self.steps[1:] >= self.steps[:-1]).all():
            return self
        order = np.argsort(self.steps, kind="stable")
        return Column(self.steps[order], self.values[order])


def joined(first, second):
    """`first` then `second` (samples of one tag): a `Column` when both are of one dtype and
    value shape, else a list."""
    if (
        isinstance(first, Column)
        and isinstance(second, Column)
        and one_layout([first.values, second.values])
    ):
        values = np.concatenate([first.values, second.values])
        values.flags.writeable = False
        return Column(np.concatenate([first.steps, second.steps]), values)
    return [*first, *second]


def value_rows(values):
    """`values` ([n, *shape]) one array each: views of its rows, 0-d for scalars."""
    if values.ndim > 1:
        return list(values)
    return [values[i : i + 1].reshape(()) for i in range(len(values))]


def one_layout(arrays):
    """Whether `arrays` ([n, *shape] each) are all of one dtype and row shape."""
    return len({(array.dtype, array.shape[1:]) for array in arrays}) == 1


def steps_of(points):
    """int64 [n]: the steps of a tag's samples (a list or a `Column`)."""
    if isinstance(points, Column):
        return points.steps
    return np.array([point[0] for point in points], np.int64)


def by_step(points):
    """A tag's samples in step order (stable): a `Column` stays one, others a sorted list."""
    if isinstance(points, Column):
        return points.by_step()
    return sorted(points, key=lambda point: point[0])


@dataclasses.dataclass
class Shaped:
    """A tag's samples whose values have one shape, in the order they came.

    Attributes:
      shape: the values' shape.
      positions: int64 [k], where each sample is in the tag's samples.
      steps: int64 [k].
      values: [k, *shape] of the dtype asked for (their own when None).
    """

    shape: tuple
    positions: np.ndarray
    steps: np.ndarray
    values: np.ndarray

    def __len__(self):
        return len(self.steps)


def by_shape(points, dtype=None):
    """A tag's samples grouped by their value's shape: `[Shaped]`, the group of the last sample
    last (none without samples).

    Args:
      points: `[(step, value)]` or a `Column`.
      dtype: the values' numpy dtype in the groups (None: as they are; a list's values of
        different dtypes are then promoted within a group, as `np.stack` does).

    Example:
      >>> [g.shape for g in by_shape([(1, np.zeros(2)), (2, np.zeros(3)), (3, np.zeros(2))])]
      [(3,), (2,)]
    """
    if isinstance(points, Column):
        if not len(points):
            return []
        values = points.values if dtype is None else points.values.astype(dtype, copy=False)
        positions = np.arange(len(points), dtype=np.int64)
        return [Shaped(points.values.shape[1:], positions, points.steps, values)]
    groups = {}
    for position, (step, value) in enumerate(points):
        value = np.asarray(value)
        group = groups.get(value.shape)
        if group is None:
            group = groups[value.shape] = ([], [], [])
        group[0].append(position)
        group[1].append(step)
        group[2].append(value)
    shaped = [
        Shaped(shape, np.array(at, np.int64), np.array(s, np.int64), _as(np.stack(v), dtype))
        for shape, (at, s, v) in groups.items()
    ]
    return sorted(shaped, key=lambda group: group.positions[-1])


def _as(values, dtype):
    """`values` as `dtype` where they convert (strings that are no numbers stay as they are)."""
    if dtype is None:
        return values
    try:
        return values.astype(dtype, copy=False)
    except (ValueError, TypeError):
        return values


def last_per_step(steps, values):
    """`(steps, values)` in step order with one sample per step: the last one given.

    Example:
      >>> last_per_step(np.array([2, 1, 2]), np.array([10, 20, 30]))
      (array([1, 2]), array([20, 30]))
    """
    if len(steps) < 2 or (steps[1:] > steps[:-1]).all():
        return steps, values
    order = np.argsort(steps, kind="stable")
    steps, values = steps[order], values[order]
    last = np.ones(len(steps), bool)
    last[:-1] = steps[1:] != steps[:-1]
    return steps[last], values[last]
