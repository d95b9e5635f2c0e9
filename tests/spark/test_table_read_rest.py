"""The Spark source reads through a table a REST catalog keeps (Lakana's server), its token named by a driver
variable so that it shows in no plan or partition."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.fixtures.rest_catalog import NAMESPACE, RestCatalogServer
from tests.spark.test_table_read import collect, options, table_files
from tests.table.conftest import TOPIC, messages
from tests.table.test_rest_catalog import rest_node
from tieredstore.errors import ConfigError
from tieredstore.scan import ScanOptions
from tieredstore.spark.source import TieredStorePartition
from tieredstore.table.read_plan import plan_read_partitions

pytestmark = pytest.mark.spark

TOKEN_VARIABLE = "TIEREDSTORE_TEST_CATALOG_TOKEN"


def test_the_source_reads_through_a_rest_catalogs_table(
    spark: SparkSession,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    rest_catalog: RestCatalogServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = rest_node("posix-sqlite", request, tmp_path, rest_catalog)
    node.put({(TOPIC, q): messages(q, range(0, 40)) for q in range(2)})
    assert node("table", "sync").exit_code == 0
    node.put({(TOPIC, 0): messages(0, range(40, 55), day=1)})  # in the archive only

    token_file = tmp_path / "catalog-token"
    token_file.write_text(rest_catalog.token + "\n")
    chosen = options(
        node,
        "true",
        catalog_uri=rest_catalog.uri,
        catalog_properties=node.env["TIEREDSTORE_TABLE__CATALOG_PROPERTIES"],
        catalog_token_file=str(token_file),
        table_namespace=NAMESPACE,
    )
    planned = plan_read_partitions(ScanOptions.parse(chosen))
    assert table_files(planned), "no partition reads the table's files"
    assert rest_catalog.token.encode() not in pickle.dumps([TieredStorePartition(plan) for plan in planned])

    path = chosen.pop("path")
    frame = spark.read.format("tieredstore").options(**chosen).load(path)
    assert collect(frame) == node.expected()
    assert rest_catalog.token not in frame._jdf.queryExecution().toString()

    # The token from a variable of the planning process instead (here the test's own: the planner runs in it).
    by_variable = {**chosen, "path": path, "catalog_token_env": TOKEN_VARIABLE}
    del by_variable["catalog_token_file"]
    with pytest.raises(ConfigError, match=TOKEN_VARIABLE):
        plan_read_partitions(ScanOptions.parse(by_variable))
    monkeypatch.setenv(TOKEN_VARIABLE, rest_catalog.token)
    assert table_files(plan_read_partitions(ScanOptions.parse(by_variable)))


def test_a_token_in_catalog_properties_is_refused() -> None:
    with pytest.raises(ConfigError, match="catalog_token_env"):
        ScanOptions.parse(
            {
                "path": TOPIC,
                "cold_url": "/nowhere",
                "metadata": "none",
                "catalog_uri": "http://127.0.0.1:9",
                "catalog_properties": json.dumps({"token": "secret"}),
            }
        )
