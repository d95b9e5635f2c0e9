"""Archivers sharing queues by lease lease only the topics they archive, and share only those fairly."""

from __future__ import annotations

from pathlib import Path

from tests.read.helpers import make_config
from tieredstore.config import ArchiverSettings
from tieredstore.dispatcher import Dispatcher
from tieredstore.leases import LeaseManager
from tieredstore.metadata import MetadataStore, upgrade
from tieredstore.runtime import open_runtime
from tieredstore.topic_filter import TopicFilter

QUEUES = 6


def test_queues_of_a_topic_not_archived_are_neither_leased_nor_counted_in_fair_shares(metadata_url: str) -> None:
    upgrade(metadata_url)
    archives = TopicFilter.of(ArchiverSettings(topics_exclude=("Legacy",)), cluster="c", broker="b").archives
    with MetadataStore(metadata_url) as first, MetadataStore(metadata_url) as second:
        for queue_id in range(QUEUES):
            first.get_or_create_queue("Orders", queue_id)
            first.get_or_create_queue("Legacy", queue_id)  # archived before the topic was excluded
        a = LeaseManager(first, owner="a", lease_duration=3.0, renew_interval=1.0, topics=archives)
        changes = a.round()
        assert sorted(changes.acquired) == [("Orders", q) for q in range(QUEUES)]
        assert (changes.queues, changes.fair_share) == (QUEUES, QUEUES)

        b = LeaseManager(second, owner="b", lease_duration=3.0, renew_interval=1.0, topics=archives)
        assert b.round().fair_share == QUEUES // 2  # half of Orders' queues, not half of both topics'
        surplus = a.round().surplus
        assert len(surplus) == QUEUES // 2
        a.release(surplus)
        assert sorted(b.round().acquired) == sorted(surplus)
        assert {row.owner for row in first.list_queues("Legacy")} == {None}
        a.close()
        b.close()


async def test_an_archiver_on_leases_makes_no_queue_rows_for_system_topics(tmp_path: Path, metadata_url: str) -> None:
    config = make_config(tmp_path, metadata_url=metadata_url)
    settings = config.archiver.model_copy(update={"leases": True, "group_commit_timeout": 0})
    upgrade(metadata_url)
    async with open_runtime(config) as runtime:
        assert runtime.hot is not None
        for queue_id in (0, 1):
            runtime.hot.put_message("Orders", queue_id, b"order")
        runtime.hot.put_message("rmq_sys_x", 0, b"internal")
        runtime.hot.put_message("SCHEDULE_TOPIC_XXXX", 2, b"delayed")
        topics = TopicFilter.of(settings, cluster=config.cluster, broker=config.broker)
        leases = LeaseManager(
            runtime.metadata,
            owner="a",
            lease_duration=settings.lease_duration,
            renew_interval=settings.lease_renew_interval,
            topics=topics.archives,
        )
        dispatcher = Dispatcher.from_runtime(runtime, settings=settings, leases=leases)
        await dispatcher.start()
        try:
            assert sorted(leases.held()) == [("Orders", 0), ("Orders", 1)]
            assert (await dispatcher.run_once()).stats.messages == 2
        finally:
            await dispatcher.shutdown()
        rows = runtime.metadata.list_queues()
        assert sorted((row.topic, row.queue_id, row.max_offset) for row in rows) == [("Orders", 0, 1), ("Orders", 1, 1)]
