"""restore_messages writes a whole batch at once: checked all together, rebased record by record, all or nothing."""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.local.conftest import abandon, small_config
from tests.local.test_restore import TOPIC, produce, read_all, rebased, without_physical_offset
from tieredstore.errors import CorruptRecordError, MessageTooLargeError, ValidationError
from tieredstore.formats.message import (
    MAGIC_V2,
    POS_BODY_CRC,
    POS_MAGIC,
    POS_QUEUE_OFFSET,
    POS_TOTAL_SIZE,
    HostAddress,
    MessageRecord,
    decode,
    tag_hash,
)
from tieredstore.local import LocalMessageStore
from tieredstore.local.store import JoinedRecords


@pytest.mark.parametrize("given_as", ["records", "one-buffer"])
def test_one_batch_across_commit_log_files_lands_at_new_offsets_with_physical_offsets_rewritten(
    tmp_path: Path, given_as: str
) -> None:
    config = small_config()
    records = rebased(produce(tmp_path / "source", config, 120), 1000)
    with LocalMessageStore(tmp_path / "target", config=config) as target:
        target.put_message("Other", 0, b"x" * 5000)  # the batch starts mid-file, not at 0
        if given_as == "records":
            results = target.restore_messages(TOPIC, 0, records)
        else:
            results = target.restore_messages(TOPIC, 0, JoinedRecords(b"".join(records), [len(r) for r in records]))
        assert [r.queue_offset for r in results] == list(range(1000, 1120))
        # One batch spans three 64 KiB files: two blanks end the first two.
        assert len({r.commitlog_offset // config.commit_log_file_size for r in results}) >= 3
        for result, original in zip(results, records, strict=True):
            unit = target.cq_unit(TOPIC, 0, result.queue_offset)
            assert (unit.commitlog_offset, unit.size) == (result.commitlog_offset, len(original))
            assert unit.tag_hash == tag_hash(decode(original).tags)
            landed = target.read_record(unit)
            assert decode(landed).physical_offset == unit.commitlog_offset
            assert without_physical_offset(landed) == without_physical_offset(original)
            assert result.store_timestamp == decode(original).store_timestamp
        restored = read_all(target)
        # The next put follows on after the batch in the log and in the queue.
        after = target.put_message(TOPIC, 0, b"after")
        assert (after.queue_offset, after.commitlog_offset) == (1120, results[-1].commitlog_offset + results[-1].size)
    # A crash before any flush: recovery scans the log, which checks every PHYSICALOFFSET against its position.
    crashed = LocalMessageStore(tmp_path / "target", config=config)
    abandon(crashed)
    with LocalMessageStore(tmp_path / "target", config=config) as reopened:
        assert reopened.recovery.stop_reason is None
        assert {k: v for k, v in read_all(reopened).items() if k < 1120} == restored


def _flip_body(raw: bytes) -> bytes:
    out = bytearray(raw)
    out[-40] ^= 0x01  # inside the body (the properties are shorter): the CRC no longer matches
    return bytes(out)


def _set(position: int, fmt: str, value: int) -> Callable[[bytes], bytes]:
    def change(raw: bytes) -> bytes:
        out = bytearray(raw)
        struct.pack_into(fmt, out, position, value)
        return bytes(out)

    return change


def _one_byte_short(raw: bytes) -> bytes:
    return _set(POS_TOTAL_SIZE, ">i", len(raw) - 1)(raw)


def _other_topic(raw: bytes) -> bytes:
    return raw.replace(TOPIC.encode(), b"Orderz")


BROKEN: dict[str, tuple[Callable[[bytes], bytes], type[Exception], str]] = {
    "body-crc": (_flip_body, CorruptRecordError, "CRC"),
    "crc-field": (_set(POS_BODY_CRC, ">i", 12345), CorruptRecordError, "CRC"),
    "magic": (_set(POS_MAGIC, ">I", 0x12345678), CorruptRecordError, "magic"),
    "total-size-larger": (_set(POS_TOTAL_SIZE, ">i", 1 << 20), CorruptRecordError, "does not fit"),
    "total-size-smaller": (
        lambda raw: _set(POS_TOTAL_SIZE, ">i", len(raw) - 1)(raw),
        CorruptRecordError,
        "properties length",
    ),
    "truncated": (lambda raw: raw[:-3], CorruptRecordError, "does not fit"),
    "too-short": (lambda raw: raw[:60], CorruptRecordError, "truncated"),
    "foreign-topic": (_other_topic, ValidationError, "Orderz/0 cannot be restored into Orders/0"),
    "queue-offset-gap": (_set(POS_QUEUE_OFFSET, ">q", 999), ValidationError, "consecutive"),
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_bad_record_mid_batch_fails_the_call_before_any_of_the_batch_is_written(tmp_path: Path, kind: str) -> None:
    config = small_config()
    records = produce(tmp_path / "source", config, 30)
    change, error, message = BROKEN[kind]
    batch = [*records[10:17], change(records[17]), *records[18:30]]
    with LocalMessageStore(tmp_path / "target", config=config) as target:
        target.restore_messages(TOPIC, 0, records[:10])
        before = read_all(target)
        log_end = target.commitlog_max_offset
        with pytest.raises(error, match=message) as raised:
            target.restore_messages(TOPIC, 0, batch)
        if error is CorruptRecordError:
            assert "Orders/0" in str(raised.value)
        assert target.max_offset(TOPIC, 0) == 10
        assert target.commitlog_max_offset == log_end
        assert read_all(target) == before
        # The queue goes on with the sound batch.
        assert [r.queue_offset for r in target.restore_messages(TOPIC, 0, records[10:])] == list(range(10, 30))


def test_a_body_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    records = produce(tmp_path / "source", small_config(), 3)
    with (
        LocalMessageStore(tmp_path / "target", config=small_config(max_message_size=1024)) as target,
        pytest.raises(MessageTooLargeError),
    ):
        target.restore_messages(TOPIC, 0, records)


def test_records_of_other_layouts_in_a_batch_are_checked_one_by_one_and_restored(tmp_path: Path) -> None:
    """IPv6 hosts and a v2 magic are not the writer's layout; they take the per-record check, and land all the same."""
    v6 = HostAddress("2001:db8::7", 10911)
    layouts = [
        MessageRecord(TOPIC, 0, b"plain-%d" % i, {"TAGS": "a"}, queue_offset=i, store_timestamp=1000 + i)
        for i in range(6)
    ]
    layouts[2] = replace(layouts[2], born_host=v6)
    layouts[3] = replace(layouts[3], store_host=v6)
    layouts[4] = replace(layouts[4], magic=MAGIC_V2)
    layouts[5] = replace(layouts[5], properties={"KEYS": "k5", "TAGS": "blue"})
    raws = [record.encode() for record in layouts]
    with LocalMessageStore(tmp_path / "target", config=small_config()) as target:
        results = target.restore_messages(TOPIC, 0, raws)
        assert [r.store_timestamp for r in results] == [1000 + i for i in range(6)]
        for index, raw in enumerate(raws):
            assert without_physical_offset(target.read_record(target.cq_unit(TOPIC, 0, index))) == (
                without_physical_offset(raw)
            )
            assert target.cq_unit(TOPIC, 0, index).tag_hash == tag_hash(layouts[index].tags)
        broken = bytearray(raws[2])
        broken[-20] ^= 0x01
        with pytest.raises(CorruptRecordError):
            target.restore_messages(TOPIC, 0, [MessageRecord(TOPIC, 0, b"n", queue_offset=6).encode(), bytes(broken)])
        assert target.max_offset(TOPIC, 0) == 6


def test_joined_records_are_whole_records_or_refused(tmp_path: Path) -> None:
    records = produce(tmp_path / "source", small_config(), 4)
    joined = b"".join(records)
    with pytest.raises(ValidationError, match="add up to"):
        JoinedRecords(joined, [len(r) for r in records[:3]])
    assert [bytes(view) for view in JoinedRecords(joined, [len(r) for r in records])] == records
    with LocalMessageStore(tmp_path / "target", config=small_config()) as target:
        # Sizes that cut the records elsewhere make records that are not whole: refused, nothing written.
        cut = [len(records[0]) + 1, len(joined) - len(records[0]) - 1]
        with pytest.raises(CorruptRecordError):
            target.restore_messages(TOPIC, 0, JoinedRecords(joined, cut))
        assert target.commitlog_max_offset == 0
        assert len(target.restore_messages(TOPIC, 0, JoinedRecords(joined, [len(r) for r in records]))) == 4


def test_a_restore_leaves_the_callers_buffer_as_it_was(tmp_path: Path) -> None:
    config = small_config()
    records = produce(tmp_path / "source", config, 40)
    given = bytearray(b"".join(records))
    with LocalMessageStore(tmp_path / "target", config=config) as target:
        target.put_message("Other", 0, b"x" * 5000)  # every record lands at another PHYSICALOFFSET
        target.restore_messages(TOPIC, 0, JoinedRecords(given, [len(r) for r in records]))  # type: ignore[arg-type]
        assert given == b"".join(records)
        assert [decode(raw).physical_offset for raw in read_all(target).values()] == [
            target.cq_unit(TOPIC, 0, offset).commitlog_offset for offset in range(40)
        ]


def test_what_a_restore_keeps_in_memory_does_not_grow_with_the_messages_restored(tmp_path: Path) -> None:
    """Issue 7: a restore of millions of messages must not hold anything per message once a batch is written."""
    config = small_config(commit_log_file_size=64 << 20, consume_queue_units_per_file=100_000)
    records = produce(tmp_path / "source", config, 200)
    batches = [
        JoinedRecords(b"".join(rebased(records, start)), [len(r) for r in records]) for start in range(0, 6000, 200)
    ]
    batches.reverse()
    with LocalMessageStore(tmp_path / "target", config=config) as target:
        tracemalloc.start()
        try:
            for _ in range(5):
                target.restore_messages(TOPIC, 0, batches.pop())
            warm, _ = tracemalloc.get_traced_memory()
            while batches:
                target.restore_messages(TOPIC, 0, batches.pop())
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert target.max_offset(TOPIC, 0) == 6000
    # 5,000 more messages: one list slot and int kept per message would be 200 KB (measured ~12 KB without).
    assert held - warm < 64 << 10


def test_batches_of_changing_sizes_each_land_as_given(tmp_path: Path) -> None:
    """The store patches each run in one reused buffer: a batch after a bigger one gets none of its bytes."""
    config = small_config(commit_log_file_size=1 << 20)
    records = produce(tmp_path / "source", config, 90)
    with LocalMessageStore(tmp_path / "target", config=config) as target:
        target.put_message("Other", 0, b"x" * 5000)  # every record lands at another PHYSICALOFFSET
        for begin, end in [(0, 10), (10, 70), (70, 75), (75, 90)]:
            batch = records[begin:end]
            target.restore_messages(TOPIC, 0, JoinedRecords(b"".join(batch), [len(r) for r in batch]))
        restored = read_all(target)
        assert list(restored) == list(range(90))
        for offset, raw in restored.items():
            assert len(raw) == len(records[offset])
            assert without_physical_offset(raw) == without_physical_offset(records[offset])
            assert decode(raw).physical_offset == target.cq_unit(TOPIC, 0, offset).commitlog_offset
