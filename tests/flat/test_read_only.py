"""Read-only views of a cold queue (CLI, Spark, cold-only readers beside a running archiver): as recorded,
never repaired, never written, refreshed on demand."""

from __future__ import annotations

import pytest

from tieredstore.errors import NotFoundError, ReadOnlyError
from tieredstore.flat import FlatFileSettings, FlatFileStore, FlatMessageFile, check_queue_invariant
from tieredstore.flat.message_file import RecordRun
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import decode
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore
from tieredstore.providers.memory import MemoryProvider

from .helpers import BASE_TIMESTAMP, TOPIC, append_range, make_record

SMALL = FlatFileSettings(commit_log_max_size=1000, consume_queue_max_size=5 * UNIT_SIZE)


def new_store(provider: MemoryProvider, metadata: MetadataStore) -> FlatFileStore:
    return FlatFileStore(provider, metadata, cluster="c", broker="b", settings=SMALL)


def volume_snapshot(provider: MemoryProvider) -> dict[str, bytes]:
    return {key: bytes(value) for key, value in provider.volume.items()}


async def test_a_view_reads_what_is_recorded_and_refuses_every_write(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    writer = await new_store(memory_provider, metadata).get_or_create(TOPIC, 0)
    hot = await append_range(writer, 0, 12)
    await writer.commit()
    await writer.skip_to(16)
    hot |= await append_range(writer, 16, 20)
    await writer.commit()
    before = volume_snapshot(memory_provider)

    view = await new_store(MemoryProvider(memory_provider.url), metadata).open_read_only(TOPIC, 0)
    assert view.read_only
    assert (view.min_offset, view.archived_offset, view.lost_ranges) == (0, 20, [(12, 16)])
    assert [decode(r).queue_offset for r in await view.read_messages(9, 10)] == [9, 10, 11]
    assert await check_queue_invariant(view, reference=hot) == []

    refused = [
        view.append_records(RecordRun.of([(make_record(20), 20, BASE_TIMESTAMP, 0)])),
        view.commit(),
        view.skip_to(30),
        view.recover(),
        view.destroy_expired(BASE_TIMESTAMP * 2),
        view.destroy(),
        view.commit_log.truncate(0),
    ]
    for call in refused:
        with pytest.raises(ReadOnlyError, match="read-only"):
            await call
    assert volume_snapshot(memory_provider) == before
    assert metadata.get_queue(TOPIC, 0).max_offset == 20


async def committed_writer(provider: MemoryProvider, metadata: MetadataStore, end: int) -> FlatMessageFile:
    """The archiver's queue 0 with offsets [0, end) committed."""
    writer = await new_store(provider, metadata).get_or_create(TOPIC, 0)
    await append_range(writer, 0, end)
    await writer.commit()
    return writer


async def test_a_view_never_removes_bytes_the_archiver_has_not_recorded_yet(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    writer = await committed_writer(memory_provider, metadata, 5)
    await append_range(writer, 5, 8)
    await writer.consume_queue.commit()  # durable in storage, not yet recorded in metadata
    before = volume_snapshot(memory_provider)

    view = await new_store(MemoryProvider(memory_provider.url), metadata).open_read_only(TOPIC, 0)
    assert view.archived_offset == 5  # only what metadata records
    assert len(await view.read_messages(0, 100)) == 5
    assert volume_snapshot(memory_provider) == before  # recovery would have cut these bytes; a view must not

    await writer.commit()  # the archiver records its commit ...
    assert view.archived_offset == 5
    await view.refresh()  # ... and a refresh sees it
    assert view.archived_offset == 8
    assert [decode(r).queue_offset for r in await view.read_messages(5, 10)] == [5, 6, 7]


async def test_a_view_refreshed_if_changed_loads_again_only_after_a_commit(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    writer = await committed_writer(memory_provider, metadata, 5)
    view = await new_store(MemoryProvider(memory_provider.url), metadata).open_read_only(TOPIC, 0)
    held = view.consume_queue.held()

    assert await view.refresh(if_changed=True) is False  # nothing since it loaded: nothing loaded again
    assert view.consume_queue.held() is held and view.archived_offset == 5
    await append_range(writer, 5, 8)
    await writer.consume_queue.commit()  # in storage, not recorded yet: still nothing for a view
    assert await view.refresh(if_changed=True) is False and view.archived_offset == 5
    await writer.commit()
    assert await view.refresh(if_changed=True) is True
    assert view.archived_offset == 8
    assert [decode(r).queue_offset for r in await view.read_messages(5, 10)] == [5, 6, 7]
    assert await view.refresh() is True  # a plain refresh always loads


async def test_a_view_stops_at_the_recorded_archived_offset(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    store = new_store(memory_provider, metadata)
    writer = await store.get_or_create(TOPIC, 0)
    await append_range(writer, 0, 3)
    await writer.commit()
    position = metadata.get_queue(TOPIC, 0)
    await append_range(writer, 3, 7)
    await writer.commit()
    # Segment rows read after the position (a commit landed in between) count no more than the position says.
    rows = {
        kind: metadata.list_segments(writer.path, kind.value) for kind in (FileType.COMMIT_LOG, FileType.CONSUME_QUEUE)
    }
    view = store.read_only_file(position, rows[FileType.COMMIT_LOG], rows[FileType.CONSUME_QUEUE])
    assert view.archived_offset == 3
    assert len(await view.read_messages(0, 10)) == 3


async def test_an_unknown_queue_is_not_found(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    with pytest.raises(NotFoundError):
        await new_store(memory_provider, metadata).open_read_only(TOPIC, 9)


async def test_refresh_is_for_views_only(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    writer = await new_store(memory_provider, metadata).get_or_create(TOPIC, 0)
    with pytest.raises(ValueError, match="read-only view"):
        await writer.refresh()
