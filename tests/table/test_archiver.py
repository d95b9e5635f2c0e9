"""``[table] enabled``: ``tieredstore run`` keeps every topic's table level in a background thread, publishes the
lag as a metric, and ``tieredstore status`` shows each queue's table lag once a table exists."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.cli.conftest import posix_node
from tests.cli.framed import KEY_ID, write_keyring
from tests.cli.helpers import hot_records
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.config import load_config
from tieredstore.metrics import Metrics
from tieredstore.table.background import BackgroundTableSync
from tieredstore.table.catalog import open_catalog


@pytest.mark.slow
def test_run_with_tables_enabled_syncs_what_it_archives(tmp_path: Path) -> None:
    node = posix_node(tmp_path)
    node.env.update(
        {
            "TIEREDSTORE_TABLE__ENABLED": "true",
            "TIEREDSTORE_TABLE__COMMIT_INTERVAL": "0.5",
            "TIEREDSTORE_ARCHIVER__GROUP_COMMIT_TIMEOUT": "0.1",
            "TIEREDSTORE_ARCHIVER__SCAN_INTERVAL": "0.1",
        }
    )
    produce(node, 0, 120)
    produce(node, 1, 40)
    ran = node("run", "--no-demo", "--duration", "5", output="json")
    assert ran.exit_code == 0, ran.stderr
    assert "syncing every topic's Iceberg table every 0.5s" in ran.stderr
    config = load_config(data_dir=node.data_dir)
    table = open_catalog(config).load_table(("tieredstore", TOPIC))
    rows = table.scan().to_arrow()
    assert rows.num_rows == 160
    bodies = {(row["queue_id"], row["queue_offset"]): row["body"] for row in rows.to_pylist()}
    for queue_id in (0, 1):
        hot = hot_records(node.hot_dir, TOPIC, queue_id)
        assert {offset for (q, offset) in bodies if q == queue_id} == set(hot)


def test_a_background_round_publishes_the_lag_and_status_shows_the_table_lag(tmp_path: Path) -> None:
    node = posix_node(tmp_path)
    produce(node, 0, 30)
    archive(node)
    status = node("status", output="json").json()["rows"]
    assert all("table_lag" not in row for row in status)  # no table yet: no column

    metrics = Metrics()
    BackgroundTableSync(load_config(data_dir=node.data_dir), metrics).sync_all()
    assert metrics.registry.get_sample_value("tieredstore_table_lag_messages", {"topic": TOPIC}) == 0

    produce(node, 0, 12)
    archive(node)
    status = node("status", output="json").json()["rows"]
    assert [(row["queue_id"], row["archived"], row["table_lag"]) for row in status] == [(0, 42, 12)]
    assert "table_lag" in node("status").stdout


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
