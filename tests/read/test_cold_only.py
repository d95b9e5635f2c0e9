"""A cold-only store beside an archiver: it reads through read-only views, sees later commits, changes nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.fixtures.backends import ProviderBackend
from tests.read.helpers import archive_hot, config_for_backend, make_config
from tieredstore.errors import InvalidQueueError, InvalidTopicError, ReadOnlyError
from tieredstore.fetcher import GetMessageStatus
from tieredstore.formats.naming import FileType, queue_path
from tieredstore.providers.s3 import S3Provider
from tieredstore.store import AsyncTieredMessageStore

TOPIC = "ColdOnly"


def cold_listing(cold_dir: Path) -> dict[str, tuple[int, str]]:
    """Every object under the cold root: size and content hash."""
    return {
        str(path.relative_to(cold_dir)): (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
        for path in sorted(cold_dir.rglob("*"))
        if path.is_file()
    }


async def test_cold_only_store_sees_later_commits_and_never_modifies_cold_storage(tmp_path: Path) -> None:
    archiver_config = make_config(tmp_path / "archiver")
    cold_dir = archiver_config.data_dir / "cold"
    # Another machine: its own data directory, the archiver's cold storage and metadata database.
    reader_config = make_config(
        tmp_path / "reader", cold_url=str(cold_dir), metadata_url=archiver_config.effective_metadata_url
    )
    async with AsyncTieredMessageStore.open(archiver_config, owns_cold=True) as archiver:
        for n in range(50):
            await archiver.put_message(TOPIC, 0, f"first {n}".encode())
        for n in range(10):
            await archiver.put_message(TOPIC, 1, f"other {n}".encode())
        await archive_hot(archiver.runtime, TOPIC, 0)
        await archive_hot(archiver.runtime, TOPIC, 1)
        # The archiver is between writing queue 1's next commit-log bytes and recording them in metadata:
        # recovery would cut these bytes; a reader must leave them alone.
        commit_log_dir = cold_dir / queue_path(archiver_config.cluster, archiver_config.broker, TOPIC, 1)
        last_segment = max((commit_log_dir / FileType.COMMIT_LOG.value).iterdir(), key=lambda p: p.name[8:])
        with last_segment.open("ab") as handle:
            handle.write(b"\x00" * 137)
        before = cold_listing(cold_dir)

        async with AsyncTieredMessageStore.open(reader_config, hot=False) as reader:
            first = await reader.get_messages(TOPIC, 0, 0, max_count=100)
            assert first.status is GetMessageStatus.FOUND
            assert [m.body for m in first.messages] == [f"first {n}".encode() for n in range(50)]
            assert {m.tier for m in first.messages} == {"cold"}
            other = await reader.get_messages(TOPIC, 1, 0, max_count=100)
            assert [m.queue_offset for m in other.messages] == list(range(10))
            at_end = await reader.get_messages(TOPIC, 0, 50)
            assert at_end.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
            assert cold_listing(cold_dir) == before
            # A cold-only store looks for later commits before answering a max offset: bad names are still
            # the typed errors, not whatever a lookup keyed by them raises.
            with pytest.raises(InvalidTopicError):
                await reader.get_max_offset([TOPIC], 0)  # type: ignore[arg-type]
            with pytest.raises(InvalidQueueError):
                await reader.get_max_offset(TOPIC, [0])  # type: ignore[arg-type]

            # The archiver commits more; the reader, at its view's end, sees them.
            for n in range(50, 80):
                await archiver.put_message(TOPIC, 0, f"later {n}".encode())
            await archive_hot(archiver.runtime, TOPIC, 0)
            assert await reader.get_max_offset(TOPIC, 0) == 80
            later = await reader.get_messages(TOPIC, 0, 50, max_count=100)
            assert later.status is GetMessageStatus.FOUND
            assert [m.body for m in later.messages] == [f"later {n}".encode() for n in range(50, 80)]
            after_commit = cold_listing(cold_dir)
            assert await reader.get_messages(TOPIC, 0, 75, max_count=100) is not None
            assert await reader.offset_for_timestamp(TOPIC, 0, 0) == 0
        assert cold_listing(cold_dir) == after_commit
        assert after_commit[str(last_segment.relative_to(cold_dir))] == before[str(last_segment.relative_to(cold_dir))]


async def test_a_producer_facade_beside_the_archiver_never_writes_cold_storage_or_the_index(tmp_path: Path) -> None:
    """The application owns the hot store and the archiver process follows it: opening (or re-opening) the
    application's store must not recover cold queues or maintain the key index, which would cut bytes the
    archiver committed but has not recorded yet, or delete its in-progress index files."""
    from tieredstore.dispatcher import Dispatcher
    from tieredstore.runtime import open_runtime

    config = make_config(tmp_path)
    cold_dir = config.data_dir / "cold"
    async with AsyncTieredMessageStore.open(config) as producer:
        for n in range(40):
            await producer.put_message(TOPIC, 0, f"order {n}".encode(), keys=[f"order-{n}"])
    async with open_runtime(config, hot_mode="follower") as archiver_runtime:
        result = await Dispatcher.from_runtime(archiver_runtime, settings=config.archiver).run_once()
        assert result.stats.messages == 40
    # The archiver is mid-commit: commit-log bytes not yet recorded, and a compaction's temporary file.
    commit_log_dir = cold_dir / queue_path(config.cluster, config.broker, TOPIC, 0) / FileType.COMMIT_LOG.value
    last_segment = max(commit_log_dir.iterdir(), key=lambda p: p.name[8:])
    with last_segment.open("ab") as handle:
        handle.write(b"\x00" * 211)
    in_progress = config.data_dir / "index" / "00000000000000000007.compacted.tmp"
    in_progress.write_bytes(b"half a compaction")
    before = cold_listing(cold_dir)

    async with AsyncTieredMessageStore.open(config, read_policy="FORCE") as producer:
        found = await producer.get_messages(TOPIC, 0, 0, max_count=100)
        assert [m.body for m in found.messages] == [f"order {n}".encode() for n in range(40)]
        hits = await producer.query_by_key(TOPIC, "order-17")
        assert [m.body for m in hits] == [b"order 17"]
        with pytest.raises(ReadOnlyError):
            await producer.runtime.index.maintain()
    assert cold_listing(cold_dir) == before, "the facade changed cold storage"
    assert in_progress.read_bytes() == b"half a compaction", "the facade touched the archiver's index directory"


async def test_an_application_reading_recent_messages_from_the_hot_store_queries_no_metadata(
    tmp_path: Path,
) -> None:
    """Its cold views are refreshed only where the policy would read cold storage: a consumer reading what the
    hot store holds paid a metadata query (two segment listings) on every call, ~6x its hot read."""
    from sqlalchemy import event

    config = make_config(tmp_path / "node")
    async with AsyncTieredMessageStore.open(config, owns_cold=True) as archiver:
        for n in range(40):
            await archiver.put_message(TOPIC, 0, f"old {n}".encode())
        await archive_hot(archiver.runtime, TOPIC, 0)
    async with AsyncTieredMessageStore.open(config) as app:  # the application: hot store, read-only cold views
        for n in range(40, 100):
            await app.put_message(TOPIC, 0, f"new {n}".encode())
        first = await app.get_messages(TOPIC, 0, 0, max_count=10)  # opens the queue's cold view
        assert [m.queue_offset for m in first.messages] == list(range(10))
        assert (await app.fetcher.offsets(TOPIC, 0)).cold_max == 40
        statements: list[str] = []
        event.listen(app.runtime.metadata.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
        offset, served = 40, []
        while offset < 100:
            result = await app.get_messages(TOPIC, 0, offset, max_count=7)
            served += [(m.queue_offset, m.tier) for m in result.messages]
            offset = result.next_begin_offset
        assert served == [(n, "hot") for n in range(40, 100)]
        assert statements == []
        # Where the policy reads cold storage, the view still looks for later commits at its end.
        assert (await app.get_messages(TOPIC, 0, 100)).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        assert statements != []


async def test_a_reader_polling_at_a_queues_end_reads_one_metadata_row_until_something_is_committed(
    tmp_path: Path,
) -> None:
    """At the end of its view a cold reader looks for later commits on every call: with nothing new, that
    is the queue's row alone (reloading the view's segment rows cost ~3x more), and a commit is seen."""
    from sqlalchemy import event

    config = make_config(tmp_path / "node")
    async with AsyncTieredMessageStore.open(config, owns_cold=True) as archiver:
        for n in range(20):
            await archiver.put_message(TOPIC, 0, f"old {n}".encode())
        await archive_hot(archiver.runtime, TOPIC, 0)
        async with AsyncTieredMessageStore.open(config, hot=False) as reader:
            assert len((await reader.get_messages(TOPIC, 0, 0, 32)).messages) == 20
            statements: list[str] = []
            event.listen(
                reader.runtime.metadata.engine, "before_cursor_execute", lambda *args: statements.append(args[2])
            )
            for _poll in range(3):
                assert (await reader.get_messages(TOPIC, 0, 20)).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
            queries = [text for text in statements if text.lstrip().upper().startswith("SELECT")]
            assert len(queries) == 3 and all("FROM queues" in text for text in queries)
            for n in range(20, 25):
                await archiver.put_message(TOPIC, 0, f"new {n}".encode())
            await archive_hot(archiver.runtime, TOPIC, 0)
            fresh = await reader.get_messages(TOPIC, 0, 20, 32)
            assert [m.body for m in fresh.messages] == [f"new {n}".encode() for n in range(20, 25)]
            assert await reader.get_max_offset(TOPIC, 0) == 25


@pytest.mark.parametrize("provider_factory", ["s3"], indirect=True)
async def test_an_opened_store_has_its_s3_client_built_before_the_first_read(
    tmp_path: Path, provider_factory: ProviderBackend
) -> None:
    """Opening prepares the provider: a consumer's first cold read does not spend tens of ms building a client."""
    config = config_for_backend(tmp_path, provider_factory)
    async with AsyncTieredMessageStore.open(config, hot=False) as store:
        provider = store.runtime.provider
        assert isinstance(provider, S3Provider)
        assert provider.created_sync_client is not None
        unknown = await store.get_messages("Nothing", 0, 0)
        assert unknown.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        assert provider.created_sync_client is not None
