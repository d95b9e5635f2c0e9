"""The invariant checker finds each kind of damage, says where, and finds nothing in a sound queue."""

from __future__ import annotations

import struct

import pytest

from tieredstore.flat import FlatFileStore, FlatMessageFile, ProblemKind, check_queue_invariant
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import POS_QUEUE_OFFSET, rewrite_physical_offset
from tieredstore.metadata import MetadataStore
from tieredstore.providers.memory import MemoryProvider

from .helpers import BASE_TIMESTAMP, TOPIC, append_range, make_record, tags_hash


async def sound_queue(
    provider: MemoryProvider, metadata: MetadataStore, count: int = 6
) -> tuple[FlatMessageFile, dict[int, bytes]]:
    queue = await FlatFileStore(provider, metadata, cluster="c", broker="b").get_or_create(TOPIC, 0)
    hot = await append_range(queue, 0, count)
    await queue.commit()
    return queue, hot


async def raw_append(queue: FlatMessageFile, record: bytes, unit: ConsumeQueueUnit | None = None) -> None:
    """Write past the FlatMessageFile's checks, as a buggy archiver would."""
    offset = await queue.commit_log.append(record, BASE_TIMESTAMP)
    if unit is not None:
        await queue.consume_queue.append_unit(
            ConsumeQueueUnit(offset if unit.commitlog_offset < 0 else unit.commitlog_offset, unit.size, unit.tag_hash),
            BASE_TIMESTAMP,
        )
    await queue.commit()


def kinds(problems: list) -> list[ProblemKind]:  # type: ignore[type-arg]
    return [p.kind for p in problems]


async def test_a_sound_queue_has_no_problem(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    queue, hot = await sound_queue(memory_provider, metadata)
    assert await check_queue_invariant(queue, reference=hot, batch=4) == []
    assert await check_queue_invariant(queue, reference=hot.get) == []


async def test_reference_mismatch_and_missing(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    queue, hot = await sound_queue(memory_provider, metadata)
    other = dict(hot)
    changed = bytearray(other[2])
    changed[-3] ^= 0xFF
    other[2] = bytes(changed)
    del other[4]
    problems = await check_queue_invariant(queue, reference=other)
    assert [(p.kind, p.queue_offset) for p in problems] == [
        (ProblemKind.REFERENCE_MISMATCH, 2),
        (ProblemKind.REFERENCE_MISSING, 4),
    ]
    # PHYSICALOFFSET alone may differ: the hot and cold commit logs put the record at different places.
    assert (
        await check_queue_invariant(queue, reference={o: rewrite_physical_offset(r, 1) for o, r in hot.items()}) == []
    )


async def test_corrupt_body_is_reported_with_its_location(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue, _ = await sound_queue(memory_provider, metadata)
    unit = (await queue.read_units(3, 1))[0]
    key = queue.commit_log.segments[0].key
    memory_provider.volume[key][unit.commitlog_offset + 90] ^= 0x55  # the body starts at byte 88
    problems = await check_queue_invariant(queue)
    assert kinds(problems) == [ProblemKind.CORRUPT_RECORD]
    assert (problems[0].queue_offset, problems[0].commitlog_offset) == (3, unit.commitlog_offset)
    assert "CRC" in problems[0].detail and "TopicA/0 queue offset 3" in str(problems[0])


async def test_a_message_archived_twice_is_an_overlap_and_an_offset_mismatch(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue, _ = await sound_queue(memory_provider, metadata)
    previous = (await queue.read_units(5, 1))[0]
    await queue.consume_queue.append_unit(previous, BASE_TIMESTAMP)  # offset 6 points at offset 5's bytes
    await queue.consume_queue.commit()
    assert set(kinds(await check_queue_invariant(queue))) >= {
        ProblemKind.COMMIT_LOG_OVERLAP,
        ProblemKind.QUEUE_OFFSET_MISMATCH,
    }


async def test_unreferenced_bytes_between_and_after_records(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue, _ = await sound_queue(memory_provider, metadata)
    await raw_append(queue, b"\x00" * 64)  # bytes no unit will reference
    record = rewrite_physical_offset(make_record(6), queue.commit_log.append_offset)
    await raw_append(queue, record, ConsumeQueueUnit(-1, len(record), tags_hash()))
    await raw_append(queue, b"\x01" * 10)
    queue._position = metadata.get_queue(TOPIC, 0)  # positions were recorded by the raw commits
    problems = await check_queue_invariant(queue)
    assert [(p.kind, p.queue_offset) for p in problems] == [
        (ProblemKind.COMMIT_LOG_GAP, 6),
        (ProblemKind.ORPHAN_BYTES, None),
    ]
    assert problems[1].commitlog_offset == queue.commit_log.commit_offset - 10


@pytest.mark.parametrize(
    ("mutate_record", "mutate_unit", "expected"),
    [
        (
            lambda r, pos: r[:POS_QUEUE_OFFSET] + struct.pack(">q", 99) + r[POS_QUEUE_OFFSET + 8 :],
            None,
            ProblemKind.QUEUE_OFFSET_MISMATCH,
        ),
        (lambda r, pos: r, None, ProblemKind.PHYSICAL_OFFSET_MISMATCH),
        (None, lambda u: ConsumeQueueUnit(u.commitlog_offset, u.size, 12345), ProblemKind.TAG_HASH_MISMATCH),
        (None, lambda u: ConsumeQueueUnit(u.commitlog_offset, u.size - 5, u.tag_hash), ProblemKind.SIZE_MISMATCH),
        (
            None,
            lambda u: ConsumeQueueUnit(u.commitlog_offset, u.size + 4000, u.tag_hash),
            ProblemKind.COMMIT_LOG_MISSING,
        ),
    ],
    ids=["queue-offset", "physical-offset", "tag-hash", "size", "bytes-missing"],
)
async def test_record_and_unit_disagreements(
    memory_provider: MemoryProvider,
    metadata: MetadataStore,
    mutate_record: object,
    mutate_unit: object,
    expected: ProblemKind,
) -> None:
    queue, _ = await sound_queue(memory_provider, metadata)
    position = queue.commit_log.append_offset
    record = make_record(6)
    if mutate_record is None:
        record = rewrite_physical_offset(record, position)
    else:
        record = mutate_record(record, position)  # type: ignore[operator]
        if expected is not ProblemKind.PHYSICAL_OFFSET_MISMATCH:
            record = rewrite_physical_offset(record, position)
    unit = ConsumeQueueUnit(position, len(record), tags_hash())
    if mutate_unit is not None:
        unit = mutate_unit(unit)  # type: ignore[operator]
    await raw_append(queue, record, unit)
    queue._position = metadata.get_queue(TOPIC, 0)
    problems = await check_queue_invariant(queue)
    assert expected in kinds(problems)
    assert all(p.queue_offset in (6, None) for p in problems)


async def test_record_of_another_queue(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    queue, _ = await sound_queue(memory_provider, metadata)
    position = queue.commit_log.append_offset
    record = rewrite_physical_offset(make_record(6, queue_id=3), position)
    await raw_append(queue, record, ConsumeQueueUnit(position, len(record), tags_hash()))
    queue._position = metadata.get_queue(TOPIC, 0)
    assert kinds(await check_queue_invariant(queue)) == [ProblemKind.WRONG_QUEUE]


async def test_metadata_that_disagrees_with_the_files(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    queue, _ = await sound_queue(memory_provider, metadata)
    queue._position = metadata.update_queue(TOPIC, 0, expected_version=queue.position.version, max_offset=9)
    problems = await check_queue_invariant(queue)
    assert kinds(problems) == [ProblemKind.OFFSET_RANGE]


async def test_empty_queue_with_commit_log_bytes_has_orphans(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue = await FlatFileStore(memory_provider, metadata, cluster="c", broker="b").get_or_create(TOPIC, 0)
    await raw_append(queue, b"\x00" * 30)
    queue._position = metadata.get_queue(TOPIC, 0)
    assert kinds(await check_queue_invariant(queue)) == [ProblemKind.ORPHAN_BYTES]
