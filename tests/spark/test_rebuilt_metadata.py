"""Spark reads an archive through metadata rebuilt from cold storage (``tieredstore db rebuild --from-cold``)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.spark.helpers import BROKER, CLUSTER, SETTINGS, Archive, sort_key, spark_row
from tieredstore.metadata import MetadataStore
from tieredstore.providers.registry import open_provider
from tieredstore.rebuild import rebuild_metadata

pytestmark = pytest.mark.spark


async def _rebuild(archive: Archive, metadata_url: str) -> None:
    provider = open_provider(archive.cold_url, **archive.storage_options)
    target = await asyncio.to_thread(MetadataStore.open, metadata_url)
    try:
        await rebuild_metadata(provider, target, cluster=CLUSTER, broker=BROKER, settings=SETTINGS)
    finally:
        target.close()
        await provider.close()


def test_a_scan_through_rebuilt_metadata_returns_every_row(
    spark: SparkSession, posix_archive: Archive, tmp_path: Path
) -> None:
    rebuilt = dataclasses.replace(posix_archive, metadata_url=f"sqlite:///{tmp_path / 'rebuilt.db'}")
    asyncio.run(_rebuild(posix_archive, rebuilt.metadata_url))
    frame = spark.read.format("tieredstore").options(**rebuilt.options()).load("orders,holes")
    assert sorted((spark_row(row) for row in frame.collect()), key=sort_key) == posix_archive.expected(
        "orders", "holes"
    )
    # Rebuilt time ranges prune as recorded ones do: a window inside queue 0 plans fewer partitions.
    narrow = frame.where("queue_id = 0 and store_timestamp >= '2026-05-28 20:26:42.000'")
    assert 0 < narrow.rdd.getNumPartitions() < frame.where("queue_id = 0").rdd.getNumPartitions()
