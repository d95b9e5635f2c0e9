"""Queues of one FlatFileStore that commit together record their positions in shared metadata transactions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sqlalchemy import event

from tieredstore.errors import ConcurrentUpdateError, MetadataUnavailableError
from tieredstore.flat import FlatFileStore, FlatMessageFile
from tieredstore.metadata import MetadataStore
from tieredstore.providers.memory import MemoryProvider

from .helpers import TOPIC, append_range

QUEUES = 16


@pytest.fixture
def write_transactions(metadata: MetadataStore) -> Iterator[list[str]]:
    """The SQLite write transactions begun on the store's engine (``BEGIN IMMEDIATE``), one entry each."""
    seen: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if statement.startswith("BEGIN IMMEDIATE"):
            seen.append(statement)

    event.listen(metadata.engine, "before_cursor_execute", count)
    yield seen
    event.remove(metadata.engine, "before_cursor_execute", count)


async def _filled_queues(provider: MemoryProvider, metadata: MetadataStore, count: int) -> list[FlatMessageFile]:
    store = FlatFileStore(provider, metadata, cluster="c", broker="b")
    queues = [await store.get_or_create(TOPIC, queue_id) for queue_id in range(count)]
    for queue in queues:
        await append_range(queue, 0, 10 + queue.queue_id)
    return queues


async def test_queues_committing_together_share_metadata_transactions(
    memory_provider: MemoryProvider, metadata: MetadataStore, write_transactions: list[str]
) -> None:
    queues = await _filled_queues(memory_provider, metadata, QUEUES)
    write_transactions.clear()
    archived = await asyncio.gather(*(queue.commit() for queue in queues))
    assert archived == [10 + queue_id for queue_id in range(QUEUES)]
    # The first commit to arrive goes alone; the rest, arriving while it is in flight, go together.
    assert len(write_transactions) < QUEUES
    for queue in queues:
        recorded = metadata.get_queue(TOPIC, queue.queue_id)
        assert recorded == queue.position and recorded.max_offset == 10 + queue.queue_id
        rows = metadata.list_segments(queue.path, "CONSUME_QUEUE")
        assert rows[-1].size == queue.consume_queue.segments[-1].commit_position
    # The next commits go on from the positions each queue was given back.
    for queue in queues:
        await append_range(queue, queue.archived_offset, queue.archived_offset + 3)
    assert await asyncio.gather(*(queue.commit() for queue in queues)) == [13 + q for q in range(QUEUES)]


async def test_a_refused_queue_fails_alone(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    queues = await _filled_queues(memory_provider, metadata, 4)
    # Another writer moves queue 2's row behind its back: only that queue's commit is refused.
    metadata.record_commit(TOPIC, 2, expected_version=queues[2].position.version)
    results = await asyncio.gather(*(queue.commit() for queue in queues), return_exceptions=True)
    assert isinstance(results[2], ConcurrentUpdateError)
    assert [results[0], results[1], results[3]] == [10, 11, 13]
    assert [metadata.get_queue(TOPIC, q).max_offset for q in range(4)] == [10, 11, 0, 13]


async def test_a_database_failure_fails_every_commit_of_its_transaction(
    memory_provider: MemoryProvider, metadata: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    queues = await _filled_queues(memory_provider, metadata, 4)

    def unreachable(*_args: object) -> None:
        raise MetadataUnavailableError("metadata database cannot be reached (update queues)")

    monkeypatch.setattr(metadata, "record_commits", unreachable)
    results = await asyncio.gather(*(queue.commit() for queue in queues), return_exceptions=True)
    assert all(isinstance(result, MetadataUnavailableError) for result in results)
    monkeypatch.undo()
    # The files are committed; the positions are recorded by the next commit.
    assert [queue.position.max_offset for queue in queues] == [0, 0, 0, 0]
    assert await asyncio.gather(*(queue.commit() for queue in queues)) == [10, 11, 12, 13]
    assert [metadata.get_queue(TOPIC, q).max_offset for q in range(4)] == [10, 11, 12, 13]
