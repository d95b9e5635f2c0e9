"""The dispatcher archives only the topics its filter admits: no lag gauge, no cold data, no wait for the others."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.archiver.helpers import Archive, open_archive
from tests.read.helpers import make_config
from tieredstore.config import ArchiverSettings
from tieredstore.dispatcher import Dispatcher
from tieredstore.formats.naming import INDEX_TOPIC, cluster_folder
from tieredstore.local import LocalStoreConfig
from tieredstore.metrics import Metrics
from tieredstore.store import AsyncTieredMessageStore
from tieredstore.topic_filter import Exclusion, TopicFilter

ARCHIVED = ("Orders", "%RETRY%billing")
NOT_ARCHIVED = ("rmq_sys_x", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC")


@pytest.fixture
async def expiring(tmp_path: Path) -> AsyncIterator[Archive]:
    """An archive whose 64 KiB hot files may be deleted as soon as they are archived (no retention time)."""
    hot_config = LocalStoreConfig(commit_log_file_size=64 << 10, max_message_size=16 << 10, hot_retention_hours=0)
    async with open_archive(tmp_path, hot_config) as parts:
        yield parts


def lag_gauge_topics(archive: Archive) -> set[str]:
    return {
        sample.labels["topic"]
        for metric in archive.metrics.registry.collect()
        if metric.name == "tieredstore_queue_lag_messages"
        for sample in metric.samples
    }


async def test_system_topics_get_no_cold_data_no_lag_gauge_and_do_not_hold_back_hot_retention(
    expiring: Archive,
) -> None:
    archive = expiring
    for n in range(60):  # interleaved, so every hot file holds messages of every topic
        for topic in ARCHIVED + NOT_ARCHIVED:
            archive.hot.put_message(topic, 0, bytes([n]) * 1000)
    archive.hot.flush()
    files_before = len(list((archive.root / "hot" / "commitlog").iterdir()))
    assert files_before >= 5
    dispatcher = archive.dispatcher(group_commit_timeout=0)

    result = await asyncio.wait_for(dispatcher.run_once(), timeout=30)
    assert result.failed == {}
    assert result.stats.messages == 60 * len(ARCHIVED)
    broker_folder = f"{cluster_folder('TestCluster')}/broker-a"
    assert set(await archive.provider.list_children(broker_folder)) - {INDEX_TOPIC} == set(ARCHIVED)
    assert {topic.name for topic in archive.metadata.list_topics()} == set(ARCHIVED)
    assert {queue.topic for queue in dispatcher.status()} == set(ARCHIVED)
    assert lag_gauge_topics(archive) == set(ARCHIVED)
    for topic in ARCHIVED:
        assert await archive.check(topic, 0) == []

    # Every hot file but the one being written goes: nothing in them waits for the archive.
    await dispatcher.maintain()
    assert len(list((archive.root / "hot" / "commitlog").iterdir())) == 1
    assert archive.hot.min_offset("rmq_sys_x", 0) > 0


async def test_exclude_globs_stop_a_topic_that_was_archived_and_its_lag_is_no_longer_reported(
    archive: Archive,
) -> None:
    archive.put("Audit", 0, 5)
    archive.put("Orders", 0, 5)
    assert (await archive.dispatcher(group_commit_timeout=0).run_once()).stats.messages == 10

    archive.put("Audit", 0, 5)
    archive.put("Orders", 0, 5)
    archive.metrics = Metrics()  # a restarted archiver's
    dispatcher = archive.dispatcher(group_commit_timeout=0, topics_exclude=("Aud?t",))
    assert (await dispatcher.run_once()).stats.messages == 5
    assert (archive.archived("Audit", 0), archive.archived("Orders", 0)) == (5, 10)
    assert lag_gauge_topics(archive) == {"Orders"}
    assert await archive.check("Audit", 0) == []  # what was archived stays whole and readable


async def test_the_writers_hot_retention_does_not_wait_for_topics_not_archived(tmp_path: Path) -> None:
    """The hot store's writer deletes archived files by the offsets in metadata, which never has the system
    topics' (``AsyncTieredMessageStore.delete_expired_hot``, used when the archiver is another process)."""
    config = make_config(tmp_path, hot={"commit_log_file_size": 64 << 10, "hot_retention_hours": 0})
    async with AsyncTieredMessageStore.open(config, owns_cold=True) as store:
        for n in range(50):
            for topic in ("Orders", "rmq_sys_x"):
                await store.put_message(topic, 0, bytes([n]) * 3000)
        assert (await Dispatcher.from_runtime(store.runtime).run_once()).stats.messages == 50
        assert [topic.name for topic in store.runtime.metadata.list_topics()] == ["Orders"]
        files = sorted((config.hot_dir / "commitlog").iterdir())
        assert len(files) >= 4
        report = await store.delete_expired_hot()
        assert report.commit_log_files == [file.name for file in files[:-1]]


def test_the_filter_decides_by_reason_in_a_fixed_order() -> None:
    topics = TopicFilter.of(
        ArchiverSettings(topics_include=("Orders*", "rmq_sys_*", "TBW102"), topics_exclude=("*Test",)),
        cluster="EastCluster",
        broker="broker-east",
    )
    assert topics.exclusion("Orders") is None
    assert topics.exclusion("OrdersTest") is Exclusion.EXCLUDED
    assert topics.exclusion("Payments") is Exclusion.NOT_INCLUDED
    # System topics stay out even when a glob includes them, and whatever the glob says.
    for system in ("rmq_sys_wheel_timer", "TBW102", "EastCluster", "broker-east", "EastCluster_REPLY_TOPIC"):
        assert topics.exclusion(system) is Exclusion.SYSTEM, system
    everything = TopicFilter.of(ArchiverSettings(archive_system_topics=True), cluster="EastCluster", broker="b")
    assert everything.archives("SCHEDULE_TOPIC_XXXX") and everything.archives("rmq_sys_REVIVE_LOG_EastCluster")
    # The key index's folder in cold storage is never a hot topic's.
    assert everything.exclusion(INDEX_TOPIC) is Exclusion.RESERVED
    default = TopicFilter.of(ArchiverSettings(), cluster="DefaultCluster", broker="broker-a")
    assert [t for t in ("%RETRY%g", "%DLQ%g", "Orders", "BenchmarkTest") if default.archives(t)] == [
        "%RETRY%g",
        "%DLQ%g",
        "Orders",
    ]
