"""The key index of archivers that share queues by lease: a namespace each, queried and swept as one index.

Archivers with leases used to write no key index at all (PostgreSQL's default setup found nothing by
key). Each now claims a namespace ``<node>-<slot>`` by flock in the data directory; readers merge all
namespaces; a namespace left behind by an archiver that is gone is sealed and uploaded by another.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.read.helpers import make_config
from tieredstore.basics import now_ms
from tieredstore.cli.verify import verify_archive
from tieredstore.config import TieredStoreConfig
from tieredstore.dispatcher import Dispatcher
from tieredstore.errors import IntegrityError
from tieredstore.formats.naming import FileType, index_path
from tieredstore.index import IndexFileStatus, IndexHit
from tieredstore.index.namespaces import claim_namespace, node_id
from tieredstore.index.service import namespace_path
from tieredstore.leases import LeaseManager
from tieredstore.local import LocalMessageStore
from tieredstore.metadata import IndexFileStatus as RowStatus
from tieredstore.metadata import MetadataStore, upgrade
from tieredstore.read.node import open_read_node
from tieredstore.runtime import Runtime, open_hot_store, open_runtime

TOPIC = "Orders"
QUEUES = 4


def test_claims_take_the_lowest_free_slot_and_a_released_slot_is_taken_back(tmp_path: Path) -> None:
    base = tmp_path / "index"
    first, second = claim_namespace(base), claim_namespace(base)
    node = node_id(base)
    assert (first.name, second.name) == (f"{node}-1", f"{node}-2")
    assert first.directory == base / first.name
    first.release()
    again = claim_namespace(base)  # a restarted archiver gets its slot, and its files, back
    assert again.name == f"{node}-1"
    assert claim_namespace(base).name == f"{node}-3"
    assert node_id(base) == node  # made once per data directory


def test_a_damaged_node_id_is_a_clear_error(tmp_path: Path) -> None:
    base = tmp_path / "index"
    base.mkdir()
    (base / "node-id").write_text("../../etc\n")
    with pytest.raises(IntegrityError, match="not a key-index node id"):
        claim_namespace(base)


def _config(tmp_path: Path, metadata_url: str) -> TieredStoreConfig:
    config = make_config(tmp_path, metadata_url=metadata_url)
    archiver = config.archiver.model_copy(
        update={"leases": True, "lease_duration": 3.0, "lease_renew_interval": 1.0, "group_commit_timeout": 0}
    )
    return config.model_copy(update={"archiver": archiver})


def _produce(hot: LocalMessageStore, first: int, count: int) -> None:
    for queue_id in range(QUEUES):
        for n in range(first, first + count):
            hot.put_message(TOPIC, queue_id, f"body {queue_id}/{n}".encode(), keys=[f"order-{queue_id}-{n}", "every"])


@contextlib.asynccontextmanager
async def _two_nodes(tmp_path: Path, metadata_url: str) -> AsyncIterator[tuple[LocalMessageStore, Runtime, Runtime]]:
    """The hot store's writer (20 messages in each queue) and two archiver nodes following it, each with a namespace."""
    config = _config(tmp_path, metadata_url)
    upgrade(config.effective_metadata_url)
    with open_hot_store(config) as producer:
        _produce(producer, 0, 20)
        async with (
            open_runtime(config, hot_mode="follower", shared_index=True) as a,
            open_runtime(config, hot_mode="follower", shared_index=True) as b,
        ):
            yield producer, a, b


@contextlib.asynccontextmanager
async def _archiver(
    runtime: Runtime,
    owner: str,
    *,
    clock_ms: Callable[[], int] = now_ms,
    lease_duration: float | None = None,
    renew_interval: float | None = None,
) -> AsyncIterator[Dispatcher]:
    config = runtime.config.archiver
    leases = LeaseManager(
        runtime.metadata,
        owner=owner,
        lease_duration=lease_duration or config.lease_duration,
        renew_interval=renew_interval or config.lease_renew_interval,
    )
    dispatcher = Dispatcher.from_runtime(runtime, leases=leases, clock_ms=clock_ms)
    await dispatcher.start()
    try:
        yield dispatcher
    finally:
        await dispatcher.shutdown()


async def _query(runtime: Runtime, key: str, max_count: int = 10) -> list[IndexHit]:
    topic_id = (await asyncio.to_thread(runtime.metadata.get_topic, TOPIC)).id
    assert runtime.hot is not None
    hot = runtime.hot

    async def confirm(_topic_id: int, queue_id: int, queue_offset: int) -> list[str]:
        return hot.get_message(TOPIC, queue_id, queue_offset).keys

    return await runtime.keys.query(TOPIC, topic_id, key, max_count, 0, 1 << 62, confirm)


async def test_lease_archivers_index_in_namespaces_readers_merge_and_a_gone_archivers_files_are_swept(
    tmp_path: Path, metadata_url: str
) -> None:
    async with _two_nodes(tmp_path, metadata_url) as (producer, a, b):
        config = a.config
        assert a.index.namespace != b.index.namespace and a.index.namespace.endswith("-1")
        async with _archiver(a, "a") as dispatcher:
            assert (await dispatcher.run_once()).stats.messages == QUEUES * 20
        # A stops (its leases released, its index file left local and unsealed, its slot free).
        await a.index.close()
        a_namespace = a.index.namespace
        assert a.keys.claim is not None
        a.keys.claim.release()
        a_directory = config.data_dir / "index" / a_namespace
        assert list(a_directory.glob("*.index"))
        _produce(producer, 20, 20)
        async with _archiver(b, "b") as dispatcher:
            assert (await dispatcher.run_once()).stats.messages == QUEUES * 20
        # B's maintenance found A's namespace unheld: A's items went to cold storage.
        assert not list(a_directory.glob("*.index")) and not list(a_directory.glob("*.compacted"))
        rows = [r for r in b.metadata.list_index_files() if f"/{a_namespace}/" in r.name]
        assert rows and {r.status for r in rows} == {RowStatus.UPLOAD}
        # B's own namespace is still being filled; it is B's, so nothing swept it.
        assert {r.status for r in b.index.files()} == {IndexFileStatus.UNSEALED}

        async with open_runtime(config, hot_mode="follower", cold_owner=False) as reader:
            # One message per key, from whichever archiver indexed it.
            for queue_id, n in ((0, 3), (3, 19), (1, 20), (2, 39)):
                hits = await _query(reader, f"order-{queue_id}-{n}")
                assert [(h.queue_id, h.queue_offset) for h in hits] == [(queue_id, n)]
            # A key in both namespaces: the newest messages first, each once.
            newest = await _query(reader, "every", max_count=6)
            assert len(newest) == 6 and all(h.queue_offset >= 20 for h in newest)
            assert len({(h.queue_id, h.queue_offset) for h in await _query(reader, "every", 500)}) == 160

            # Readers elsewhere (no local files at all) still find A's keys, now from cold storage.
            for path in a_directory.iterdir():
                path.unlink()
            hits = await _query(reader, "order-2-11")
            assert [(h.queue_id, h.queue_offset) for h in hits] == [(2, 11)]

            # verify checks every namespace's uploaded files against their objects.
            async with open_read_node(config) as node:
                report = await verify_archive(node)
            assert report.ok, report.problems
            assert report.index_files == len(rows)

            # Retention (the CLI's, on the root namespace) removes every namespace's expired uploads,
            # and leaves a file another archiver is still filling to that archiver.
            a_ids = [int(r.name.rsplit("/", 1)[1]) for r in rows]
            async with open_runtime(config, hot=False) as operator:
                assert sorted(await operator.keys.expired_files(1 << 62)) == sorted(a_ids)
                assert sorted(await operator.keys.delete_expired(1 << 62)) == sorted(a_ids)
                a_path = namespace_path(index_path(config.cluster, config.broker), a_namespace)
                assert await operator.provider.list_segments(a_path, FileType.INDEX) == []
            left = [r.name for r in b.metadata.list_index_files()]
            assert left and all(f"/{b.index.namespace}/" in name for name in left)
            assert await _query(reader, "order-2-11") == []
            assert [h.queue_offset for h in await _query(reader, "order-2-31")] == [31]


async def test_an_archiver_taking_a_queue_over_indexes_what_its_predecessor_committed_but_did_not_record(
    tmp_path: Path, metadata_url: str
) -> None:
    config = _config(tmp_path, metadata_url)
    upgrade(config.effective_metadata_url)
    with open_hot_store(config) as producer:
        _produce(producer, 0, 30)
        async with open_runtime(config, hot_mode="follower", shared_index=True) as runtime:
            # The predecessor committed 30 messages per queue but died before its index entries and the
            # metadata record of everything past 12 (here: it wrote no index at all).
            leases = LeaseManager(runtime.metadata, owner="gone", lease_duration=3.0, renew_interval=1.0)
            unindexed = Dispatcher(runtime.hot, runtime.flat, metadata=runtime.metadata, leases=leases)  # type: ignore[arg-type]
            await unindexed.start()
            await unindexed.run_once()
            await unindexed.shutdown()
            with MetadataStore(config.effective_metadata_url) as metadata:  # no lease fence installed
                for queue_id in range(QUEUES):
                    position = metadata.get_queue(TOPIC, queue_id)
                    metadata.record_commit(TOPIC, queue_id, expected_version=position.version, max_offset=12)
                    runtime.flat.forget(TOPIC, queue_id)
            async with _archiver(runtime, "successor") as dispatcher:
                await dispatcher.run_once()
            assert [runtime.metadata.get_queue(TOPIC, q).max_offset for q in range(QUEUES)] == [30] * QUEUES
            for queue_id, n in ((0, 12), (1, 20), (3, 29)):
                hits = await _query(runtime, f"order-{queue_id}-{n}")
                assert [(h.queue_id, h.queue_offset) for h in hits] == [(queue_id, n)]
            assert await _query(runtime, "order-0-5") == []  # below the record: indexed at its own commit
