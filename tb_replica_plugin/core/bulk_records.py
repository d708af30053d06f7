"""A local event file's new records framed and decoded in bulk, for `event_files.RunTail`.

A writer's records of one tag are byte for byte alike but for the event's wall time, its step
and the tensor's bytes (TensorFlow's writer repeats the tag's metadata in each), as long as the
step takes as many varint bytes: a record parsed by protobuf is the *template* of every record
of the same length that differs from it only there. Those are decoded together by numpy (steps
from their varint bytes, values as one array); the others (strings, several values in one event,
a first value whose metadata the next ones lack, the file's version record) are parsed one by
one. A template is used only once a copy with other step and tensor bytes, parsed by protobuf,
reads back as that step and those bytes with the same tag and metadata.

Records are framed from their length (a record not whole yet is left for the next read); their
checksums are not verified (a corrupt length or event ends the read there, as TensorBoard's
reader does on a checksum error: read again at the next look).
"""

import dataclasses
import struct

import numpy as np

# A record: uint64 length, uint32 masked CRC of the length, the data, uint32 masked CRC of it.
HEADER = 12
FOOTER = 4
_LENGTH = struct.Struct("<Q")
# Records of one length parsed as templates before the rest of them are parsed one by one.
MAX_TEMPLATES = 16
# The first bytes of an event: field 1 (wall_time, fixed64), then field 2 (step, varint).
_WALL_TIME_KEY = 0x09
_STEP_KEY = 0x10
# Steps of at most this many varint bytes are decoded in bulk (below 2**63: no sign to extend).
_MAX_STEP_BYTES = 9


def frame(data):
    """The complete records at the start of `data`.

    Returns:
      `(starts, lengths, end)`: int64 arrays of each record's data offset and length, and the
      offset after the last complete record (where the next read starts).
    """
    unpack = _LENGTH.unpack_from
    starts, lengths = [], []
    position, size = 0, len(data)
    while position + HEADER <= size:
        (length,) = unpack(data, position)
        end = position + HEADER + length + FOOTER
        if end > size:
            break
        starts.append(position + HEADER)
        lengths.append(length)
        position = end
    return np.array(starts, np.int64), np.array(lengths, np.int64), position


def record_size(data):
    """The whole size of the record whose header starts `data` (None: no whole header)."""
    if len(data) < HEADER:
        return None
    return HEADER + _LENGTH.unpack_from(data, 0)[0] + FOOTER


@dataclasses.dataclass
class Template:
    """What the records of one tag and length share, from one record parsed by protobuf.

    Attributes:
      tag: the summary value's tag.
      fixed: bool [length], the bytes every record of the template has as `data` has them.
      data: uint8 [length], the template record.
      step_span: `(start, stop)` of the step's varint bytes, or None (no step field: step 0).
      content_span: `(start, stop)` of the tensor's bytes.
      dtype, shape: the tensor's numpy dtype and dimensions.
      metadata: the value's `SummaryMetadata`, or None.
      wall_time: the template record's.
    """

    tag: str
    fixed: np.ndarray
    data: np.ndarray
    step_span: tuple
    content_span: tuple
    dtype: np.dtype
    shape: tuple
    metadata: object = None
    wall_time: float = 0.0

    def matches(self, rows):
        """bool [n]: which records `rows` (uint8 [n, length]) this template decodes."""
        same = (rows[:, self.fixed] == self.data[self.fixed]).all(axis=1)
        if self.step_span is not None:
            varint = rows[:, slice(*self.step_span)]
            same &= (varint[:, :-1] >= 0x80).all(axis=1) & (varint[:, -1] < 0x80)
        return same

    def steps(self, rows):
        """int64 [n]: the steps of records `rows` that match."""
        if self.step_span is None:
            return np.zeros(len(rows), np.int64)
        varint = rows[:, slice(*self.step_span)].astype(np.int64) & 0x7F
        return (varint << (7 * np.arange(varint.shape[1], dtype=np.int64))).sum(axis=1)

    def values(self, rows):
        """Read-only `dtype` [n, *shape]: the tensors of records `rows` that match."""
        content = np.ascontiguousarray(rows[:, slice(*self.content_span)])
        values = content.view(self.dtype).reshape(len(rows), *self.shape)
        values.flags.writeable = False
        return values


def template(record, event, layout, parse):
    """The `Template` of `record` (bytes, parsed as `event`), or None when records like it
    cannot be decoded in bulk: not one tensor value with `tensor_content`, a step of more than
    `_MAX_STEP_BYTES` varint bytes, or a copy that does not read back.

    Args:
      layout: `(numpy dtype, dimensions)` of a `TensorProto`.
      parse: bytes -> `Event` (protobuf's parser).
    """
    values = event.summary.value
    if len(values) != 1 or not values[0].HasField("tensor"):
        return None
    content = values[0].tensor.tensor_content
    start = record.find(content) if content else -1
    if start < 0:
        return None
    data = np.frombuffer(record, np.uint8)
    fixed = np.ones(len(data), bool)
    content_span = (start, start + len(content))
    fixed[slice(*content_span)] = False
    position = 0
    if data[0] == _WALL_TIME_KEY:
        fixed[1:9] = False
        position = 9
    step_span = None
    if position < len(data) and data[position] == _STEP_KEY:
        stop = position + 1
        while stop < len(data) and data[stop] >= 0x80:
            stop += 1
        step_span = (position + 1, stop + 1)
        if step_span[1] - step_span[0] > _MAX_STEP_BYTES:
            return None
        fixed[slice(*step_span)] = False
    dtype, shape = layout(values[0].tensor)
    metadata = values[0].metadata if values[0].HasField("metadata") else None
    found = Template(
        values[0].tag, fixed, data, step_span, content_span, dtype, shape, metadata, event.wall_time
    )
    return found if _reads_back(found, parse) else None


def _reads_back(found, parse):
    """Whether a copy of the template with other step and tensor bytes (and wall time) parses
    as the template's tag with those: the bytes it leaves free are those fields' alone."""
    copy = found.data.copy()
    copy[~found.fixed] ^= 0x55  # other wall time and tensor bytes
    if found.step_span is not None:
        start, stop = found.step_span
        copy[start : stop - 1] = 0x81 + (np.arange(stop - 1 - start) % 0x7E)
        copy[stop - 1] = 0x3A
    try:
        event = parse(copy.tobytes())
    except Exception:  # noqa: BLE001 - the protobuf runtime's DecodeError: not a template
        return False
    values = event.summary.value
    metadata = values[0].metadata if values and values[0].HasField("metadata") else None
    return (
        len(values) == 1
        and values[0].tag == found.tag
        and metadata == found.metadata
        and values[0].tensor.tensor_content == copy[slice(*found.content_span)].tobytes()
        and event.step == int(found.steps(copy[None, :])[0])
    )


def rows_of(data, starts, length):
    """uint8 [n, length]: the records of one length starting at `starts` in `data` (bytes;
    joined slices: a fancy index would build `length` int64 indices per record)."""
    joined = b"".join([data[start : start + length] for start in starts.tolist()])
    return np.frombuffer(joined, np.uint8).reshape(len(starts), length)


def bulk_groups(data, starts, lengths, layout, parse, known=None):
    """Splits records into those decoded in bulk and the rest.

    Args:
      data: the file's bytes read.
      starts, lengths: `frame`'s.
      layout, parse: see `template`.
      known: `{length: [Template]}` of the file's earlier reads, tried first and added to
        (a tail of a few steps per look then parses no template).

    Returns:
      `(groups, rest)`: `[(template, record numbers, rows)]` and the record numbers parsed one by
      one (both ascending within).
    """
    known = {} if known is None else known
    groups, rest = [], []
    for length in np.unique(lengths).tolist():
        numbers = np.flatnonzero(lengths == length)
        rows = rows_of(data, starts[numbers], length)
        templates = known.setdefault(length, [])
        for found in templates:
            numbers, rows = _take(found, numbers, rows, groups)
        for _ in range(MAX_TEMPLATES - len(templates)):
            if not numbers.size:
                break
            first = rows[0].tobytes()
            try:
                found = template(first, parse(first), layout, parse)
            except Exception:  # noqa: BLE001 - a corrupt record: parsed (and stopped at) alone
                found = None
            if found is None:
                rest.append(numbers[:1])
                numbers, rows = numbers[1:], rows[1:]
                continue
            templates.append(found)
            numbers, rows = _take(found, numbers, rows, groups)
        rest.append(numbers)
    rest = np.sort(np.concatenate(rest)) if rest else np.zeros(0, np.int64)
    return groups, rest


def _take(found, numbers, rows, groups):
    """Adds the records `found` decodes to `groups`; returns the others."""
    if not numbers.size:
        return numbers, rows
    match = found.matches(rows)
    if match.any():
        groups.append((found, numbers[match], rows[match]))
    return numbers[~match], rows[~match]
