"""The batch record engine: where the fields of a run of records lie and whether they check out, all at once.

A run is records at known starts in one buffer (back to back in a commit-log read, or gathered from a
hot store). Every reader that checks or decodes many records (the archiver's batch read, the cold
window check, restore, Spark, the checkers) starts from the same fixed heads and the same length walk,
so the record layout is read in one place. What a caller knows each record must be (topic, queue,
offsets, tag hashes, a body CRC, a final 0x02) is an :class:`Expected`; ``problems`` and
``first_problem`` compare a whole run against it, and ``explain`` says why one flagged record is bad,
through the per-record decoder ``formats.message.verify_record``, so every checker words its errors
from the same findings.
"""

from __future__ import annotations

import bisect
import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tieredstore.errors import CorruptRecordError
from tieredstore.formats.arrays import as_values, gather_rows, head_dtype_with_hosts
from tieredstore.formats.checksum import BODY_CRC_MASK, crc32
from tieredstore.formats.message import (
    BLANK_HEADER,
    HEADER_PREFIX,
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    NAME_VALUE_SEPARATOR,
    POS_BORN_HOST,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    RecordFields,
    tag_hash,
    verify_record,
)

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# The fixed head of a record, through STORETIMESTAMP behind an IPv6 born host (76 bytes; every record is longer).
HEAD_BYTES = POS_BORN_HOST + 20 + 8
HEAD_DTYPE = head_dtype_with_hosts(HEAD_BYTES - POS_BORN_HOST)
assert HEAD_DTYPE.itemsize == HEAD_BYTES


class RecordRun(Protocol):
    """Records in one buffer: ``data``, where each starts (``starts``), its size (``sizes``) and its fixed
    head (``heads``, HEAD_DTYPE; garbage past a record shorter than HEAD_BYTES: check sizes first)."""

    @property
    def data(self) -> bytes | bytearray: ...

    @property
    def starts(self) -> Int64Array: ...

    @property
    def sizes(self) -> Int64Array: ...

    @property
    def heads(self) -> np.ndarray: ...


def gather_heads(data: bytes | bytearray, starts: Int64Array) -> np.ndarray:
    """The fixed heads (HEAD_DTYPE) of the records at ``starts`` of ``data``, one gather for all."""
    return as_values(gather_rows(np.frombuffer(data, dtype=np.uint8), starts, HEAD_BYTES), HEAD_DTYPE)


def store_timestamps_of(heads: np.ndarray) -> Int64Array:
    """Each record's STORETIMESTAMP, which follows a born host of 8 or 20 bytes."""
    hosts = heads["hosts"]
    v6 = (heads["sysflag"] & SYSFLAG_BORNHOST_V6) != 0
    ipv4_stamp = as_values(hosts[:, 8:16], ">i8")
    ipv6_stamp = as_values(hosts[:, 20:28], ">i8")
    return np.where(v6, ipv6_stamp, ipv4_stamp).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the variable parts of each record of a batch are, from its length fields, all records at once.

    Offsets are from each record's start. ``sound`` says the fields add up: BODYLEN, the topic length
    and the properties length each fit, and the properties end exactly where the record ends.
    """

    body_at: Int64Array
    body_length: Int64Array
    topic_at: Int64Array
    topic_length: Int64Array
    properties_at: Int64Array
    properties_length: Int64Array
    sound: BoolArray

    @classmethod
    def of(cls, batch: RecordRun) -> Layout:
        heads = batch.heads
        sizes = batch.sizes
        starts = batch.starts
        flat = np.frombuffer(batch.data, dtype=np.uint8)
        v2 = heads["magic"] == MAGIC_V2
        sysflag = heads["sysflag"]
        born = np.where((sysflag & SYSFLAG_BORNHOST_V6) != 0, 20, 8)
        stored = np.where((sysflag & SYSFLAG_STOREHOST_V6) != 0, 20, 8)
        body_length_at = POS_BORN_HOST + born + 8 + stored + 12
        sound = (sizes >= MIN_RECORD_SIZE) & (body_length_at + 4 <= sizes)
        body_length = as_values(gather_rows(flat, starts + body_length_at, 4), ">i4").astype(np.int64)
        body_at = body_length_at + 4
        sound &= (body_length >= 0) & (body_at + body_length <= sizes)
        topic_length_at = body_at + body_length
        topic_field = np.where(v2, 2, 1)
        sound &= topic_length_at + topic_field <= sizes
        length_bytes = gather_rows(flat, starts + topic_length_at, 2)
        topic_length = np.where(
            v2, as_values(length_bytes, ">i2").astype(np.int64), length_bytes[:, 0].view(np.int8).astype(np.int64)
        )
        topic_at = topic_length_at + topic_field
        sound &= (topic_length >= 0) & (topic_at + topic_length + 2 <= sizes)
        properties_at = topic_at + topic_length + 2
        properties_length = as_values(gather_rows(flat, starts + properties_at - 2, 2), ">i2").astype(np.int64)
        sound &= (properties_length >= 0) & (properties_at + properties_length == sizes)
        return cls(body_at, body_length, topic_at, topic_length, properties_at, properties_length, sound)


@dataclass(frozen=True, slots=True, eq=False)
class PackedRun:
    """A :class:`RecordRun` over any buffer: records at ``starts`` of ``data``, ``sizes`` bytes each."""

    data: bytes | bytearray
    starts: Int64Array
    sizes: Int64Array
    heads: np.ndarray

    @classmethod
    def at(cls, data: bytes | bytearray, starts: npt.ArrayLike, sizes: npt.ArrayLike) -> PackedRun:
        begins = np.asarray(starts, dtype=np.int64)
        return cls(data, begins, np.asarray(sizes, dtype=np.int64), gather_heads(data, begins))

    @classmethod
    def back_to_back(cls, data: bytes | bytearray, sizes: npt.ArrayLike) -> PackedRun:
        lengths = np.asarray(sizes, dtype=np.int64)
        starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        return cls.at(data, starts, lengths)


# Not comparable: its arrays have no single truth value.
@dataclass(frozen=True, slots=True, eq=False)
class Expected:
    """What a caller knows each record of a run must be; a field left None is not checked.

    Every record must lie inside the buffer, be at least a minimal message, hold a message magic and
    a TOTALSIZE equal to its size. ``queue_offsets`` is the first of consecutive offsets or one per
    record; ``physical_offsets`` and ``tag_hashes`` are one per record. Unless ``head_only``, the
    length fields must add up to the size, and ``topic``, ``max_body_length``, ``terminated`` (a
    non-empty property block ends in 0x02, as the writer leaves it), ``tag_hashes`` (the hash of the
    record's TAGS) and ``check_crc`` (the body CRC) are checked too; a head-only check reads nothing
    past the fixed head.
    """

    topic: bytes | None = None
    queue_id: int | None = None
    queue_offsets: int | Int64Array | None = None
    physical_offsets: Int64Array | None = None
    tag_hashes: Int64Array | None = None
    check_crc: bool = True
    terminated: bool = False
    max_body_length: int | None = None
    head_only: bool = False

    def __post_init__(self) -> None:
        walks = self.topic is not None or self.tag_hashes is not None or self.max_body_length is not None
        if self.head_only and (walks or self.check_crc or self.terminated):
            raise ValueError("a head-only check reads no topic, body, properties or tags")

    def queue_offsets_of(self, count: int) -> Int64Array | None:
        """The queue offset each of ``count`` records must hold, or None."""
        offsets = self.queue_offsets
        if offsets is None or not isinstance(offsets, int):
            return offsets
        return np.arange(offsets, offsets + count, dtype=np.int64)


def _first(bad: BoolArray) -> int | None:
    return int(np.argmax(bad)) if bool(bad.any()) else None


def _head_problems(run: RecordRun, expected: Expected) -> BoolArray:
    """The records whose fixed head (or place in the buffer) is not what ``expected`` says."""
    starts, sizes, heads = run.starts, run.sizes, run.heads
    magic = heads["magic"]
    bad: BoolArray = (starts < 0) | (sizes < MIN_RECORD_SIZE) | (starts + sizes > len(run.data))
    bad |= ((magic != MAGIC_V1) & (magic != MAGIC_V2)) | (heads["total_size"] != sizes)
    if expected.queue_id is not None:
        bad |= heads["queue_id"] != expected.queue_id
    offsets = expected.queue_offsets_of(len(sizes))
    if offsets is not None:
        bad |= heads["queue_offset"] != offsets
    if expected.physical_offsets is not None:
        bad |= heads["physical_offset"] != expected.physical_offsets
    return bad


def _layout_problems(run: RecordRun, expected: Expected, bad: BoolArray, layout: Layout | None = None) -> Layout:
    """Marks in ``bad`` the records whose length fields, topic, body length or terminator fail; their layout."""
    layout = Layout.of(run) if layout is None else layout
    bad |= ~layout.sound
    topic = expected.topic
    flat = np.frombuffer(run.data, dtype=np.uint8)
    if topic is not None:
        bad |= layout.topic_length != len(topic)
        if topic:
            # Each record's topic compared as one opaque value: one comparison per record, not one per byte.
            topics = as_values(gather_rows(flat, run.starts + layout.topic_at, len(topic)), f"V{len(topic)}")
            bad |= topics != np.void(topic)
    if expected.max_body_length is not None:
        bad |= layout.body_length > expected.max_body_length
    if expected.terminated and len(flat):
        last_byte = flat[np.clip(run.starts + run.sizes - 1, 0, len(flat) - 1)]
        bad |= (layout.properties_length > 0) & (last_byte != 0x02)
    return layout


def _tag_mismatches(run: RecordRun, layout: Layout, wanted: Int64Array, indexes: Int64Array) -> Int64Array:
    """Which of the records at ``indexes`` (sound ones) have a TAGS whose hash is not ``wanted``'s."""
    mismatched: Int64Array = indexes[tag_hashes_of(run, layout, indexes) != wanted[indexes]]
    return mismatched


def _crc_mismatches(run: RecordRun, layout: Layout, indexes: Int64Array) -> Int64Array:
    """Which of the records at ``indexes`` (sound ones) hold a body CRC that is not their body's."""
    begins = run.starts[indexes] + layout.body_at[indexes]
    ends = begins + layout.body_length[indexes]
    with memoryview(run.data) as view:
        # The mask is applied to all at once: per body, the loop does the slice and the C call only.
        computed = [crc32(view[begin:end]) for begin, end in zip(begins.tolist(), ends.tolist(), strict=True)]
    stored = run.heads["body_crc"][indexes].astype(np.int64)
    mismatched: Int64Array = indexes[(np.array(computed, dtype=np.int64) & BODY_CRC_MASK) != stored]
    return mismatched


def problems(run: RecordRun, expected: Expected) -> BoolArray:
    """Which records of ``run`` are not what ``expected`` says: fixed fields and lengths for all at once,
    then tags and body CRCs of the records that passed."""
    bad = _head_problems(run, expected)
    if expected.head_only:
        return bad
    layout = _layout_problems(run, expected, bad)
    if expected.tag_hashes is not None:
        bad[_tag_mismatches(run, layout, expected.tag_hashes, np.flatnonzero(~bad))] = True
    if expected.check_crc:
        bad[_crc_mismatches(run, layout, np.flatnonzero(~bad))] = True
    return bad


def problem_indexes(run: RecordRun, expected: Expected) -> Int64Array:
    """The indexes of the records ``problems`` flags, in order."""
    return np.flatnonzero(problems(run, expected))


def first_problem(run: RecordRun, expected: Expected, *, layout: Layout | None = None) -> int | None:
    """The index of the first record of ``run`` that is not what ``expected`` says, or None.

    The per-record checks (tags, body CRC) are made only for the records before the first bad fixed
    field, as a reader that stops at the first bad record never serves the rest. A caller that already
    holds the run's ``layout`` (to decode it) passes it in.
    """
    bad = _head_problems(run, expected)
    if not expected.head_only:
        layout = _layout_problems(run, expected, bad, layout)
        first = _first(bad)
        checked = np.arange(len(bad) if first is None else first, dtype=np.int64)
        if expected.tag_hashes is not None:
            mismatched = _tag_mismatches(run, layout, expected.tag_hashes, checked)
            if len(mismatched):
                checked = checked[: int(mismatched[0])]
                bad[int(mismatched[0])] = True
        if expected.check_crc:
            bad[_crc_mismatches(run, layout, checked)] = True
    return _first(bad)


# ---- tags -------------------------------------------------------------------------------------------

_TAGS_MARKER = f"{PROPERTY_TAGS}{NAME_VALUE_SEPARATOR}".encode()
_PAIR_END = PROPERTY_SEPARATOR.encode()


def records_holding(
    run: RecordRun, layout: Layout, markers: Sequence[bytes], indexes: Int64Array | None = None
) -> list[int]:
    """Indexes of the records (of ``indexes``, or all) whose properties contain one of ``markers`` (a record
    whose length fields do not add up is searched whole): one scan over the properties of all of them."""
    begins = np.where(layout.sound, run.starts + layout.properties_at, run.starts)
    lengths = np.where(layout.sound, layout.properties_length, run.sizes)
    searched = np.flatnonzero(lengths > 0) if indexes is None else indexes[lengths[indexes] > 0]
    if not len(searched):
        return []
    begins, lengths = begins[searched], lengths[searched]
    with memoryview(run.data) as view:
        joined = b"".join([view[b : b + n] for b, n in zip(begins.tolist(), lengths.tolist(), strict=True)])
    # Lists, not arrays: a bisect per hit costs a tenth of a numpy call's overhead.
    ends = np.cumsum(lengths).tolist()
    pieces = searched.tolist()
    found: set[int] = set()
    for marker in markers:
        at = joined.find(marker)
        while at >= 0:
            piece = bisect.bisect_right(ends, at)
            found.add(pieces[piece])  # a marker across two pieces only costs a decode
            at = joined.find(marker, max(at + 1, ends[piece]))
    return sorted(found)


def tag_hash_of(properties: bytes) -> int:
    """The tag hash of a record with these properties: its TAGS as ``decode_properties`` gives it (the last
    such pair), hashed; 0 without TAGS."""
    at = properties.rfind(_TAGS_MARKER)
    while at > 0 and properties[at - 1] != 0x02:
        at = properties.rfind(_TAGS_MARKER, 0, at)
    if at < 0:
        return 0
    start = at + len(_TAGS_MARKER)
    end = properties.find(_PAIR_END, start)
    return _stored_tags_hash(properties[start : end if end >= 0 else len(properties)])


@functools.lru_cache(maxsize=4096)
def _stored_tags_hash(tags: bytes) -> int:
    """``tag_hash`` of a TAGS value as stored, remembered: a topic's messages carry few distinct tags, and the
    hash is a loop per character."""
    return tag_hash(tags.decode("utf-8", "replace"))


def tag_hashes_of(run: RecordRun, layout: Layout, indexes: Int64Array) -> Int64Array:
    """The tag hash a writer gives each record at ``indexes`` (sound ones, in order), computed only for those
    whose properties hold TAGS: the rest are 0."""
    hashes = np.zeros(len(indexes), dtype=np.int64)
    holding = records_holding(run, layout, [_TAGS_MARKER], indexes)
    if holding:
        begins = (run.starts + layout.properties_at)[holding].tolist()
        ends = (run.starts + run.sizes)[holding].tolist()
        data = run.data
        computed = [tag_hash_of(bytes(data[begin:end])) for begin, end in zip(begins, ends, strict=True)]
        hashes[np.searchsorted(indexes, holding)] = computed
    return hashes


# ---- one record explained ------------------------------------------------------------------------------


class Fault(enum.StrEnum):
    """What is wrong with one record, in the order ``explain`` looks."""

    SIZE = "size"  # not the bytes expected
    SHORT = "short"  # too few bytes for any message (the per-record decoder's reason)
    MAGIC = "magic"
    TOTAL_SIZE = "total size"  # TOTALSIZE is not the record's size
    LAYOUT = "layout"  # the length fields do not add up (the per-record decoder's reason)
    BODY_CRC = "body crc"
    QUEUE_ID = "queue id"
    QUEUE_OFFSET = "queue offset"
    PHYSICAL_OFFSET = "physical offset"
    TOPIC = "topic"
    BODY_SIZE = "body size"  # longer than the caller takes
    UNTERMINATED = "unterminated"  # properties do not end in 0x02
    TAG_HASH = "tag hash"


@dataclass(frozen=True, slots=True)
class Finding:
    """One fault of a record: what the record holds (``found``), what was expected, and a reason in words;
    a TOPIC fault's topics are ``owner`` (the record's) and ``wanted``, its values their lengths."""

    fault: Fault
    found: int
    expected: int
    reason: str
    owner: bytes = b""
    wanted: bytes = b""


def explain(raw: bytes | memoryview, expected: Expected, index: int = 0, *, size: int | None = None) -> list[Finding]:
    """Every fault of the one record ``raw`` against ``expected`` (as its record ``index``); empty when it is sound.

    ``size`` is the size expected (default ``len(raw)``). A fault of the size, magic, TOTALSIZE or
    length fields is the only one given (nothing past it can be read); the others are all listed, in
    ``Fault`` order. The length walk is the per-record decoder's (``verify_record``), and a LAYOUT or
    SHORT reason is its error's reason.
    """
    want = len(raw) if size is None else size
    if len(raw) != want:
        return [Finding(Fault.SIZE, len(raw), want, f"{len(raw)} bytes where {want} were expected")]
    if len(raw) < MIN_RECORD_SIZE:
        return [Finding(Fault.SHORT, len(raw), want, _decoder_reason(raw))]
    total, magic = BLANK_HEADER.unpack_from(raw)
    if magic not in (MAGIC_V1, MAGIC_V2):
        return [Finding(Fault.MAGIC, magic, MAGIC_V1, f"bad magic code 0x{magic:08x}")]
    if total != want:
        return [Finding(Fault.TOTAL_SIZE, total, want, f"TOTALSIZE {total} where {want} were expected")]
    fields: RecordFields | None = None
    findings: list[Finding] = []
    if not expected.head_only:
        try:
            fields = verify_record(raw, check_crc=False)
        except CorruptRecordError as exc:
            return [Finding(Fault.LAYOUT, total, want, exc.reason)]
        if expected.check_crc:
            findings += _crc_findings(raw, fields)
    findings += _identity_findings(raw, expected, index, fields)
    return findings


def accepts(raw: bytes | memoryview, expected: Expected, *, size: int | None = None) -> bool:
    """Whether ``explain`` finds nothing wrong with ``raw``, answered without building findings where the rule is
    the common one (size, layout, body CRC, queue id, one queue offset, topic): the path of a reader that serves
    records one at a time, which must cost no more than the per-record decoder's own walk."""
    if (
        expected.head_only
        or expected.terminated
        or expected.physical_offsets is not None
        or expected.tag_hashes is not None
        or expected.max_body_length is not None
        or not isinstance(expected.queue_offsets, int | None)
    ):
        return not explain(raw, expected, size=size)
    want = len(raw) if size is None else size
    if len(raw) != want or want < MIN_RECORD_SIZE:
        return False
    try:
        fields = verify_record(raw, check_crc=expected.check_crc)
    except CorruptRecordError:
        return False
    return (
        fields.total == want
        and (expected.queue_id is None or fields.queue_id == expected.queue_id)
        and (expected.queue_offsets is None or fields.queue_offset == expected.queue_offsets)
        and (expected.topic is None or raw[fields.topic_at : fields.topic_at + fields.topic_len] == expected.topic)
    )


def _decoder_reason(raw: bytes | memoryview) -> str:
    """The per-record decoder's reason for refusing ``raw`` (which it refuses)."""
    try:
        verify_record(raw, check_crc=False)
    except CorruptRecordError as exc:
        return exc.reason
    raise AssertionError("the decoder took a record the batch check refused")


def _crc_findings(raw: bytes | memoryview, fields: RecordFields) -> list[Finding]:
    with memoryview(raw) as view:
        computed = crc32(view[fields.body_at : fields.body_at + fields.body_len]) & BODY_CRC_MASK
    if computed == fields.body_crc:
        return []
    reason = f"body CRC mismatch: stored {fields.body_crc}, computed {computed}"
    return [Finding(Fault.BODY_CRC, fields.body_crc, computed, reason)]


def _identity_findings(
    raw: bytes | memoryview, expected: Expected, index: int, fields: RecordFields | None
) -> list[Finding]:
    """The faults of a record whose lengths add up: who it belongs to, and what its tail says."""
    _total, _magic, _crc, queue_id, _flag, queue_offset, physical, _sysflag, _born = HEADER_PREFIX.unpack_from(raw)
    findings: list[Finding] = []
    if expected.queue_id is not None and queue_id != expected.queue_id:
        findings.append(Finding(Fault.QUEUE_ID, queue_id, expected.queue_id, f"queue id {queue_id}"))
    offsets = expected.queue_offsets
    if offsets is not None:
        want = offsets + index if isinstance(offsets, int) else int(offsets[index])
        if queue_offset != want:
            findings.append(Finding(Fault.QUEUE_OFFSET, queue_offset, want, f"queue offset {queue_offset}"))
    if expected.physical_offsets is not None:
        want = int(expected.physical_offsets[index])
        if physical != want:
            findings.append(Finding(Fault.PHYSICAL_OFFSET, physical, want, f"physical offset {physical}"))
    if fields is None:
        return findings
    topic = bytes(raw[fields.topic_at : fields.topic_at + fields.topic_len])
    if expected.topic is not None and topic != expected.topic:
        reason = "record of another topic"
        findings.append(Finding(Fault.TOPIC, len(topic), len(expected.topic), reason, topic, expected.topic))
    if expected.max_body_length is not None and fields.body_len > expected.max_body_length:
        reason = f"body of {fields.body_len} bytes"
        findings.append(Finding(Fault.BODY_SIZE, fields.body_len, expected.max_body_length, reason))
    if expected.terminated and fields.properties_len and raw[len(raw) - 1] != 0x02:
        findings.append(Finding(Fault.UNTERMINATED, raw[len(raw) - 1], 0x02, "properties do not end in 0x02"))
    if expected.tag_hashes is not None:
        properties = bytes(raw[fields.properties_at : fields.properties_at + fields.properties_len])
        computed, want = tag_hash_of(properties), int(expected.tag_hashes[index])
        if computed != want:
            findings.append(Finding(Fault.TAG_HASH, computed, want, f"unit tag hash {want}, TAGS give {computed}"))
    return findings


def describe(findings: Sequence[Finding], wording: Mapping[Fault, str], expected: Expected, index: int = 0) -> str:
    """The first of ``findings`` in the caller's words: ``wording`` maps a fault to a ``str.format`` template
    (a fault it does not name is worded by its ``reason``).

    A template may use the finding's ``reason``, ``found`` and ``expected``, and the record's identity as it
    holds it (``topic``, decoded, ``queue_id``, ``queue_offset``, ``physical_offset``) and as ``expected``
    says it should be (``expected_topic``, ``expected_queue_id``, ...), so a caller can name the record's
    owner whichever identity field was wrong.
    """
    first = findings[0]
    template = wording.get(first.fault)
    if template is None:
        return first.reason
    held = {finding.fault: finding for finding in findings}
    offsets = expected.queue_offsets
    wanted = {
        "topic": expected.topic or b"",
        "queue_id": expected.queue_id,
        "queue_offset": offsets + index
        if isinstance(offsets, int)
        else None
        if offsets is None
        else int(offsets[index]),
        "physical_offset": None if expected.physical_offsets is None else int(expected.physical_offsets[index]),
    }
    holds = dict(wanted)
    if Fault.TOPIC in held:
        holds["topic"] = held[Fault.TOPIC].owner
    for fault, name in (
        (Fault.QUEUE_ID, "queue_id"),
        (Fault.QUEUE_OFFSET, "queue_offset"),
        (Fault.PHYSICAL_OFFSET, "physical_offset"),
    ):
        if fault in held:
            holds[name] = held[fault].found

    def text(topic: object) -> object:
        return topic.decode("utf-8", errors="replace") if isinstance(topic, bytes) else topic

    return template.format(
        reason=first.reason,
        found=first.found,
        expected=first.expected,
        **{name: text(value) for name, value in holds.items()},
        **{f"expected_{name}": text(value) for name, value in wanted.items()},
    )
