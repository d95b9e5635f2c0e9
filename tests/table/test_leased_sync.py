"""Several archivers with queue leases on one PostgreSQL: each topic's table is synced by the archiver that
holds the topic's lowest-numbered queue, by no other, and an archiver that stops hands its tables over with
its leases, nothing lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.spark.helpers import make_message
from tests.table.conftest import TableNode, on_day, table_node_on, table_rows
from tieredstore.archiver.leases import LeaseManager
from tieredstore.metadata import MetadataStore
from tieredstore.metrics import Metrics
from tieredstore.table.background import BackgroundTableSync

TOPICS = ("orders", "payments", "refunds")
QUEUES = 2


def put(node: TableNode, offsets: range) -> None:
    node.put(
        {
            (topic, queue): [on_day(make_message(topic, queue, offset), 0) for offset in offsets]
            for topic in TOPICS
            for queue in range(QUEUES)
        }
    )


def synced_here(metrics: Metrics) -> set[str]:
    """The topics whose table this archiver's rounds synced (each sets the topic's lag)."""
    return {
        topic
        for topic in TOPICS
        if metrics.registry.get_sample_value("tieredstore_table_lag_messages", {"topic": topic}) is not None
    }


@pytest.fixture
def stores(table_node: TableNode) -> Iterator[list[MetadataStore]]:
    opened = [MetadataStore(table_node.archive.metadata_url) for _ in range(2)]
    yield opened
    for store in opened:
        store.close()


@pytest.fixture
def table_node(request: pytest.FixtureRequest, tmp_path: Path) -> TableNode:
    return table_node_on("posix-postgres", request, tmp_path)


@pytest.mark.postgres
def test_each_table_has_one_syncer_and_a_stopped_archivers_tables_pass_to_the_other(
    table_node: TableNode, stores: list[MetadataStore]
) -> None:
    put(table_node, range(10))
    first, second = (LeaseManager(store, owner=f"archiver-{i}") for i, store in enumerate(stores))
    first.round()  # alone: takes all six queues
    assert second.round().acquired == []  # joins: all are held
    surplus = first.round().surplus  # two live archivers: a share of three, the rest handed back
    first.release(surplus)
    assert len(second.round().acquired) == 3
    # Leases in key order: the first keeps orders/0, orders/1 and payments/0; the second has the rest.
    assert set(first.held()) == {("orders", 0), ("orders", 1), ("payments", 0)}

    config = table_node.config()
    metrics = [Metrics(), Metrics()]
    syncers = [BackgroundTableSync(config, m, leases) for m, leases in zip(metrics, (first, second), strict=True)]
    for syncer in syncers:
        syncer.sync_all()

    assert synced_here(metrics[0]) == {"orders", "payments"}  # payments/0 is the first's, payments/1 not
    assert synced_here(metrics[1]) == {"refunds"}
    for topic in TOPICS:
        assert table_rows(table_node.table(topic)) == table_node.expected(topic)

    first.close()  # the first archiver stops: its leases go back at once
    put(table_node, range(10, 25))
    assert len(second.round().acquired) == 3
    syncers[1].sync_all()

    assert synced_here(metrics[1]) == set(TOPICS)
    for topic in TOPICS:
        rows = table_rows(table_node.table(topic))
        assert rows == table_node.expected(topic)  # every message once, those archived before the stop too
        assert len(rows) == QUEUES * 25
