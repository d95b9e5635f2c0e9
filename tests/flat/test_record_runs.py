"""Runs built from separate records (``RecordRun.of``) through ``append_records``: segment splits, refusals, and
failures part way through a run."""

from __future__ import annotations

from typing import Any

import pytest

from tieredstore.errors import CorruptRecordError, MetadataError, ValidationError
from tieredstore.flat import FlatFileSettings, FlatFileStore, check_queue_invariant
from tieredstore.flat.message_file import BatchRecord, RecordRun
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore
from tieredstore.providers.memory import MemoryProvider

from .helpers import BASE_TIMESTAMP, TOPIC, make_record, tags_hash

# Tiny segments: a batch of a few dozen records crosses several of each file.
SMALL = FlatFileSettings(commit_log_max_size=1000, consume_queue_max_size=100)


def batch(start: int, end: int, *, queue_id: int = 0) -> list[BatchRecord]:
    return [
        (make_record(offset, queue_id=queue_id), offset, BASE_TIMESTAMP + offset, tags_hash())
        for offset in range(start, end)
    ]


async def test_a_message_larger_than_a_segment_gets_a_segment_of_its_own(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    store = FlatFileStore(memory_provider, metadata, cluster="c", broker="b", settings=SMALL)
    queue = await store.get_or_create(TOPIC, 0)
    records = batch(0, 3)
    large = make_record(3, size=3000)
    records.append((large, 3, BASE_TIMESTAMP + 3, tags_hash()))
    records += batch(4, 6)
    await queue.append_records(RecordRun.of(records))
    assert await queue.commit() == 6
    sizes = [s.commit_position for s in queue.commit_log.segments]
    assert len(large) in sizes
    assert await check_queue_invariant(queue, reference={r[1]: r[0] for r in records}) == []


@pytest.mark.parametrize(
    ("mangle", "error", "match"),
    [
        (lambda rs: rs[:3] + rs[4:], ValidationError, "consecutive"),
        (lambda rs: [*rs[:2], (rs[2][0][:40], *rs[2][1:]), *rs[3:]], CorruptRecordError, "shorter"),
        (lambda rs: batch(7, 12), ValidationError, "expects offset 5 next, not 7"),
    ],
    ids=["gap", "truncated-record", "wrong-start"],
)
async def test_a_bad_batch_is_refused_whole_and_nothing_is_buffered(
    memory_provider: MemoryProvider, metadata: MetadataStore, mangle: Any, error: type[Exception], match: str
) -> None:
    store = FlatFileStore(memory_provider, metadata, cluster="c", broker="b", settings=SMALL)
    queue = await store.get_or_create(TOPIC, 0)
    await queue.append_records(RecordRun.of(batch(0, 5)))
    await queue.commit()
    bad = mangle(batch(5, 12))
    with pytest.raises(error, match=match):
        await queue.append_records(RecordRun.of(bad))
    assert (queue.append_offset, queue.has_pending) == (5, False)
    await queue.append_records(RecordRun.of(batch(5, 12)))
    assert await queue.commit() == 12
    assert await check_queue_invariant(queue) == []


async def test_a_metadata_failure_mid_batch_keeps_units_and_records_in_step(
    memory_provider: MemoryProvider, metadata: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FlatFileStore(memory_provider, metadata, cluster="c", broker="b", settings=SMALL)
    queue = await store.get_or_create(TOPIC, 0)
    records = batch(0, 30)
    add_segment = metadata.add_segment
    calls = {"consume queue": 0}

    def fails_on_the_second_consume_queue_segment(path: str, file_type: str, *args: Any, **kwargs: Any) -> Any:
        if file_type == FileType.CONSUME_QUEUE:
            calls["consume queue"] += 1
            if calls["consume queue"] == 2:
                raise MetadataError("metadata database failed to add a segment")
        return add_segment(path, file_type, *args, **kwargs)

    monkeypatch.setattr(metadata, "add_segment", fails_on_the_second_consume_queue_segment)
    with pytest.raises(MetadataError):
        await queue.append_records(RecordRun.of(records))
    buffered_to = queue.append_offset
    assert 0 < buffered_to < 30
    # Every record buffered in the commit log has its unit: the retry continues where the units end.
    assert queue.commit_log.append_offset == sum(len(r[0]) for r in records[:buffered_to])
    monkeypatch.setattr(metadata, "add_segment", add_segment)
    await queue.append_records(RecordRun.of(records[buffered_to:]))
    assert await queue.commit() == 30
    assert await check_queue_invariant(queue, reference={r[1]: r[0] for r in records}) == []
