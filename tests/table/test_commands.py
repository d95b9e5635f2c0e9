"""``table status`` and the refusals of ``table sync``: one line on stderr and the documented exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.framed import KEY_ID, framed_node_on, write_keyring
from tests.cli.helpers import hot_records
from tests.cli.test_restore import TOPIC as RESTORE_TOPIC
from tests.cli.test_restore import archive, produce
from tests.table.conftest import TOPIC, TableNode, messages, table_node_on, table_rows
from tieredstore.config import load_config
from tieredstore.formats.message import decode
from tieredstore.table.catalog import open_catalog


@pytest.fixture
def posix_node(request: pytest.FixtureRequest, tmp_path: Path) -> TableNode:
    node = table_node_on("posix-sqlite", request, tmp_path)
    node.put({(TOPIC, 0): messages(0, range(40)), (TOPIC, 1): messages(1, range(25))})
    return node


def test_status_shows_the_lag_before_and_after_a_sync(posix_node: TableNode) -> None:
    before = posix_node("table", "status", output="json")
    assert before.exit_code == 0, before.stderr
    (row,) = before.json()["rows"]
    assert (row["topic"], row["exists"], row["table_offset"], row["archived_offset"], row["lag"]) == (
        TOPIC,
        False,
        0,
        65,
        65,
    )
    assert posix_node("table", "sync").exit_code == 0
    posix_node.put({(TOPIC, 1): messages(1, range(25, 30))})
    after = posix_node("table", "status", TOPIC, output="json").json()["rows"][0]
    assert (after["exists"], after["table_offset"], after["archived_offset"], after["lag"]) == (True, 65, 70, 5)
    assert (after["snapshots"], after["rows"]) == (1, 65)
    assert after["data_files"] >= 1 and after["data_bytes"] > 0
    text = posix_node("table", "status")
    assert TOPIC in text.stdout and "lag" in text.stdout


def test_text_sync_prints_one_summary_line_per_topic(posix_node: TableNode) -> None:
    synced = posix_node("table", "sync", "--no-progress")
    assert synced.exit_code == 0, synced.stderr
    assert synced.stdout.strip() == (
        f"table {TOPIC}: 65 rows added in 1 commits, table offset 65 of 65 archived, lag 0"
    )


def test_an_encrypted_cold_tier_is_refused_unless_plaintext_tables_are_allowed(
    posix_node: TableNode, tmp_path: Path
) -> None:
    keyring = write_keyring(tmp_path / "keyring.toml", {KEY_ID: bytes(32)})
    posix_node.node.env.update(
        {"TIEREDSTORE_ENCRYPTION__KEYRING_FILE": str(keyring), "TIEREDSTORE_ENCRYPTION__ACTIVE_KEY": KEY_ID}
    )
    refused = posix_node("table", "sync", TOPIC)
    assert refused.exit_code == 7
    assert refused.stderr.count("\n") == 1 and "allow_unencrypted" in refused.stderr
    assert not (Path(posix_node.archive.cold_url) / "iceberg").exists()

    posix_node.node.env["TIEREDSTORE_TABLE__ALLOW_UNENCRYPTED"] = "true"
    allowed = posix_node("table", "sync", TOPIC)
    assert allowed.exit_code == 0, allowed.stderr
    assert len(table_rows(posix_node.table())) == 65


def test_an_unknown_topic_is_not_found(posix_node: TableNode) -> None:
    result = posix_node("table", "sync", "NoSuchTopic")
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1 and "NoSuchTopic" in result.stderr


@pytest.mark.parametrize(
    ("catalog_uri", "exit_code", "said"),
    [("ftp://catalog.example/iceberg", 7, "REST catalog"), ("http://127.0.0.1:9/catalog", 4, "Iceberg catalog")],
)
def test_a_bad_catalog_uri_is_one_line_and_its_exit_code(
    posix_node: TableNode, catalog_uri: str, exit_code: int, said: str
) -> None:
    posix_node.node.env["TIEREDSTORE_TABLE__CATALOG_URI"] = catalog_uri
    for command in (["table", "sync"], ["table", "status"]):
        result = posix_node(*command)
        assert result.exit_code == exit_code, result.stderr
        assert result.stderr.count("\n") == 1 and said in result.stderr


def test_a_bad_metadata_url_for_the_sql_catalog_is_a_configuration_error(posix_node: TableNode) -> None:
    posix_node.node.metadata_url = "mysql://nobody@127.0.0.1/x"
    result = posix_node("table", "sync")
    assert result.exit_code == 7
    assert result.stderr.count("\n") == 1


def test_an_encrypted_archive_syncs_its_plaintext_rows_when_allowed(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = framed_node_on("posix-sqlite", request, tmp_path)
    produce(node, 0, 150)
    archive(node)
    node.env["TIEREDSTORE_TABLE__ALLOW_UNENCRYPTED"] = "true"
    synced = node("table", "sync", output="json")
    assert synced.exit_code == 0, synced.stderr
    config = load_config(data_dir=node.data_dir)
    rows = open_catalog(config).load_table(("tieredstore", RESTORE_TOPIC)).scan().to_arrow().to_pylist()
    hot = hot_records(node.hot_dir, RESTORE_TOPIC, 0)
    assert {row["queue_offset"]: row["body"] for row in rows} == {
        offset: decode(raw).body for offset, raw in hot.items()
    }


def test_a_cold_tier_refusing_the_data_files_is_a_storage_error_and_commits_nothing(posix_node: TableNode) -> None:
    # A file where the table's data folder goes: every data file's write fails, as a full or broken disk would.
    table_folder = Path(posix_node.archive.cold_url) / "iceberg" / "tieredstore" / TOPIC
    table_folder.mkdir(parents=True)
    (table_folder / "data").write_bytes(b"not a folder")
    refused = posix_node("table", "sync", TOPIC)
    assert refused.exit_code == 4, refused.stderr
    assert f"table {TOPIC}: writing its files failed" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert posix_node.table().snapshots() == []

    (table_folder / "data").unlink()
    synced = posix_node("table", "sync", TOPIC, output="json")
    assert synced.exit_code == 0, synced.stderr
    assert synced.json()["topics"][0]["rows_added"] == 65
    assert len(table_rows(posix_node.table())) == 65
