"""A local event file's new records framed and decoded in bulk, for `event_files.RunTail`.

A writer's records of one tag are byte for byte alike but for the event's wall time, its step
and the tensor's bytes (TensorFlow's writer repeats the tag's metadata in each), as long as the
step takes as many varint bytes: a record parsed by protobuf is the *template* of every record
of the same length that differs from it only there. Those are decoded together by numpy (steps
from their varint bytes, values as one array); the others (strings, several values in one event,
a first value whose metadata the next ones lack, the file's version record) are parsed one by
one. A template is used only once a copy with other step and tensor bytes, parsed by protobuf,
reads back as that step and those bytes with the same tag and metadata.

Records are framed from their length (a record not whole yet is left for the next read), then
their checksums are verified as TensorFlow's record reader does (`checked`): the masked CRC-32C
of each length and of each record's data, all at once by one CRC pass over the read (linearity
of the CRC), one record at a time only where that pass fails. A record whose data fails is
skipped; a length that fails makes the records framed from it unknowable, so the read goes on
from the next header whose CRC holds. Without google-crc32c's C implementation nothing is
verified.
"""

import dataclasses
import functools
import struct

import numpy as np

try:
    import google_crc32c
except ImportError:  # declared in setup.py; a broken install reads unverified, as before
    google_crc32c = None

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
# `frame`: records framed one by one before a repeating pattern of lengths is looked for in
# them, and the longest pattern looked for (a step's records, with tags logged every few steps).
_PATTERN_RECORDS = 256
_MAX_PERIOD = 128
# Odd records in a row between a pattern's records before it is looked for again.
_MAX_ODD = 4
# Periods predicted at first after a pattern is found or resumed (twice as many after each
# batch that held: a file read whole costs a few batches, one with odd records few records).
_FIRST_PERIODS = 16


def frame(data):
    """The complete records at the start of `data` (bytes-like).

    A writer's records repeat: each step writes its tags' records, of the same lengths but when
    a step's varint grows or another record (a status event, a heartbeat) comes between. Records
    are framed one by one from their lengths until the lengths of the last `_PATTERN_RECORDS`
    repeat with a period (at most `_MAX_PERIOD` records); the records after are then predicted
    from that pattern and kept as far as the length read at each predicted offset is the one
    predicted (which makes each offset the one framing one by one gives), an odd record between
    them framed alone (up to `_MAX_ODD` in a row) before the pattern is tried again from where
    it stopped.

    Returns:
      `(starts, lengths, end)`: int64 arrays of each record's data offset and length, and the
      offset after the last complete record (where the next read starts).
    """
    buffer = np.frombuffer(data, np.uint8)
    starts, lengths = [], []
    position, pattern, each, misses, periods = 0, None, _PATTERN_RECORDS, 0, _FIRST_PERIODS
    while True:
        if pattern is None:
            found, sizes, position = _frame_each(data, position, each)
            starts.append(found)
            lengths.append(sizes)
            if len(found) < each:
                break  # the end of the complete records
            pattern = _period(sizes)
            each = _PATTERN_RECORDS if pattern is not None else min(2 * each, 1 << 16)
            continue
        found, sizes, position, next_pattern = _predicted(buffer, position, pattern, periods)
        starts.append(found)
        lengths.append(sizes)
        if next_pattern is pattern:  # every period predicted held: predict twice as many
            periods *= 2
            continue
        pattern, periods = next_pattern, _FIRST_PERIODS
        misses = 0 if len(found) else misses + 1
        if pattern is None or misses >= _MAX_ODD:
            pattern = None  # the rest (less than a period) or a new layout: one by one
            continue
        found, sizes, position = _frame_each(data, position, 1)  # the odd record
        starts.append(found)
        lengths.append(sizes)
        if not len(found):
            break
    return np.concatenate(starts), np.concatenate(lengths), position


def _frame_each(data, position, count):
    """Up to `count` complete records from `position`, framed one by one: `(starts, lengths,
    position after them)`."""
    unpack = _LENGTH.unpack_from
    starts, lengths = [], []
    size = len(data)
    while len(starts) < count and position + HEADER <= size:
        (length,) = unpack(data, position)
        end = position + HEADER + length + FOOTER
        if end > size:
            break
        starts.append(position + HEADER)
        lengths.append(length)
        position = end
    return np.array(starts, np.int64), np.array(lengths, np.int64), position


def _period(lengths):
    """The run of lengths that `lengths` repeat, rotated to come next after them: the shortest
    (at most `_MAX_PERIOD`) they repeat throughout, else the shortest their last ones repeat
    (4 periods, 32 records at least); None without one."""
    n = len(lengths)
    longest = min(_MAX_PERIOD, n // 2)
    if longest < 1:
        return None
    # Row p of `shifted` is `lengths` moved p places on (-1 before them): each record against
    # the one p before it, every p at once.
    padded = np.concatenate([np.full(longest, -1, np.int64), lengths])
    shifted = np.lib.stride_tricks.sliding_window_view(padded, n)[longest::-1]
    differs = shifted != lengths
    last_different = n - 1 - np.argmax(differs[:, ::-1], axis=1)  # each row's is >= p - 1
    periods = np.arange(longest + 1)
    tails = np.maximum(4 * periods, 32)
    for held in (last_different == periods - 1, last_different < n - tails + periods):
        found = np.flatnonzero(held[1:])
        if found.size:
            return lengths[n - 1 - int(found[0]) :]
    return None


def _predicted(buffer, position, pattern, most):
    """The records from `position` as far as they follow `pattern` (lengths, the next first),
    in whole periods (at most `most`) within `buffer`.

    Returns:
      `(starts, lengths, position after them, pattern)`: `pattern` itself when all `most`
      periods held, rotated to the record expected next where one did not, None when the
      periods reached the end of `buffer`.
    """
    sizes = pattern + HEADER + FOOTER
    fit = (len(buffer) - position) // int(sizes.sum())
    periods = min(fit, most)
    if periods < 1:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), position, None
    expected = np.tile(pattern, periods)
    offsets = np.empty(len(expected), np.int64)
    offsets[0] = position
    np.cumsum(np.tile(sizes, periods)[:-1], out=offsets[1:])
    offsets[1:] += position
    headers = np.lib.stride_tricks.sliding_window_view(buffer, 8)[offsets]
    wrong = np.flatnonzero(headers.view("<i8").ravel() != expected)
    if not wrong.size:
        end = int(offsets[-1] + sizes[-1])
        return offsets + HEADER, expected, end, (pattern if periods < fit else None)
    kept = int(wrong[0])
    rotated = np.roll(pattern, -(kept % len(pattern)))
    return offsets[:kept] + HEADER, expected[:kept], int(offsets[kept]), rotated


# The CRC-32C, continued from a finished CRC (`extend(crc, data)`), when its C implementation
# is there (the pure-Python one would take minutes over a job's files), else None.
_EXTEND = (
    google_crc32c.extend
    if google_crc32c is not None and google_crc32c.implementation == "c"
    else None
)
_ALL_ONES = 0xFFFFFFFF
_MASK_DELTA = 0xA282EAD8
# `_footer_terms`' table: the term of length n at n, where `_terms_known[n]`; lengths of
# `_MAX_TABLE` or more are not kept.
_MAX_TABLE = 1 << 20
_terms_table = np.zeros(0, "u4")
_terms_known = np.zeros(0, bool)


def masked_crc(data):
    """TensorFlow's masked CRC-32C of `data` (bytes, or a read-only uint8 array).

    Returns:
      The CRC-32C rotated right by 15 bits plus 0xa282ead8, mod 2**32 (an int).
    """
    crc = _EXTEND(0, data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _ALL_ONES


def _raw_crc(data):
    """The CRC-32C of `data` without its initial and final inversion: linear in the bytes, 0
    for zeros, and 0 for a message followed by its own (little-endian) raw CRC."""
    return _EXTEND(_ALL_ONES, data) ^ _ALL_ONES


def _footer_terms(lengths):
    """uint32 [n]: for a record of each of `lengths` (int64 [n]) with the right header, what
    its data's unmasked CRC is xored with to give the raw CRC (`_raw_crc`) of its header and
    data: the CRC-32C of as many zeros (the data's raw CRC) xor the raw CRC of the header then
    as many zeros (linearity). From a table of the lengths met so far (a writer's records have
    few; the longest, rare, are not kept)."""
    global _terms_table, _terms_known
    if lengths.size and int(lengths.max()) >= len(_terms_table):
        size = int(lengths.max()) + 1
        if size > _MAX_TABLE:
            return np.array([_footer_term(n) for n in lengths.tolist()], np.uint32)
        _terms_table = np.concatenate([_terms_table, np.zeros(size - len(_terms_table), "u4")])
        _terms_known = np.concatenate([_terms_known, np.zeros(size - len(_terms_known), bool)])
    missing = ~_terms_known[lengths]
    if missing.any():
        for length in np.unique(lengths[missing]).tolist():
            _terms_table[length] = _footer_term(length)
            _terms_known[length] = True
    return _terms_table[lengths]


def _footer_term(length):
    """`_footer_terms` of one length."""
    size = _LENGTH.pack(length)
    header = size + struct.pack("<I", masked_crc(size))
    return _EXTEND(0, bytes(length)) ^ _raw_crc(header + bytes(length))


def _read_only(array):
    """A read-only view of a uint8 array (google-crc32c takes those without a copy)."""
    view = array.view()
    view.flags.writeable = False
    return view


def _all_intact(buffer, starts, lengths):
    """Whether every record's length CRC and data CRC hold, by one CRC pass.

    A record's header is determined by its length (framed from it): when its length CRC holds,
    the raw CRC (`_raw_crc`) of its header and data is the raw CRC its data's stored CRC stands
    for xor a term of its length (`_footer_terms`). Each data CRC is replaced in place by that
    raw CRC: a record then has a raw CRC of 0 exactly when both its CRCs hold (a message
    followed by its own raw CRC has a raw CRC of 0), and the raw CRC of back-to-back records is
    the xor of each one's shifted by the bytes after it (a bijection): 0 when every record
    holds, not 0 when one does not (several failing records cancel with probability 2**-32).
    The stored bytes are put back after.

    Args:
      buffer: writable uint8 array of the read; starts, lengths: `frame`'s (at least one).
    """
    first = int(starts[0]) - HEADER
    span = buffer[first : int(starts[-1] + lengths[-1]) + FOOTER]
    at = starts + lengths - first  # each data CRC's offset in the span
    # The span as 4-byte words from each of its first 4 offsets: a CRC at offset k is word
    # k // 4 of the view from k % 4 (unaligned views, indexed by whole words).
    views = [span[r : r + (len(span) - r) // 4 * 4].view("<u4") for r in range(4)]
    residue = at & 3
    parts = [np.flatnonzero(residue == r) for r in range(4)]
    words = [at[part] >> 2 for part in parts]
    stored = [view[word] for view, word in zip(views, words, strict=True)]
    try:
        for view, part, word, masked in zip(views, parts, words, stored, strict=True):
            rotated = masked - np.uint32(_MASK_DELTA)
            unmasked = (rotated << np.uint32(15)) | (rotated >> np.uint32(17))
            view[word] = unmasked ^ _footer_terms(lengths[part])
        return _raw_crc(_read_only(span)) == 0
    finally:
        for view, word, masked in zip(views, words, stored, strict=True):
            view[word] = masked


def _header_holds(buffer, position):
    """Whether the record header at `position` of `buffer` (12 bytes there) has its length's
    masked CRC."""
    stored = int(buffer[position + 8 : position + HEADER].view("<u4")[0])
    return masked_crc(_read_only(buffer[position : position + 8])) == stored


def _data_holds(buffer, start, length):
    """Whether the data at `start` (`length` bytes, its CRC after them) has its masked CRC."""
    stored = int(buffer[start + length : start + length + FOOTER].view("<u4")[0])
    return masked_crc(_read_only(buffer[start : start + length])) == stored


def _next_header(buffer, position):
    """The first offset from `position` on where a header whose length CRC holds starts, else
    where a header could still begin (11 bytes before the end): a corrupt length's records are
    skipped to there. Offsets whose length is 2**32 or more (4 zero high bytes) are not tried."""
    words = np.lib.stride_tricks.sliding_window_view(buffer[position:], HEADER)
    candidates = np.flatnonzero((words[:, 4:8] == 0).all(axis=1))
    for offset in candidates.tolist():
        if _header_holds(buffer, position + offset):
            return position + offset
    return max(position, len(buffer) - HEADER + 1)


def checked(data, starts, lengths, end):
    """The framed records whose CRCs hold, as TensorFlow's reader checks them.

    Args:
      data: the read's bytes; starts, lengths, end: `frame`'s.

    Returns:
      `(starts, lengths, end, skipped)`: the records whose length and data CRCs hold, the
      offset the next read starts at, and the offsets of the records skipped: those whose data
      CRC fails, and a record whose length CRC fails (the records framed from that length are
      dropped and `end` is the next header whose CRC holds). Unchanged (none skipped) without
      google-crc32c's C implementation.
    """
    if _EXTEND is None:
        return starts, lengths, end, []
    buffer = np.frombuffer(data, np.uint8)
    if not buffer.flags.writeable:
        buffer = buffer.copy()
    skipped = []
    if starts.size and not _all_intact(buffer, starts, lengths):
        heads = [_header_holds(buffer, s - HEADER) for s in starts.tolist()]
        if False in heads:  # a corrupt length: what was framed from it on is not records
            cut = heads.index(False)
            end = int(starts[cut]) - HEADER
            starts, lengths = starts[:cut], lengths[:cut]
        pairs = zip(starts.tolist(), lengths.tolist(), strict=True)
        keep = np.array([_data_holds(buffer, s, n) for s, n in pairs], bool)
        skipped = (starts[~keep] - HEADER).tolist()
        starts, lengths = starts[keep], lengths[keep]
    if end + HEADER <= len(buffer) and not _header_holds(buffer, end):
        skipped.append(end)
        end = _next_header(buffer, end + 1)
    return starts, lengths, end, skipped


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

    @functools.cached_property
    def fixed_spans(self):
        """`[(start, stop)]` of the runs of bytes in `fixed`."""
        return _spans(self.fixed)

    def matches(self, rows):
        """bool [n]: which records `rows` (`Rows`, or uint8 [n, length]) this template
        decodes."""
        same = np.ones(len(rows), bool)
        for start, stop in self.fixed_spans:
            same &= (rows[:, start:stop] == self.data[start:stop]).all(axis=1)
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


def joined_values(data, groups):
    """The records of one tag decoded by several templates (`bulk_groups`' groups), as one
    part: their values copied once from the read's bytes, in record order.

    A tag's records come in groups of one length each (its step's varint grows a byte at 128
    and 16,384): each group's `Template.values`, then joined, copied the values twice.

    Args:
      data: the read's bytes (those the groups' `Rows` are over).
      groups: `[(template, record numbers, Rows)]` of one tag, the templates of one dtype and
        value shape.

    Returns:
      `(numbers, steps, values)`: int64 [n] ascending, int64 [n], and read-only dtype
      [n, *shape].
    """
    numbers = np.concatenate([numbers for _, numbers, _ in groups])
    steps = np.concatenate([found.steps(rows) for found, _, rows in groups])
    at = np.concatenate([rows.starts + found.content_span[0] for found, _, rows in groups])
    if (numbers[1:] < numbers[:-1]).any():
        order = np.argsort(numbers, kind="stable")
        numbers, steps, at = numbers[order], steps[order], at[order]
    first = groups[0][0]
    width = first.content_span[1] - first.content_span[0]
    windows = np.lib.stride_tricks.sliding_window_view(np.frombuffer(data, np.uint8), width)
    values = windows[at].view(first.dtype).reshape(len(at), *first.shape)
    values.flags.writeable = False
    return numbers, steps, values


def _spans(mask):
    """`[(start, stop)]` of the runs of True in bool [n] `mask`."""
    edges = np.flatnonzero(np.diff(np.concatenate([[False], mask, [False]]).astype(np.int8)))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


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


class Rows:
    """The records of one length in a read's bytes, as rows `[n, length]` whose bytes are
    copied only where asked: `rows[:, a:b]` copies those bytes of every row (a window view
    over the read, indexed by the rows' starts: no index per byte), `rows[i]` selects rows.
    Valid while the read's bytes are (`event_files._read_at`'s buffer: one read).

    Example:
      >>> Rows(b"xxabcdabce", np.array([2, 6]), 3)[:, 1:3].tolist()
      [[98, 99], [98, 99]]
    """

    __slots__ = ("windows", "starts")

    def __init__(self, data, starts, length=None):
        """Args:
        data: bytes-like, or the window view of another `Rows` (then `length` is None).
        starts: int64 [n], where each row starts in `data`.
        length: the rows' length.
        """
        if length is not None:
            data = np.lib.stride_tricks.sliding_window_view(np.frombuffer(data, np.uint8), length)
        self.windows = data
        self.starts = starts

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, index):
        if isinstance(index, tuple):
            rows, columns = index
            return self.windows[self.starts[rows], columns]
        return Rows(self.windows, self.starts[index])

    def first(self):
        """The first row's bytes."""
        return self.windows[self.starts[0]].tobytes()


def bulk_groups(data, starts, lengths, layout, parse, known=None):
    """Splits records into those decoded in bulk and the rest.

    Args:
      data: the file's bytes read.
      starts, lengths: `frame`'s.
      layout, parse: see `template`.
      known: `{length: [Template]}` of the file's earlier reads, tried first and added to
        (a tail of a few steps per look then parses no template).

    Returns:
      `(groups, rest)`: `[(template, record numbers, Rows)]` and the record numbers parsed one
      by one (both ascending within).
    """
    known = {} if known is None else known
    groups, rest = [], []
    for length in np.unique(lengths).tolist():
        numbers = np.flatnonzero(lengths == length)
        rows = Rows(data, starts[numbers], length)
        templates = known.setdefault(length, [])
        for found in templates:
            numbers, rows = _take(found, numbers, rows, groups)
        for _ in range(MAX_TEMPLATES - len(templates)):
            if not numbers.size:
                break
            first = rows.first()
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
    if match.all():  # the usual case
        groups.append((found, numbers, rows))
        return numbers[:0], rows[:0]
    if match.any():
        groups.append((found, numbers[match], rows[match]))
    return numbers[~match], rows[~match]
