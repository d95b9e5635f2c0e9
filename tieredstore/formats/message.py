"""RocketMQ's stored-message record (v1 and v2 layouts): encode, decode and scan; pure functions.

Layout, big-endian: TOTALSIZE(4) MAGICCODE(4) BODYCRC(4) QUEUEID(4) FLAG(4) QUEUEOFFSET(8)
PHYSICALOFFSET(8) SYSFLAG(4) BORNTIMESTAMP(8) BORNHOST(8|20) STORETIMESTAMP(8) STOREHOST(8|20)
RECONSUMETIMES(4) PREPAREDTXOFFSET(8) BODYLEN(4)+BODY TOPICLEN(1|2)+TOPIC PROPLEN(2)+PROPERTIES.

v1 (magic 0xdaa320a7) has a 1-byte topic length; v2 (0xdaa320ab) a 2-byte one, used for topics
longer than 127 bytes. A host is IPv4 (4 + port 4) unless its sysflag bit says IPv6 (16 + 4).
A file ends in a blank record (magic 0xcbd43194, TOTALSIZE = bytes left) when the next record
does not fit. The properties' text form is ``formats.properties``, the hosts' ``formats.hosts``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from tieredstore.errors import CorruptRecordError, InvalidPropertyError
from tieredstore.formats.checksum import body_crc

# Callers import the properties and host names from here: re-exported by alias.
from tieredstore.formats.hosts import LOCALHOST as LOCALHOST
from tieredstore.formats.hosts import HostAddress as HostAddress
from tieredstore.formats.hosts import decode_host
from tieredstore.formats.properties import NAME_VALUE_SEPARATOR as NAME_VALUE_SEPARATOR
from tieredstore.formats.properties import PROPERTY_KEYS as PROPERTY_KEYS
from tieredstore.formats.properties import PROPERTY_SEPARATOR as PROPERTY_SEPARATOR
from tieredstore.formats.properties import PROPERTY_TAGS as PROPERTY_TAGS
from tieredstore.formats.properties import PROPERTY_UNIQ_KEY as PROPERTY_UNIQ_KEY
from tieredstore.formats.properties import decode_properties as decode_properties
from tieredstore.formats.properties import encode_properties as encode_properties
from tieredstore.formats.properties import java_string_hash as java_string_hash
from tieredstore.formats.properties import tag_hash as tag_hash

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
MAGIC_BLANK = 0xCBD43194

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
# A transaction's state, in bits 2-3: a prepared or rolled-back message is stored but never dispatched to
# its consume queue (RocketMQ's dispatch skips it; its queue offset is 0); a committed one is.
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20

# Offsets of the fixed-position fields every record has.
POS_TOTAL_SIZE = 0
POS_MAGIC = 4
POS_BODY_CRC = 8
POS_QUEUE_ID = 12
POS_QUEUE_OFFSET = 20
POS_PHYSICAL_OFFSET = 28
POS_SYSFLAG = 36
POS_BORN_TIMESTAMP = 40
POS_BORN_HOST = 48
HEADER_PREFIX = struct.Struct(">iIiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP: 48 bytes
MIN_RECORD_SIZE = 48 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2
BLANK_HEADER = struct.Struct(">iI")


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """One decoded stored message. ``encode()`` reproduces the bytes it was decoded from."""

    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    queue_offset: int = 0
    physical_offset: int = 0
    flag: int = 0
    sysflag: int = 0
    born_timestamp: int = 0
    born_host: HostAddress = LOCALHOST
    store_timestamp: int = 0
    store_host: HostAddress = LOCALHOST
    reconsume_times: int = 0
    prepared_tx_offset: int = 0
    body_crc: int | None = None  # None: computed from body on encode
    magic: int | None = None  # None: v1 unless the topic needs v2

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(" ") if k]

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS) or None

    @property
    def unique_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY) or None

    @property
    def stored_crc(self) -> int:
        return body_crc(self.body) if self.body_crc is None else self.body_crc

    @property
    def offset_msg_id(self) -> str:
        """RocketMQ's offset message id: store host ip + port, then physical offset, upper-case hex."""
        return (self.store_host.encode() + struct.pack(">q", self.physical_offset)).hex().upper()

    def with_physical_offset(self, offset: int) -> MessageRecord:
        return replace(self, physical_offset=offset)

    def encode(self) -> bytes:
        topic_raw = self.topic.encode("utf-8")
        magic = self.magic if self.magic is not None else (MAGIC_V2 if len(topic_raw) > 127 else MAGIC_V1)
        return encode_raw(
            topic_raw=topic_raw,
            queue_id=self.queue_id,
            body=self.body,
            properties_raw=encode_properties(self.properties),
            queue_offset=self.queue_offset,
            physical_offset=self.physical_offset,
            flag=self.flag,
            sysflag=self.sysflag,
            born_timestamp=self.born_timestamp,
            born_host=self.born_host,
            store_timestamp=self.store_timestamp,
            store_host=self.store_host,
            reconsume_times=self.reconsume_times,
            prepared_tx_offset=self.prepared_tx_offset,
            crc=self.stored_crc,
            magic=magic,
        )


_IPV4_FIXED = struct.Struct(">iIiiiqqiq8sq8siqi")  # TOTALSIZE .. BODYLEN with two IPv4 hosts


def encode_raw(
    *,
    topic_raw: bytes,
    queue_id: int,
    body: bytes,
    properties_raw: bytes,
    queue_offset: int = 0,
    physical_offset: int = 0,
    flag: int = 0,
    sysflag: int = 0,
    born_timestamp: int = 0,
    born_host: HostAddress = LOCALHOST,
    store_timestamp: int = 0,
    store_host: HostAddress = LOCALHOST,
    reconsume_times: int = 0,
    prepared_tx_offset: int = 0,
    crc: int | None = None,
    magic: int = MAGIC_V1,
) -> bytes:
    """One record from already-encoded topic and properties; the hot store's put path calls this directly.

    The IPv6 sysflag bits are derived from the hosts, so they can never disagree with the host fields.
    """
    if len(properties_raw) > 0x7FFF:
        raise InvalidPropertyError(f"properties are {len(properties_raw)} bytes; the format allows 32767")
    if magic == MAGIC_V2:
        topic_len = struct.pack(">h", len(topic_raw))
    elif len(topic_raw) > 127:
        raise InvalidPropertyError(f"a v1 record holds topics up to 127 bytes, not {len(topic_raw)}; use v2")
    else:
        topic_len = bytes((len(topic_raw),))
    sysflag &= ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    if born_host.is_ipv6:
        sysflag |= SYSFLAG_BORNHOST_V6
    if store_host.is_ipv6:
        sysflag |= SYSFLAG_STOREHOST_V6
    crc_value = body_crc(body) if crc is None else crc
    born_raw = born_host.encode()
    store_raw = store_host.encode()
    total = (
        HEADER_PREFIX.size
        + len(born_raw)
        + 8
        + len(store_raw)
        + 16
        + len(body)
        + len(topic_len)
        + len(topic_raw)
        + 2
        + len(properties_raw)
    )
    props_len = struct.pack(">h", len(properties_raw))
    if len(born_raw) == 8 and len(store_raw) == 8:
        fixed = _IPV4_FIXED.pack(
            total,
            magic,
            crc_value,
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sysflag,
            born_timestamp,
            born_raw,
            store_timestamp,
            store_raw,
            reconsume_times,
            prepared_tx_offset,
            len(body),
        )
        return b"".join((fixed, body, topic_len, topic_raw, props_len, properties_raw))
    head = HEADER_PREFIX.pack(
        total, magic, crc_value, queue_id, flag, queue_offset, physical_offset, sysflag, born_timestamp
    )
    return b"".join(
        (
            head,
            born_raw,
            struct.pack(">q", store_timestamp),
            store_raw,
            struct.pack(">iqi", reconsume_times, prepared_tx_offset, len(body)),
            body,
            topic_len,
            topic_raw,
            props_len,
            properties_raw,
        )
    )


class RecordLayout:
    """The parts of every record of one topic from one born/store host pair, worked out once.

    A writer packs ``fixed`` (TOTALSIZE .. BODYLEN, every field at its final value) straight into
    its buffer, then the body, then ``tail(properties_raw)`` (topic length, topic, properties), so a
    record is laid down without building an intermediate bytes object. The bytes are exactly
    ``encode_raw``'s for the same fields.
    """

    __slots__ = ("born_raw", "empty_tail", "fixed", "fixed_size", "magic", "store_raw", "sysflag", "topic_part")

    def __init__(
        self, topic_raw: bytes, *, born_host: HostAddress, store_host: HostAddress, magic: int | None = None
    ) -> None:
        if magic is None:
            magic = MAGIC_V2 if len(topic_raw) > 127 else MAGIC_V1
        if magic == MAGIC_V2:
            topic_len = struct.pack(">h", len(topic_raw))
        elif len(topic_raw) > 127:
            raise InvalidPropertyError(f"a v1 record holds topics up to 127 bytes, not {len(topic_raw)}; use v2")
        else:
            topic_len = bytes((len(topic_raw),))
        self.magic = magic
        self.sysflag = (SYSFLAG_BORNHOST_V6 if born_host.is_ipv6 else 0) | (
            SYSFLAG_STOREHOST_V6 if store_host.is_ipv6 else 0
        )
        self.born_raw = born_host.encode()
        self.store_raw = store_host.encode()
        self.fixed = struct.Struct(f">iIiiiqqiq{len(self.born_raw)}sq{len(self.store_raw)}siqi")
        self.fixed_size = self.fixed.size
        self.topic_part = topic_len + topic_raw
        self.empty_tail = self.topic_part + b"\x00\x00"

    def tail(self, properties_raw: bytes) -> bytes:
        """TOPICLEN, TOPIC, PROPLEN and PROPERTIES: everything after the body."""
        if not properties_raw:
            return self.empty_tail
        if len(properties_raw) > 0x7FFF:
            raise InvalidPropertyError(f"properties are {len(properties_raw)} bytes; the format allows 32767")
        return self.topic_part + struct.pack(">h", len(properties_raw)) + properties_raw


def blank_record(size: int) -> bytes:
    """The end-of-file filler: TOTALSIZE = size, blank magic, zeros after."""
    return BLANK_HEADER.pack(size, MAGIC_BLANK) + bytes(max(0, size - BLANK_HEADER.size))


def same_but_physical_offset(a: bytes, b: bytes) -> bool:
    """Whether two records are byte-identical but for PHYSICALOFFSET: one message in two stores (hot and
    cold, or an archive and a hot store it was restored into)."""
    end = POS_PHYSICAL_OFFSET + 8
    return len(a) == len(b) and a[:POS_PHYSICAL_OFFSET] == b[:POS_PHYSICAL_OFFSET] and a[end:] == b[end:]


def record_size_at(buf: bytes | memoryview, pos: int = 0) -> tuple[int, int]:
    """(total size, magic) of the record starting at ``pos``; raises if fewer than 8 bytes remain."""
    if len(buf) - pos < BLANK_HEADER.size:
        raise CorruptRecordError("truncated record header", offset=pos)
    size, magic = BLANK_HEADER.unpack_from(buf, pos)
    return size, magic


_LONG = struct.Struct(">q")
_SHORT = struct.Struct(">h")
_RECONSUME_PREPARED_BODY_LEN = struct.Struct(">iqi")


class RecordFields(NamedTuple):
    """A checked record's fixed fields and where its variable parts lie (positions are absolute in the buffer)."""

    total: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sysflag: int
    born_timestamp: int
    born_host_at: int
    born_host_len: int
    store_timestamp: int
    store_host_at: int
    store_host_len: int
    reconsume_times: int
    prepared_tx_offset: int
    body_at: int
    body_len: int
    topic_at: int
    topic_len: int
    properties_at: int
    properties_len: int


def verify_record(
    buf: bytes | memoryview, pos: int = 0, *, check_crc: bool = True, location: str | None = None
) -> RecordFields:
    """Every structural check ``decode`` makes (magic, sizes, lengths, body CRC) without building the record.

    Readers that serve or copy records whole check them with this and decode only when a field is wanted.
    Every inconsistency is a CorruptRecordError naming the offset.
    """

    def corrupt(reason: str) -> CorruptRecordError:
        return CorruptRecordError(reason, location=location, offset=pos)

    available = len(buf) - pos
    if available < MIN_RECORD_SIZE:
        raise corrupt(f"truncated record: {available} bytes left, a record needs at least {MIN_RECORD_SIZE}")
    (total, magic, crc, queue_id, flag, queue_offset, physical_offset, sysflag, born_ts) = HEADER_PREFIX.unpack_from(
        buf, pos
    )
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise corrupt(f"bad magic code 0x{magic & 0xFFFFFFFF:08x}")
    if total < MIN_RECORD_SIZE or total > available:
        raise corrupt(f"record size {total} does not fit the {available} bytes available")
    end = pos + total
    born_at = pos + HEADER_PREFIX.size
    try:
        born_len = 20 if sysflag & SYSFLAG_BORNHOST_V6 else 8
        cur = born_at + born_len
        (store_ts,) = _LONG.unpack_from(buf, cur)
        store_at = cur + 8
        store_len = 20 if sysflag & SYSFLAG_STOREHOST_V6 else 8
        cur = store_at + store_len
        reconsume, prepared, body_len = _RECONSUME_PREPARED_BODY_LEN.unpack_from(buf, cur)
        cur += 16
        if body_len < 0 or cur + body_len > end:
            raise corrupt(f"body length {body_len} runs past the record end")
        body_at = cur
        cur += body_len
        if magic == MAGIC_V2:
            (topic_len,) = _SHORT.unpack_from(buf, cur)
            cur += 2
        else:
            topic_len = int.from_bytes(buf[cur : cur + 1], "big", signed=True)
            cur += 1
        if topic_len < 0 or cur + topic_len > end:
            raise corrupt(f"topic length {topic_len} runs past the record end")
        topic_at = cur
        cur += topic_len
        (props_len,) = _SHORT.unpack_from(buf, cur)
        cur += 2
    except struct.error as exc:
        raise corrupt(f"undecodable record: {exc}") from exc
    if props_len < 0 or cur + props_len != end:
        raise corrupt(f"properties length {props_len} does not end at the record size {total}")
    if check_crc:
        computed = body_crc(memoryview(buf)[body_at : body_at + body_len])
        if computed != crc:
            raise corrupt(f"body CRC mismatch: stored {crc}, computed {computed}")
    return RecordFields(
        total,
        magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sysflag,
        born_ts,
        born_at,
        born_len,
        store_ts,
        store_at,
        store_len,
        reconsume,
        prepared,
        body_at,
        body_len,
        topic_at,
        topic_len,
        cur,
        props_len,
    )


def decode(
    buf: bytes | memoryview, pos: int = 0, *, check_crc: bool = True, location: str | None = None
) -> MessageRecord:
    """Decode the record at ``pos``; every inconsistency is a CorruptRecordError naming the offset."""
    fields = verify_record(buf, pos, check_crc=check_crc, location=location)
    try:
        born_host = decode_host(bytes(buf[fields.born_host_at : fields.born_host_at + fields.born_host_len]))
        store_host = decode_host(bytes(buf[fields.store_host_at : fields.store_host_at + fields.store_host_len]))
        topic = bytes(buf[fields.topic_at : fields.topic_at + fields.topic_len]).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"undecodable record: {exc}", location=location, offset=pos) from exc
    properties_at = fields.properties_at
    return MessageRecord(
        topic=topic,
        queue_id=fields.queue_id,
        body=bytes(buf[fields.body_at : fields.body_at + fields.body_len]),
        properties=decode_properties(bytes(buf[properties_at : properties_at + fields.properties_len])),
        queue_offset=fields.queue_offset,
        physical_offset=fields.physical_offset,
        flag=fields.flag,
        sysflag=fields.sysflag,
        born_timestamp=fields.born_timestamp,
        born_host=born_host,
        store_timestamp=fields.store_timestamp,
        store_host=store_host,
        reconsume_times=fields.reconsume_times,
        prepared_tx_offset=fields.prepared_tx_offset,
        body_crc=fields.body_crc,
        magic=fields.magic,
    )


def property_value(buf: bytes | memoryview, fields: RecordFields, name: str) -> str | None:
    """One property of a checked record (as ``decode(...).properties.get(name)``), parsing only when it is there."""
    raw = bytes(buf[fields.properties_at : fields.properties_at + fields.properties_len])
    if name.encode("utf-8") + b"\x01" not in raw:
        return None
    return decode_properties(raw).get(name)


def rewrite_physical_offset(raw: bytes, offset: int) -> bytes:
    """The same record bytes with PHYSICALOFFSET set to ``offset`` (nothing else changes)."""
    out = bytearray(raw)
    struct.pack_into(">q", out, POS_PHYSICAL_OFFSET, offset)
    return bytes(out)


def store_timestamp_of(raw: bytes | memoryview, pos: int = 0) -> int:
    """STORETIMESTAMP of the record at ``pos`` without decoding the rest.

    A buffer that ends before the field (a record not, or no longer, where its unit says) is a
    CorruptRecordError, like any other record that does not check out.
    """
    if len(raw) < pos + POS_SYSFLAG + 4:
        raise CorruptRecordError(f"{len(raw) - pos} bytes are too few for a record's SYSFLAG", offset=pos)
    (sysflag,) = struct.unpack_from(">i", raw, pos + POS_SYSFLAG)
    at = pos + POS_BORN_HOST + (20 if sysflag & SYSFLAG_BORNHOST_V6 else 8)
    if len(raw) < at + 8:
        raise CorruptRecordError(f"{len(raw) - pos} bytes are too few for a record's STORETIMESTAMP", offset=pos)
    (ts,) = struct.unpack_from(">q", raw, at)
    return int(ts)


def properties_raw_of(raw: bytes | memoryview, pos: int = 0) -> bytes:
    """The PROPERTIES bytes of the record at ``pos``, found from its length fields without decoding the rest.

    Raises CorruptRecordError when the length fields do not fit the record.
    """
    try:
        total, magic, _crc, _queue_id, _flag, _queue_offset, _physical, sysflag, _born = HEADER_PREFIX.unpack_from(
            raw, pos
        )
        cur = pos + HEADER_PREFIX.size + (20 if sysflag & SYSFLAG_BORNHOST_V6 else 8) + 8
        cur += (20 if sysflag & SYSFLAG_STOREHOST_V6 else 8) + 12
        (body_len,) = struct.unpack_from(">i", raw, cur)
        cur += 4 + body_len
        if magic == MAGIC_V2:
            (topic_len,) = struct.unpack_from(">h", raw, cur)
            cur += 2 + topic_len
        else:
            cur += 1 + raw[cur]
        (props_len,) = struct.unpack_from(">h", raw, cur)
    except (struct.error, IndexError) as exc:
        raise CorruptRecordError(f"undecodable record: {exc}", offset=pos) from exc
    cur += 2
    if pos + total > len(raw):
        raise CorruptRecordError(f"record size {total} does not fit the {len(raw) - pos} bytes available", offset=pos)
    if body_len < 0 or props_len < 0 or cur + props_len != pos + total:
        raise CorruptRecordError(f"properties length {props_len} does not end at the record size {total}", offset=pos)
    return bytes(raw[cur : cur + props_len])


def index_keys_of(raw: bytes | memoryview, pos: int = 0) -> tuple[str, ...]:
    """The keys a message is indexed by — its KEYS, then its UNIQ_KEY — as ``decode`` would give them, cheaply."""
    properties = decode_properties(properties_raw_of(raw, pos))
    keys = [key for key in properties.get(PROPERTY_KEYS, "").split(" ") if key]
    unique_key = properties.get(PROPERTY_UNIQ_KEY)
    return (*keys, unique_key) if unique_key else tuple(keys)


def split_back_to_back(buf: bytes | memoryview, max_count: int) -> list[int]:
    """Where each of up to ``max_count`` records laid back to back from the start of ``buf`` begins,
    followed by where the last one ends (``[0]`` when none fits).

    Only TOTALSIZE and MAGICCODE are read, and a split stops at the first record that is not a message
    or runs past the buffer (a record cut off by the end of a read, a blank record, damage): the caller
    checks the records it got, and reads on from the returned end.

    Records of one size in a row (a producer's fixed-size messages) are taken a run at a time: after a
    few of them, the headers where more of that size would begin are read in one strided pass and the
    run goes on as far as they agree. The result is the record-by-record walk's, at a fraction of its
    cost on such runs; a probe that finds a short run (or none) doubles the walk before the next one.
    """
    ends = [0]
    append, unpack = ends.append, BLANK_HEADER.unpack_from
    position, length = 0, len(buf)
    last_start = length - MIN_RECORD_SIZE
    remaining, step = max_count, _RUN_FIRST_WALK
    while remaining > 0:
        walk = min(step, remaining)
        for _ in range(walk):
            if position > last_start:
                break
            size, magic = unpack(buf, position)
            if size < MIN_RECORD_SIZE or position + size > length or (magic != MAGIC_V1 and magic != MAGIC_V2):
                break
            position += size
            append(position)
        else:
            remaining -= walk
            # The last two records of one size: probe for more of it. Short runs make probes rarer.
            run = 0
            if remaining and len(ends) > 2 and position - ends[-2] == ends[-2] - ends[-3]:
                size = position - ends[-2]
                run = _equal_size_run(buf, position, size, remaining)
                ends.extend(range(position + size, position + size * run + 1, size))
                position += size * run
                remaining -= run
            step = _RUN_FIRST_WALK if run >= _RUN_WORTH_PROBING else min(step * 2, _RUN_PROBE_MAX_WALK)
            continue
        break
    return ends


_RUN_FIRST_WALK = 2  # records walked one by one before the first probe, and after a probe that paid
_RUN_WORTH_PROBING = 16  # a probe that found a shorter run (or none) doubles the walk before the next
_RUN_PROBE_MAX_WALK = 4096
_RUN_FIRST_PASS = 32  # headers read by a probe's first pass; each further pass reads 8x more
_RUN_HEAD = np.dtype([("size", ">i4"), ("magic", ">u4")])


def _equal_size_run(buf: bytes | memoryview, position: int, size: int, limit: int) -> int:
    """How many records of ``size`` (whole, with a message magic) follow one another from ``position``, up to
    ``limit``; read in growing strided passes, so a run that soon breaks costs a small one."""
    limit = min(limit, (len(buf) - position) // size)
    run, chunk = 0, _RUN_FIRST_PASS
    while run < limit:
        fit = min(chunk, limit - run)
        heads = np.ndarray((fit,), dtype=_RUN_HEAD, buffer=buf, offset=position + run * size, strides=(size,))
        magic = heads["magic"]
        broken = np.flatnonzero((heads["size"] != size) | ((magic != MAGIC_V1) & (magic != MAGIC_V2)))
        if len(broken):
            return run + int(broken[0])
        run += fit
        chunk *= 8
    return run


def iter_records(
    buf: bytes | memoryview, start: int = 0, *, check_crc: bool = True, location: str | None = None
) -> Iterator[tuple[int, MessageRecord]]:
    """Yield (position, record) for consecutive records until the buffer or a blank record ends them."""
    pos = start
    while len(buf) - pos >= BLANK_HEADER.size:
        size, magic = record_size_at(buf, pos)
        if magic == MAGIC_BLANK or (size == 0 and magic == 0):
            return
        record = decode(buf, pos, check_crc=check_crc, location=location)
        yield pos, record
        pos += size
