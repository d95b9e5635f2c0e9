"""The key-index entries the archiver makes from a hot batch: exactly the records whose properties carry keys."""

from __future__ import annotations

from typing import Any

from tieredstore.dispatcher import Dispatcher
from tieredstore.errors import StorageError
from tieredstore.flat import FlatFileStore
from tieredstore.formats.message import decode, store_timestamp_of
from tieredstore.index import IndexEntry

from .helpers import Archive


async def test_only_records_whose_properties_carry_keys_are_indexed_with_their_own_fields(archive: Archive) -> None:
    hot = archive.hot
    for n in range(40):
        keys = [f"k{n}", f"alt{n}"] if n % 3 == 0 else []
        # Marker bytes in a body are not keys: such a record must not be indexed.
        body = b"KEYS\x01not-a-key\x02UNIQ_KEY\x01nor-this" if n % 5 == 0 else bytes([n]) * (50 + n)
        properties = {"UNIQ_KEY": f"U{n}"} if n % 7 == 0 else None
        hot.put_message("Mixed", 1, body, keys=keys, tags="t" if n % 2 else None, properties=properties)
    put: list[IndexEntry] = []
    original = archive.index.put

    async def recording_put(entries: list[IndexEntry], *args: Any, **kwargs: Any) -> Any:
        put.extend(entries)
        return await original(entries, *args, **kwargs)

    archive.index.put = recording_put  # type: ignore[method-assign]
    dispatcher = archive.dispatcher(group_commit_count=9, group_commit_timeout=0)
    await dispatcher.run_once()

    expected = []
    for message in hot.read_messages("Mixed", 1, 0, 100, 1 << 30):
        record = decode(message.raw)
        keys = (*record.keys, *([record.properties["UNIQ_KEY"]] if "UNIQ_KEY" in record.properties else []))
        if keys:
            expected.append((message.queue_offset, keys, len(message.raw), store_timestamp_of(message.raw)))
    assert len(expected) == len([n for n in range(40) if n % 3 == 0 or n % 7 == 0])
    assert sorted((e.queue_offset, e.keys, e.size, e.timestamp) for e in put) == expected
    assert {e.queue_id for e in put} == {1} and {e.topic for e in put} == {"Mixed"}


async def test_messages_archived_but_not_recorded_before_a_crash_are_indexed_at_start(archive: Archive) -> None:
    """A crash between the consume-queue commit and the metadata record: start() re-indexes what recovery found."""
    archive.put("Crashed", 0, 30, keyed=True)
    unindexed = Dispatcher(archive.hot, archive.flat, metadata=archive.metadata, index=None)
    await unindexed.run_once()
    position = archive.metadata.get_queue("Crashed", 0)
    assert position.max_offset == 30
    # As if the last commits' metadata records never happened: positions say 12, the files hold 30.
    archive.metadata.record_commit("Crashed", 0, expected_version=position.version, max_offset=12)
    flat = FlatFileStore(archive.provider, archive.metadata, cluster="TestCluster", broker="broker-a")
    restarted = Dispatcher(archive.hot, flat, metadata=archive.metadata, index=archive.index)
    await restarted.start()
    assert archive.metadata.get_queue("Crashed", 0).max_offset == 30
    topic_id = archive.metadata.get_topic("Crashed").id

    async def confirm(_topic_id: int, queue_id: int, queue_offset: int) -> list[str]:
        return archive.hot.get_message("Crashed", queue_id, queue_offset).keys

    for offset in (12, 20, 29):  # re-indexed
        hits = await archive.index.query("Crashed", topic_id, f"Crashed-0-{offset}", 10, 0, 1 << 62, confirm)
        assert [(h.queue_id, h.queue_offset) for h in hits] == [(0, offset)]
    # Below the recorded position nothing is re-indexed (those entries were put at their own commit).
    assert await archive.index.query("Crashed", topic_id, "Crashed-0-5", 10, 0, 1 << 62, confirm) == []


async def test_entries_whose_put_failed_go_in_before_shutdown_records_the_position(archive: Archive) -> None:
    """Shutdown records the position of a queue whose last commit failed after its files were durable. Its
    key-index entries must go in first: once metadata records the messages, nothing re-indexes them."""
    archive.put("Keyed", 0, 10, keyed=True)
    put: list[IndexEntry] = []
    original = archive.index.put
    failures_left = [1]

    async def failing_once(entries: list[IndexEntry], *args: Any, **kwargs: Any) -> Any:
        if failures_left[0]:
            failures_left[0] -= 1
            raise StorageError("the key index is unreachable")
        put.extend(entries)
        return await original(entries, *args, **kwargs)

    archive.index.put = failing_once  # type: ignore[method-assign]
    dispatcher = archive.dispatcher(group_commit_count=100, group_commit_timeout=0, retry_initial_backoff=60)
    await dispatcher.scan(force=True)
    assert [(q.archived_offset, q.failures) for q in dispatcher.status()] == [(10, 1)]
    assert archive.metadata.get_queue("Keyed", 0).max_offset == 0
    await dispatcher.shutdown()
    assert archive.metadata.get_queue("Keyed", 0).max_offset == 10
    assert sorted(entry.queue_offset for entry in put) == list(range(10))
