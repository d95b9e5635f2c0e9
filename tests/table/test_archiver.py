"""``[table] enabled``: ``tieredstore run`` keeps every topic's table level in a background thread, publishes the
lag as a metric, and ``tieredstore status`` shows each queue's table lag once a table exists; on POSIX + SQLite
and S3 (moto over HTTP) + PostgreSQL where the backends matter."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
import sqlalchemy

from tests.cli.conftest import posix_node
from tests.cli.framed import KEY_ID, backend_node, write_keyring
from tests.cli.helpers import Node, hot_records
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.config import TieredStoreConfig, load_config
from tieredstore.metrics import Metrics
from tieredstore.table.background import BackgroundTableSync
from tieredstore.table.catalog import open_catalog

PAIRS = ["posix-sqlite", pytest.param("s3-postgres", marks=pytest.mark.postgres)]


def node_config(node: Node, request: pytest.FixtureRequest) -> TieredStoreConfig:
    """The settings ``node``'s CLI runs with, for an archiver's table sync in this process."""
    s3 = request.getfixturevalue("s3_server").provider_options() if node.cold_url else None
    return load_config(data_dir=node.data_dir, cold_url=node.cold_url, metadata_url=node.metadata_url, s3=s3)


def hot_offsets(node: Node, queue_id: int) -> set[int]:
    return set(hot_records(node.hot_dir, TOPIC, queue_id))


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS)
def test_run_with_tables_enabled_syncs_what_it_archives(
    pair: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = backend_node(pair, request, tmp_path / "node")
    node.env.update(
        {
            "TIEREDSTORE_TABLE__ENABLED": "true",
            "TIEREDSTORE_TABLE__COMMIT_INTERVAL": "0.5",
            "TIEREDSTORE_ARCHIVER__GROUP_COMMIT_TIMEOUT": "0.1",
            "TIEREDSTORE_ARCHIVER__SCAN_INTERVAL": "0.1",
            # On PostgreSQL as deployed, with queue leases: the table sync follows the archiver's leases.
            "TIEREDSTORE_ARCHIVER__LEASES": str(node.metadata_url is not None).lower(),
        }
    )
    produce(node, 0, 120)
    produce(node, 1, 40)
    ran = node("run", "--no-demo", "--duration", "5", output="json")
    assert ran.exit_code == 0, ran.stderr
    assert "syncing every topic's Iceberg table every 0.5s" in ran.stderr
    assert ("leasing queues as" in ran.stderr) == (node.metadata_url is not None)
    table = open_catalog(node_config(node, request)).load_table(("tieredstore", TOPIC))
    rows = table.scan().to_arrow()
    assert rows.num_rows == 160
    bodies = {(row["queue_id"], row["queue_offset"]): row["body"] for row in rows.to_pylist()}
    for queue_id in (0, 1):
        assert {offset for (q, offset) in bodies if q == queue_id} == hot_offsets(node, queue_id)


@pytest.mark.parametrize("pair", PAIRS)
def test_a_background_round_publishes_the_lag_and_status_shows_the_table_lag(
    pair: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = backend_node(pair, request, tmp_path / "node")
    produce(node, 0, 30)
    archive(node)
    status = node("status", output="json").json()["rows"]
    assert all("table_lag" not in row for row in status)  # no table yet: no column

    metrics = Metrics()
    BackgroundTableSync(node_config(node, request), metrics).sync_all()
    assert metrics.registry.get_sample_value("tieredstore_table_lag_messages", {"topic": TOPIC}) == 0

    produce(node, 0, 12)
    archive(node)
    status = node("status", output="json").json()["rows"]
    assert [(row["queue_id"], row["archived"], row["table_lag"]) for row in status] == [(0, 42, 12)]
    assert "table_lag" in node("status").stdout


@pytest.mark.parametrize("pair", PAIRS)
def test_the_background_sync_registers_again_a_table_whose_catalog_row_was_deleted(
    pair: str, request: pytest.FixtureRequest, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = backend_node(pair, request, tmp_path / "node")
    produce(node, 0, 30)
    produce(node, 1, 20)
    archive(node)
    config = node_config(node, request)
    BackgroundTableSync(config, Metrics()).sync_all()
    before = open_catalog(config).load_table(("tieredstore", TOPIC))
    files = {task.file.file_path for task in before.scan().plan_files()}
    # The catalog's row of the table is gone (a restored database backup older than the table, a bad
    # cleanup); its files remain on the cold tier.
    engine = sqlalchemy.create_engine(config.effective_metadata_url or "")
    with engine.begin() as connection:
        deleted = connection.execute(
            sqlalchemy.text("DELETE FROM iceberg_tables WHERE table_name = :name"), {"name": TOPIC}
        )
    engine.dispose()
    assert deleted.rowcount == 1
    produce(node, 1, 15)
    archive(node)

    metrics = Metrics()
    with caplog.at_level(logging.WARNING):
        BackgroundTableSync(config, metrics).sync_all()

    assert "registered it again" in caplog.text
    assert metrics.registry.get_sample_value("tieredstore_table_sync_failures_total", {"topic": TOPIC}) is None
    assert metrics.registry.get_sample_value("tieredstore_table_lag_messages", {"topic": TOPIC}) == 0
    table = open_catalog(config).load_table(("tieredstore", TOPIC))
    assert files <= {task.file.file_path for task in table.scan().plan_files()}  # the old files, not a backfill
    rows = table.scan().to_arrow().to_pylist()
    keys = sorted((row["queue_id"], row["queue_offset"]) for row in rows)
    assert keys == [(0, offset) for offset in range(30)] + [(1, offset) for offset in range(35)]
    assert keys == sorted((q, offset) for q in (0, 1) for offset in hot_offsets(node, q))  # each archived once


def test_the_archiver_refuses_plaintext_tables_of_an_encrypted_cold_tier(tmp_path: Path) -> None:
    node = posix_node(tmp_path)
    keyring = write_keyring(tmp_path / "keyring.toml", {KEY_ID: bytes(32)})
    node.env.update(
        {
            "TIEREDSTORE_TABLE__ENABLED": "true",
            "TIEREDSTORE_ENCRYPTION__KEYRING_FILE": str(keyring),
            "TIEREDSTORE_ENCRYPTION__ACTIVE_KEY": KEY_ID,
        }
    )
    produce(node, 0, 5)
    refused = node("run", "--no-demo", "--duration", "1")
    assert refused.exit_code == 7
    assert "allow_unencrypted" in refused.stderr


def test_the_background_sync_sweeps_orphans_at_its_first_round_and_then_once_a_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = posix_node(tmp_path)
    produce(node, 0, 10)
    archive(node)
    monkeypatch.setenv("TIEREDSTORE_TABLE__ORPHAN_GRACE", "1")
    config = load_config(data_dir=node.data_dir)
    BackgroundTableSync(config, Metrics()).sync_all()
    location = open_catalog(config).load_table(("tieredstore", TOPIC)).location().removeprefix("file://")

    def old_stray(name: str) -> Path:
        """A data file no snapshot references, written an hour ago: any sweep deletes it."""
        path = Path(location, "data", f"{name}.parquet")
        path.write_bytes(b"PAR1 left by a killed sync")
        an_hour_ago = time.time() - 3600
        os.utime(path, (an_hour_ago, an_hour_ago))
        return path

    restarted = BackgroundTableSync(config, Metrics())
    first = old_stray("first")
    restarted.sync_all()
    assert not first.exists()  # the first round after a start sweeps: a crash may have left files
    second = old_stray("second")
    restarted.sync_all()
    assert second.exists()  # within a grace of the last sweep: not swept again
    time.sleep(1.1)
    restarted.sync_all()
    assert not second.exists()
