"""Tables kept through a real Iceberg REST catalog (Lakana's server, tests/fixtures/rest_catalog.py) instead of
the SQL catalog: backfill, a second sync, lag, races and maintenance, with the catalog placing the tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import posix_node
from tests.cli.test_restore import TOPIC as RESTORE_TOPIC
from tests.cli.test_restore import produce
from tests.fixtures.rest_catalog import NAMESPACE, SECRET, RestCatalogServer
from tests.table.conftest import TOPIC, TableNode, messages, table_node_on, table_rows
from tieredstore.config import load_config
from tieredstore.metadata import MetadataStore
from tieredstore.table.catalog import open_catalog
from tieredstore.table.offsets import read_offsets
from tieredstore.table.sync import TableSyncer

pytestmark = pytest.mark.xdist_group("rest_catalog")


def rest_node(pair: str, request: pytest.FixtureRequest, tmp_path: Path, server: RestCatalogServer) -> TableNode:
    """A node on ``pair`` whose tables are kept by the REST catalog, in an environment rooted under its cold URL."""
    node = table_node_on(pair, request, tmp_path)
    cold = node.archive.cold_url.rstrip("/")
    root = f"{cold}/iceberg" if cold.startswith("s3://") else f"file://{cold}/iceberg"
    storage = {}
    if root.startswith("s3://"):
        s3 = node.provider_options
        storage = {
            "s3.endpoint": s3["endpoint_url"],
            "s3.region": s3["region"],
            "s3.access-key-id": s3["access_key_id"],
            "s3.secret-access-key": s3["secret_access_key"],
        }
    prefix = server.environment(root, storage)
    node.env = {
        "TIEREDSTORE_TABLE__CATALOG_URI": server.uri,
        "TIEREDSTORE_TABLE__CATALOG_PROPERTIES": json.dumps({"prefix": prefix}),
        "TIEREDSTORE_TABLE__CATALOG_TOKEN": server.token,
        "TIEREDSTORE_TABLE__LOCATION": "catalog",
        "TIEREDSTORE_TABLE__NAMESPACE": NAMESPACE,
    }
    node.node.env.update(node.env)
    return node


def rest_settings(node: TableNode) -> dict[str, Any]:
    return {
        "catalog_uri": node.env["TIEREDSTORE_TABLE__CATALOG_URI"],
        "catalog_properties": json.loads(node.env["TIEREDSTORE_TABLE__CATALOG_PROPERTIES"]),
        "catalog_token": node.env["TIEREDSTORE_TABLE__CATALOG_TOKEN"],
        "location": "catalog",
        "namespace": NAMESPACE,
    }


def rest_table(node: TableNode) -> Any:
    return open_catalog(node.config(**rest_settings(node))).load_table((NAMESPACE, TOPIC))


@pytest.fixture(params=["posix-sqlite", "s3-postgres"])
def node(request: pytest.FixtureRequest, tmp_path: Path, rest_catalog: RestCatalogServer) -> TableNode:
    return rest_node(request.param, request, tmp_path, rest_catalog)


def test_sync_through_a_rest_catalog_gives_the_archive_once_then_only_what_is_new(node: TableNode) -> None:
    node.put(
        {
            (TOPIC, 0): messages(0, range(0, 60), day=0) + messages(0, range(60, 100), day=1),
            (TOPIC, 1): messages(1, [*range(0, 20), *range(40, 70)], day=1),
        }
    )
    synced = node("table", "sync", TOPIC, output="json")
    assert synced.exit_code == 0, synced.stderr
    (report,) = synced.json()["topics"]
    assert (report["rows_added"], report["lag"]) == (150, 0)
    table = rest_table(node)
    assert table_rows(table) == node.expected()
    assert read_offsets(table) == {0: 100, 1: 70}
    # The catalog chose where the table lives: under the environment's root, i.e. the cold URL's iceberg folder.
    cold = node.archive.cold_url.rstrip("/")
    assert table.location().removeprefix("file://").startswith(f"{cold}/iceberg/")

    node.put({(TOPIC, 0): messages(0, range(100, 130), day=2)})
    again = node("table", "sync", output="json")
    assert again.exit_code == 0, again.stderr
    assert [(t["topic"], t["rows_added"], t["lag"]) for t in again.json()["topics"]] == [(TOPIC, 30, 0)]
    assert table_rows(rest_table(node)) == node.expected()

    status = node("table", "status", output="json")
    assert status.exit_code == 0, status.stderr
    (row,) = status.json()["rows"]
    assert (row["topic"], row["exists"], row["lag"], row["rows"]) == (TOPIC, True, 0, 180)

    compacted = node("table", "compact", output="json")
    assert compacted.exit_code == 0, compacted.stderr
    assert table_rows(rest_table(node)) == node.expected()


def test_a_commit_lost_to_another_syncer_is_planned_again_not_doubled(
    request: pytest.FixtureRequest, tmp_path: Path, rest_catalog: RestCatalogServer
) -> None:
    node = rest_node("posix-sqlite", request, tmp_path, rest_catalog)
    node.put({(TOPIC, q): messages(q, range(0, 40)) for q in range(3)})
    config = node.config(**rest_settings(node))
    metadata = MetadataStore(config.effective_metadata_url)
    try:
        rival = TableSyncer(config, metadata, open_catalog(config))
        raced = []

        def rival_commits_first() -> None:
            if not raced:
                raced.append(rival.sync_topic(TOPIC))

        ours = TableSyncer(config, metadata, open_catalog(config)).sync_topic(TOPIC, before_commit=rival_commits_first)
    finally:
        metadata.close()
    assert raced[0].rows_added == 120
    assert ours.conflicts == 1 and ours.rows_added == 0
    rows = table_rows(rest_table(node))
    assert rows == node.expected()


def test_a_wrong_token_is_a_configuration_error_in_one_line(node: TableNode) -> None:
    node.put({(TOPIC, 0): messages(0, range(0, 10))})
    node.node.env["TIEREDSTORE_TABLE__CATALOG_TOKEN"] = "lakana_pat_nosuchkey_nosuchsecret0000000000"
    result = node("table", "sync")
    assert result.exit_code == 7, result.stderr
    assert result.stderr.count("\n") == 1 and "refused our credentials" in result.stderr
    assert "nosuchsecret" not in result.stderr


def test_rest_settings_without_a_rest_catalog_are_refused(tmp_path: Path) -> None:
    from tieredstore.errors import ConfigError

    with pytest.raises(ConfigError, match="set catalog_uri"):
        load_config(data_dir=tmp_path, table={"location": "catalog"})


def test_a_catalog_that_assigns_locations_itself_is_named_in_the_refusal(node: TableNode) -> None:
    node.put({(TOPIC, 0): messages(0, range(0, 10))})
    node.node.env["TIEREDSTORE_TABLE__LOCATION"] = "cold"
    result = node("table", "sync")
    assert result.exit_code == 7, result.stderr
    assert result.stderr.count("\n") == 1
    assert "refused to create it" in result.stderr and 'location = "catalog"' in result.stderr


@pytest.mark.slow
def test_the_archiver_syncs_through_the_rest_catalog_and_never_prints_its_token(
    tmp_path: Path, rest_catalog: RestCatalogServer
) -> None:
    node = posix_node(tmp_path)
    prefix = rest_catalog.environment(f"file://{node.data_dir / 'cold'}/iceberg")
    node.env.update(
        {
            "TIEREDSTORE_TABLE__ENABLED": "true",
            "TIEREDSTORE_TABLE__COMMIT_INTERVAL": "0.5",
            "TIEREDSTORE_ARCHIVER__GROUP_COMMIT_TIMEOUT": "0.1",
            "TIEREDSTORE_ARCHIVER__SCAN_INTERVAL": "0.1",
            "TIEREDSTORE_TABLE__CATALOG_URI": rest_catalog.uri,
            "TIEREDSTORE_TABLE__CATALOG_PROPERTIES": json.dumps({"prefix": prefix}),
            "TIEREDSTORE_TABLE__CATALOG_TOKEN": rest_catalog.token,
            "TIEREDSTORE_TABLE__LOCATION": "catalog",
            "TIEREDSTORE_TABLE__NAMESPACE": NAMESPACE,
        }
    )
    produce(node, 0, 50)
    ran = node("--debug", "--log-json", "run", "--no-demo", "--duration", "5", output="json")
    assert ran.exit_code == 0, ran.stderr
    status = node("--debug", "status", output="json")
    assert status.exit_code == 0, status.stderr
    assert [row["table_lag"] for row in status.json()["rows"]] == [0]
    for said in (ran.stdout, ran.stderr, status.stdout, status.stderr):
        assert rest_catalog.token not in said and SECRET not in said

    config = load_config(
        data_dir=node.data_dir,
        table={
            "catalog_uri": rest_catalog.uri,
            "catalog_properties": {"prefix": prefix},
            "catalog_token": rest_catalog.token,
            "location": "catalog",
            "namespace": NAMESPACE,
        },
    )
    rows = open_catalog(config).load_table((NAMESPACE, RESTORE_TOPIC)).scan().to_arrow()
    assert sorted(rows.column("queue_offset").to_pylist()) == list(range(50))


def test_a_table_the_catalog_placed_under_the_cold_url_gets_its_orphans_swept(node: TableNode, s3_server: Any) -> None:
    node.put({(TOPIC, 0): messages(0, range(0, 30))})
    assert node("table", "sync").exit_code == 0
    location = rest_table(node).location()
    stray = f"{location}/data/stray-{TOPIC}.parquet"
    if stray.startswith("s3://"):
        bucket, key = stray.removeprefix("s3://").split("/", 1)
        s3_server.client().put_object(Bucket=bucket, Key=key, Body=b"PAR1")
    else:
        Path(stray.removeprefix("file://")).write_bytes(b"PAR1")

    node.node.env["TIEREDSTORE_TABLE__ORPHAN_GRACE"] = "0"
    swept = node("table", "sync", output="json")
    assert swept.exit_code == 0, swept.stderr
    (report,) = swept.json()["topics"]
    assert (report["orphans_deleted"], report["metadata_orphans_deleted"]) == (1, 0)
    assert table_rows(rest_table(node)) == node.expected()
    if not stray.startswith("s3://"):
        assert not Path(stray.removeprefix("file://")).exists()
