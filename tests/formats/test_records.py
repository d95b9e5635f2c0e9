"""The batch record engine against every per-record rule it replaces: on generated runs with corruptions
in each field, the engine flags exactly the records the per-record check refuses."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tieredstore.errors import CorruptRecordError, MessageTooLargeError, ValidationError
from tieredstore.fetcher import verify_served
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import (
    MAGIC_V2,
    POS_BODY_CRC,
    POS_MAGIC,
    POS_PHYSICAL_OFFSET,
    POS_QUEUE_ID,
    POS_QUEUE_OFFSET,
    POS_TOTAL_SIZE,
    HostAddress,
    MessageRecord,
    decode,
    split_back_to_back,
    tag_hash,
    verify_record,
)
from tieredstore.formats.records import (
    Expected,
    Fault,
    PackedRun,
    describe,
    explain,
    first_problem,
    problem_indexes,
    problems,
    tag_hash_of,
)
from tieredstore.local.follower import record_problem
from tieredstore.local.store import LocalMessageStore

QUEUE_ID = 3
FIRST_OFFSET = 1000
COMMITLOG_START = 5_000_000
IPV6 = HostAddress("fe80::2", 10912)


@dataclass
class Window:
    """Records back to back from commit-log offset COMMITLOG_START, and the units that point at them."""

    topic: bytes
    data: bytearray
    units: list[tuple[int, int, int]]  # commit-log offset, size, tag hash

    def run(self) -> PackedRun:
        begins = [offset - COMMITLOG_START for offset, _size, _tag in self.units]
        return PackedRun.at(bytes(self.data), begins, [size for _offset, size, _tag in self.units])

    def raw(self, index: int) -> bytes:
        offset, size, _tag = self.units[index]
        begin = offset - COMMITLOG_START
        return bytes(self.data)[max(0, begin) : max(0, begin) + size] if begin >= 0 else b""

    def expected(self, **rule: object) -> Expected:
        return Expected(topic=self.topic, queue_id=QUEUE_ID, queue_offsets=FIRST_OFFSET, **rule)  # type: ignore[arg-type]

    def followed(self) -> Expected:
        return self.expected(
            physical_offsets=np.array([offset for offset, _size, _tag in self.units], dtype=np.int64),
            tag_hashes=np.array([tag for _offset, _size, tag in self.units], dtype=np.int64),
            terminated=True,
        )


def _records(draw: st.DrawFn) -> Window:
    topic = draw(st.sampled_from(["Checked", "L" * 200, "t"]))
    count = draw(st.integers(1, 8))
    data = bytearray()
    units = []
    for n in range(count):
        properties = draw(
            st.sampled_from([{}, {"KEYS": f"k{n}"}, {"TAGS": "tagA"}, {"MY_TAGS": "x", "TAGS": "tagB"}, {"TAGS": ""}])
        )
        record = MessageRecord(
            topic=topic,
            queue_id=QUEUE_ID,
            body=draw(st.binary(max_size=64)),
            properties=properties,
            queue_offset=FIRST_OFFSET + n,
            physical_offset=COMMITLOG_START + len(data),
            born_host=IPV6 if draw(st.booleans()) else HostAddress("10.0.0.1", 1),
            store_host=IPV6 if draw(st.booleans()) else HostAddress("10.0.0.2", 2),
            magic=MAGIC_V2 if draw(st.booleans()) else None,
        ).encode()
        units.append((COMMITLOG_START + len(data), len(record), tag_hash(properties.get("TAGS"))))
        data += record
    return Window(topic.encode(), data, units)


_FIELDS = [POS_TOTAL_SIZE, POS_MAGIC, POS_BODY_CRC, POS_QUEUE_ID, POS_QUEUE_OFFSET, POS_PHYSICAL_OFFSET, 36]


@st.composite
def corrupted(draw: st.DrawFn) -> Window:
    """Records with up to three corruptions: a flipped byte (in a fixed field, the tail or anywhere), a wrong
    unit (size, place, tag hash), a cut record, or a 0x02 terminator zeroed."""
    window = _records(draw)
    places = list(window.units)
    for _ in range(draw(st.integers(0, 3))):
        index = draw(st.integers(0, len(window.units) - 1))
        offset, size, tag = places[index]
        begin = offset - COMMITLOG_START
        if begin + size > len(window.data):
            continue  # cut off already
        kind = draw(st.sampled_from(["field", "tail", "anywhere", "size", "place", "tag", "cut", "terminator"]))
        if kind == "field":
            at = begin + draw(st.sampled_from(_FIELDS)) + draw(st.integers(0, 3))
            window.data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "tail":
            window.data[begin + size - draw(st.integers(1, min(size, 40)))] ^= 1 << draw(st.integers(0, 7))
        elif kind == "anywhere":
            window.data[draw(st.integers(0, len(window.data) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif kind == "size":
            window.units[index] = (offset, max(0, size + draw(st.sampled_from([-1, 1, -40]))), tag)
        elif kind == "place":
            window.units[index] = (offset + draw(st.sampled_from([-3, 1, 8])), size, tag)
        elif kind == "tag":
            window.units[index] = (offset, size, tag ^ draw(st.integers(1, 1 << 20)))
        elif kind == "cut":
            del window.data[begin + size - draw(st.integers(1, size)) :]
        else:
            window.data[begin + size - 1] = 0
    return window


def _refused(check: object) -> bool:
    try:
        return check() is not None  # type: ignore[operator]
    except (CorruptRecordError, ValidationError, MessageTooLargeError):
        return True


@settings(max_examples=400, deadline=None)
@given(corrupted())
def test_the_cold_window_rule_flags_exactly_what_verify_served_refuses(window: Window) -> None:
    """``fetcher.check_window``/``_suspect_records``: topic, queue, consecutive offsets and the body CRC."""
    refused = [
        _refused(
            lambda index=index: verify_served(
                window.topic.decode(),
                QUEUE_ID,
                FIRST_OFFSET + index,
                window.raw(index),
                ConsumeQueueUnit(*window.units[index]),
                "cold",
            )
        )
        for index in range(len(window.units))
    ]
    assert problems(window.run(), window.expected()).tolist() == refused
    explained = [
        bool(explain(window.raw(index), window.expected(), index, size=window.units[index][1]))
        for index in range(len(window.units))
    ]
    assert explained == refused


# ``verify_served``'s words for what ``explain`` finds: the fetcher's error messages, kept.
SERVED_WORDING = {
    **dict.fromkeys((Fault.SIZE, Fault.SHORT), "the consume queue says {expected} bytes but {found} were read"),
    Fault.TOTAL_SIZE: "TOTALSIZE {found} but the consume queue says {expected}",
    Fault.LAYOUT: "{reason} at offset 0",
    **dict.fromkeys(
        (Fault.QUEUE_ID, Fault.QUEUE_OFFSET, Fault.TOPIC),
        "the record belongs to {topic}/{queue_id} at queue offset {queue_offset}",
    ),
}


def _served_error(window: Window, index: int) -> str | None:
    """``verify_served``'s error, or None."""
    unit = ConsumeQueueUnit(*window.units[index])
    try:
        verify_served(window.topic.decode(), QUEUE_ID, FIRST_OFFSET + index, window.raw(index), unit, "cold")
    except CorruptRecordError as error:
        return error.reason
    return None


@settings(max_examples=300, deadline=None)
@given(corrupted())
def test_explain_in_the_fetcher_s_words_is_verify_served_s_error(window: Window) -> None:
    for index in range(len(window.units)):
        rule = Expected(topic=window.topic, queue_id=QUEUE_ID, queue_offsets=FIRST_OFFSET + index)
        findings = explain(window.raw(index), rule, size=window.units[index][1])
        words = describe(findings, SERVED_WORDING, rule) if findings else None
        served = _served_error(window, index)
        assert words == (None if served is None else served.split("): ", 1)[1])


@settings(max_examples=400, deadline=None)
@given(corrupted())
def test_the_followed_rule_flags_exactly_what_record_problem_refuses(window: Window) -> None:
    """``local.follower.record_problem`` (and ``followed_problems``): also PHYSICALOFFSET, tags and 0x02."""
    refused = [
        record_problem(window.raw(index), window.units[index], window.topic, QUEUE_ID, FIRST_OFFSET + index) is not None
        for index in range(len(window.units))
    ]
    run, rule = window.run(), window.followed()
    assert problems(run, rule).tolist() == refused
    assert first_problem(run, rule) == (refused.index(True) if True in refused else None)
    explained = [
        bool(explain(window.raw(index), rule, index, size=window.units[index][1])) for index in range(len(window.units))
    ]
    assert explained == refused


def _decoded_identity(window: Window, index: int) -> None:
    record = decode(window.raw(index))
    if (record.topic, record.queue_id, record.queue_offset) != (window.topic.decode(), QUEUE_ID, FIRST_OFFSET + index):
        raise CorruptRecordError("the record holds another queue's message")


@settings(max_examples=300, deadline=None)
@given(corrupted())
def test_the_spark_rule_flags_exactly_what_decode_and_identity_refuse(window: Window) -> None:
    """``scan.reading._decode``: a record decodes with a good CRC and holds this queue's next offset."""
    refused = [_refused(lambda index=index: _decoded_identity(window, index)) for index in range(len(window.units))]
    # A unit of the wrong size is not a Spark concern (it walks TOTALSIZE): compare records cut as they say.
    sized = [
        len(raw) == size and raw[:4] == size.to_bytes(4, "big")
        for raw, (_offset, size, _tag) in zip(map(window.raw, range(len(window.units))), window.units, strict=True)
    ]
    flagged = problems(window.run(), window.expected()).tolist()
    assert [f for f, whole in zip(flagged, sized, strict=True) if whole] == [
        r for r, whole in zip(refused, sized, strict=True) if whole
    ]


def _restorable_one(window: Window, index: int, max_body: int) -> object:
    store = SimpleNamespace(config=SimpleNamespace(max_message_size=max_body))
    topic = window.topic.decode()
    return LocalMessageStore._restorable_one(store, topic, window.topic, QUEUE_ID, window.raw(index))  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(corrupted(), st.sampled_from([10, 1 << 20]))
def test_the_restore_rule_flags_exactly_what_restorable_one_refuses(window: Window, max_body: int) -> None:
    """``local.store._restorable``: any offsets, this topic and queue, a body the store takes, a good CRC."""
    sized = [len(window.raw(index)) == window.units[index][1] for index in range(len(window.units))]
    refused = [
        _refused(lambda index=index: (_restorable_one(window, index, max_body), None)[1])
        for index in range(len(window.units))
    ]
    rule = Expected(topic=window.topic, queue_id=QUEUE_ID, max_body_length=max_body)
    flagged = problems(window.run(), rule).tolist()
    assert [f for f, whole in zip(flagged, sized, strict=True) if whole] == [
        r for r, whole in zip(refused, sized, strict=True) if whole
    ]


@settings(max_examples=300, deadline=None)
@given(corrupted())
def test_the_restore_read_ahead_rule_takes_exactly_what_read_following_takes(window: Window) -> None:
    """``cli.restore._read_following``: the records split by TOTALSIZE hold this queue's next offsets."""
    data = bytes(window.data)
    ends = np.asarray(split_back_to_back(data, len(window.units)), dtype=np.int64)
    found = len(ends) - 1
    if not found:
        return
    heads = [struct.unpack_from(">iIiiiqq", data, int(start)) for start in ends[:-1]]
    current = all(head[3] == QUEUE_ID and head[5] == FIRST_OFFSET + n for n, head in enumerate(heads))
    run = PackedRun.at(data, ends[:-1], np.diff(ends))
    rule = Expected(queue_id=QUEUE_ID, queue_offsets=FIRST_OFFSET, check_crc=False, head_only=True)
    assert (first_problem(run, rule) is None) == current


def test_explain_words_each_fault_and_lists_every_identity_fault() -> None:
    record = MessageRecord(topic="T", queue_id=1, body=b"x" * 10, properties={"TAGS": "a"}, queue_offset=7).encode()
    rule = Expected(topic=b"U", queue_id=2, queue_offsets=8, physical_offsets=np.array([5]), tag_hashes=np.array([0]))
    assert [f.fault for f in explain(record, rule)] == [
        Fault.QUEUE_ID,
        Fault.QUEUE_OFFSET,
        Fault.PHYSICAL_OFFSET,
        Fault.TOPIC,
        Fault.TAG_HASH,
    ]
    bad_crc = bytearray(record)
    bad_crc[-20] ^= 1
    garbled = bytearray(record)
    struct.pack_into(">i", garbled, 84, 1000)
    assert [(f.fault, f.reason) for f in explain(garbled, Expected())] == [
        (Fault.LAYOUT, "body length 1000 runs past the record end")
    ]
    assert explain(record[:50], Expected())[0].fault is Fault.SHORT
    assert explain(record[:50], Expected())[0].reason.startswith("truncated record: 50 bytes left")
    assert explain(record, Expected(), size=len(record) + 1)[0].fault is Fault.SIZE
    with pytest.raises(CorruptRecordError, match="body length 1000"):
        verify_record(bytes(garbled))


def test_a_head_only_rule_cannot_ask_for_what_lies_past_the_head() -> None:
    with pytest.raises(ValueError, match="head-only"):
        Expected(head_only=True)
    with pytest.raises(ValueError, match="head-only"):
        Expected(topic=b"T", check_crc=False, head_only=True)


@pytest.mark.parametrize(
    ("properties", "tags"),
    [
        (b"", None),
        (b"TAGS\x01a\x02", "a"),
        (b"MY_TAGS\x01x\x02TAGS\x01b\x02", "b"),
        (b"TAGS\x01a\x02TAGS\x01b\x02", "b"),
        (b"K\x01v\x01TAGS\x01c", None),
        (b"TAGS\x01", None),
        (b"XTAGS\x01d\x02", None),
    ],
)
def test_the_tag_hash_of_properties_is_that_of_the_tags_decode_gives(properties: bytes, tags: str | None) -> None:
    assert tag_hash_of(properties) == tag_hash(tags)


def test_an_empty_run_has_no_problem() -> None:
    run = PackedRun.back_to_back(b"", [])
    assert first_problem(run, Expected()) is None
    assert problem_indexes(run, Expected()).tolist() == []
