"""Regressions the archiver-level reliability runs found in the container layer, each pinned at its smallest.

1. A metadata failure while the consume queue rolled, inside ``FlatMessageFile.append`` after the
   record was buffered in the commit log: the retried append wrote the record a second time and the
   first copy stayed as unreferenced bytes (COMMIT_LOG_GAP). Found by the PostgreSQL restart run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.reliability.workload import append_records, make_record, new_flat_store
from tieredstore.errors import MetadataError
from tieredstore.flat import FlatFileSettings, check_queue_invariant
from tieredstore.flat.message_file import RecordRun
from tieredstore.formats.message import tag_hash
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore
from tieredstore.providers.memory import MemoryProvider

UNITS_PER_SEGMENT = 4


@pytest.fixture
def memory_provider() -> Iterator[MemoryProvider]:
    name = f"regression-{uuid.uuid4().hex}"
    yield MemoryProvider(f"memory://{name}")
    MemoryProvider.wipe(name)


async def test_a_metadata_failure_while_the_consume_queue_rolls_does_not_duplicate_the_record(
    metadata: MetadataStore, memory_provider: MemoryProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = FlatFileSettings(consume_queue_max_size=UNITS_PER_SEGMENT * 20)
    store = new_flat_store(memory_provider, metadata, settings)
    queue = await store.get_or_create("RollFailure", 0)
    reference = await append_records(queue, 0, UNITS_PER_SEGMENT)
    assert await queue.commit() == UNITS_PER_SEGMENT

    add_segment = metadata.add_segment

    def database_down(path: str, file_type: str, *args: Any, **kwargs: Any) -> Any:
        if file_type == FileType.CONSUME_QUEUE:
            raise MetadataError("metadata database failed to add a segment: OperationalError: server closed")
        return add_segment(path, file_type, *args, **kwargs)

    monkeypatch.setattr(metadata, "add_segment", database_down)
    record = make_record(UNITS_PER_SEGMENT, topic="RollFailure")
    with pytest.raises(MetadataError):  # the consume queue is full: the append must roll it, and cannot
        await queue.append_records(RecordRun.of([(record, UNITS_PER_SEGMENT, 0, tag_hash("TagA"))]))
    monkeypatch.undo()

    # What the dispatcher does next: commit what is buffered, then append from the archived offset again.
    assert await queue.commit() == UNITS_PER_SEGMENT
    reference |= await append_records(queue, UNITS_PER_SEGMENT, UNITS_PER_SEGMENT * 3)
    assert await queue.commit() == UNITS_PER_SEGMENT * 3
    assert await check_queue_invariant(queue, reference=reference) == []
    restarted = new_flat_store(memory_provider, metadata, settings)
    await restarted.recover()
    assert await check_queue_invariant(restarted.get("RollFailure", 0), reference=reference) == []
