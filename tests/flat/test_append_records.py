"""FlatMessageFile.append_records: a packed run of records (one buffer, arrays of sizes, tags and times).

The archiver hands the hot store's batch over in this form; it must archive exactly what per-message
appends would (PHYSICALOFFSETs, units, segment splits) and refuse a bad run before buffering a byte.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tieredstore.errors import CorruptRecordError, ValidationError
from tieredstore.flat import FlatFileSettings, FlatFileStore, check_queue_invariant
from tieredstore.flat.message_file import RecordRun
from tieredstore.formats.message import POS_MAGIC, POS_PHYSICAL_OFFSET, POS_QUEUE_OFFSET, decode
from tieredstore.formats.naming import FileType
from tieredstore.local import LocalMessageStore, LocalStoreConfig
from tieredstore.local.store import PutRequest
from tieredstore.metadata import MetadataStore
from tieredstore.providers.memory import MemoryProvider

from .helpers import BASE_TIMESTAMP, TOPIC, make_record, tags_hash

SMALL = FlatFileSettings(commit_log_max_size=1000, consume_queue_max_size=100)


def run_of(start: int, end: int) -> RecordRun:
    return RecordRun.of(
        [(make_record(offset), offset, BASE_TIMESTAMP + offset, tags_hash()) for offset in range(start, end)]
    )


def without_physical_offset(record: bytes) -> bytes:
    return record[:POS_PHYSICAL_OFFSET] + record[POS_PHYSICAL_OFFSET + 8 :]


async def test_a_packed_run_crossing_segments_archives_what_per_message_appends_do(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    store = FlatFileStore(memory_provider, metadata, cluster="c", broker="b", settings=SMALL)
    # Two topics of equal name length: their records have equal sizes.
    one_by_one, packed = await store.get_or_create("TopicB", 0), await store.get_or_create(TOPIC, 0)
    for offset in range(50):
        one = (make_record(offset, topic="TopicB"), offset, BASE_TIMESTAMP + offset, tags_hash())
        await one_by_one.append_records(RecordRun.of([one]))
    await one_by_one.commit()
    hot = {offset: make_record(offset) for offset in range(50)}
    assert await packed.append_records(run_of(0, 20)) == 0
    await packed.append_records(run_of(20, 50))  # starts in part-filled segments of both files
    assert await packed.commit() == 50

    segments = [(s.base_offset, s.commit_position) for s in packed.commit_log.segments]
    assert len(segments) > 2, "the runs were split over several commit-log segments"
    assert len(packed.consume_queue.segments) > 2, "and over several consume-queue segments"
    assert segments == [(s.base_offset, s.commit_position) for s in one_by_one.commit_log.segments]
    assert [(s.base_offset, s.commit_position) for s in packed.consume_queue.segments] == [
        (s.base_offset, s.commit_position) for s in one_by_one.consume_queue.segments
    ]
    archived = await packed.read_messages(0, 100)
    units = await packed.read_units(0, 100)
    position = 0
    for offset, (record, unit) in enumerate(zip(archived, units, strict=True)):
        # Each PHYSICALOFFSET is rewritten to where the record now is; nothing else changed.
        assert decode(record).physical_offset == unit.commitlog_offset == position
        assert without_physical_offset(record) == without_physical_offset(hot[offset])
        assert (unit.size, unit.tag_hash) == (len(hot[offset]), tags_hash())
        position += len(record)
    one_by_one_records = await one_by_one.read_messages(0, 100)
    assert [decode(r).physical_offset for r in archived] == [decode(r).physical_offset for r in one_by_one_records]
    assert await check_queue_invariant(packed, reference=hot) == []
    rows = metadata.list_segments(packed.path, FileType.COMMIT_LOG)
    assert [(r.begin_timestamp, r.end_timestamp) for r in rows[:-1]] == [
        (s.min_timestamp, s.max_timestamp) for s in one_by_one.commit_log.segments[:-1]
    ]


def mangled(index: int, position: int, data: bytes) -> Callable[[RecordRun], RecordRun]:
    def mangle(run: RecordRun) -> RecordRun:
        start = int(run.sizes[:index].sum())
        run.data[start + position : start + position + len(data)] = data
        return run

    return mangle


@pytest.mark.parametrize(
    ("mangle", "error", "match"),
    [
        (mangled(3, POS_MAGIC, b"\x00\x00\x00\x01"), CorruptRecordError, "bad magic code 0x00000001.*offset 8"),
        (mangled(2, 0, (5).to_bytes(4, "big")), CorruptRecordError, "TOTALSIZE 5"),
        (mangled(4, POS_QUEUE_OFFSET, (77).to_bytes(8, "big")), ValidationError, "holds queue offset 77.*as 9"),
        (
            lambda run: RecordRun(run.first_offset, run.data, run.sizes + 1, run.tag_hashes, run.store_timestamps),
            ValidationError,
            "in total were given",
        ),
        (
            lambda run: RecordRun(
                run.first_offset, run.data[:60], np.array([60]), run.tag_hashes[:1], run.store_timestamps[:1]
            ),
            CorruptRecordError,
            "shorter than any message",
        ),
        (lambda run: run_of(6, 12), ValidationError, "expects offset 5 next, not 6"),
    ],
    ids=["magic", "totalsize", "queue-offset", "sizes", "short", "wrong-start"],
)
async def test_a_bad_run_is_refused_whole_and_nothing_is_buffered(
    memory_provider: MemoryProvider,
    metadata: MetadataStore,
    mangle: Callable[[RecordRun], RecordRun],
    error: type[Exception],
    match: str,
) -> None:
    store = FlatFileStore(memory_provider, metadata, cluster="c", broker="b", settings=SMALL)
    queue = await store.get_or_create(TOPIC, 0)
    await queue.append_records(run_of(0, 5))
    await queue.commit()
    bad = mangle(run_of(5, 12))
    before = bytes(bad.data)
    with pytest.raises(error, match=match):
        await queue.append_records(bad)
    assert (queue.append_offset, queue.has_pending) == (5, False)
    assert bytes(bad.data) == before, "a refused run is not rewritten"
    await queue.append_records(run_of(5, 12))
    assert await queue.commit() == 12
    assert await check_queue_invariant(queue) == []


async def test_a_hot_batch_is_archived_as_it_is(
    tmp_path: Path, memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    config = LocalStoreConfig(commit_log_file_size=64 << 10, max_message_size=16 << 10, consume_queue_units_per_file=10)
    with LocalMessageStore(tmp_path, config=config) as hot:
        hot.put_messages(
            PutRequest(TOPIC, n % 2, bytes([n]) * (50 + n * 13), tags=f"t{n % 3}" if n % 2 else None)
            for n in range(120)
        )
        reference = {m.queue_offset: m for m in hot.read_messages(TOPIC, 1, 0, 1000, 1 << 30)}
        store = FlatFileStore(memory_provider, metadata, cluster="c", broker="b", settings=SMALL)
        queue = await store.get_or_create(TOPIC, 1)
        offset = 0
        while len(batch := hot.read_batch(TOPIC, 1, offset, 7, 1 << 30)):
            await queue.append_records(batch)
            offset = batch.next_offset
    assert await queue.commit() == len(reference) == 60
    units = await queue.read_units(0, 100)
    for record, unit in zip(await queue.read_messages(0, 100), units, strict=True):
        message = decode(record)
        hot_message = reference[message.queue_offset]
        assert message.physical_offset == unit.commitlog_offset
        assert without_physical_offset(record) == without_physical_offset(hot_message.raw)
        assert (unit.size, unit.tag_hash) == (hot_message.unit.size, hot_message.unit.tag_hash)
    assert await check_queue_invariant(queue, reference={k: m.raw for k, m in reference.items()}) == []
