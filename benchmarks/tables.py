"""What the issue-34 benchmarks share: a topic's Iceberg table synced as ``tieredstore table sync`` does it.

A sync here is the command's own work, ``TableSyncer.sync_topic`` over the node's metadata and catalog,
run in this process so that its time covers the sync and not an interpreter starting and importing
pyiceberg. Each round syncs into its own Iceberg namespace (``[table] namespace``), so its table is new
and starts from the archive's first offsets: a backfill, as a table created on an existing archive is.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from benchmarks.harness import stopwatch
from benchmarks.workloads import TOPIC
from tieredstore.config import TieredStoreConfig
from tieredstore.read.node import open_metadata_for_reading
from tieredstore.table.catalog import open_catalog, table_path
from tieredstore.table.sync import TableSyncer, TopicSync

_namespaces = itertools.count()


def fresh_namespace() -> dict[str, str]:
    """A ``[table]`` section naming a namespace no earlier round of this process used."""
    return {"namespace": f"bench_{next(_namespaces)}"}


@dataclass(frozen=True, slots=True)
class SyncRun:
    """One sync: its wall seconds, and what it did to each topic."""

    seconds: float
    topics: tuple[TopicSync, ...]

    @property
    def rows(self) -> int:
        return sum(topic.rows_added for topic in self.topics)

    @property
    def commits(self) -> int:
        return sum(topic.commits for topic in self.topics)


def sync_tables(config: TieredStoreConfig, *, expected: int, topics: tuple[str, ...] = (TOPIC,)) -> SyncRun:
    """Sync ``topics``' tables of ``config``'s node; RuntimeError unless ``expected`` rows went in and no lag is left.

    Only ``sync_topic`` is timed: opening the metadata database and the catalog are a node's start-up.
    """
    metadata = open_metadata_for_reading(config)
    try:
        syncer = TableSyncer(config, metadata, open_catalog(config))
        with stopwatch() as elapsed:
            results = tuple(syncer.sync_topic(topic) for topic in topics)
        seconds = elapsed()
    finally:
        metadata.close()
    run = SyncRun(seconds, results)
    if run.rows != expected or any(result.lag for result in results):
        raise RuntimeError(f"table sync added {run.rows} rows of {expected}, lag {[r.lag for r in results]}")
    return run


@dataclass(frozen=True, slots=True)
class DataFile:
    """A Parquet data file of a table's current snapshot: its URL and size."""

    path: str
    size: int


def data_files(config: TieredStoreConfig, topic: str = TOPIC) -> list[DataFile]:
    """The data files of ``topic``'s table's current snapshot, as the catalog lists them."""
    table = open_catalog(config, create_tables=False).load_table((config.table.namespace, topic))
    return [DataFile(task.file.file_path, task.file.file_size_in_bytes) for task in table.scan().plan_files()]


def delete_table_objects(client: Any, bucket: str, cold_prefix: str, config: TieredStoreConfig, topic: str) -> int:
    """Delete every object of ``topic``'s table under ``cold_prefix`` in ``bucket`` (the moto server holds them in
    memory, and later rounds need it back); how many there were."""
    prefix = f"{cold_prefix.strip('/')}/{table_path(config, topic)}/"
    keys = [
        {"Key": item["Key"]}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for item in page.get("Contents", [])
    ]
    for start in range(0, len(keys), 1000):
        client.delete_objects(Bucket=bucket, Delete={"Objects": keys[start : start + 1000], "Quiet": True})
    return len(keys)
