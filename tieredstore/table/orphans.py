"""Files under a table's folder that nothing references: what a sync killed before its commit left.

A sync killed after writing Parquet files leaves data files no snapshot references; one killed during its
commit also leaves the manifests (``<uuid>-m<n>.avro``), the manifest list (``snap-*.avro``) and perhaps the
``<n>-<uuid>.metadata.json`` it wrote before the catalog took (or refused) the new metadata. Live are: the
current metadata file and those of its metadata log, every snapshot's manifest list, the manifests those
lists name, and the data files those manifests name. Everything else matching those names is an orphan.

They are listed and deleted through our provider, which does both on every backend, and only once older
than a grace period: a younger file may belong to a sync (here or on another node) about to commit it.
Files in ``metadata/`` whose names Iceberg writers other than these use (statistics, version hints) are
left alone.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tieredstore.basics import now_ms
from tieredstore.config import TieredStoreConfig
from tieredstore.errors import StorageError
from tieredstore.providers.base import DeletesObjects, ListsObjects
from tieredstore.runtime import open_cold_provider
from tieredstore.table.catalog import cold_key, relative_path, table_path

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

DATA_FOLDER = "data"
METADATA_FOLDER = "metadata"
# What pyiceberg (and Java Iceberg) name the files of a commit, in the order a sweep deletes them: a file
# before those it references, so a sweep cut short never leaves a referencing file whose targets are gone
# (recovery registers the newest metadata file it finds).
_METADATA_KINDS = (
    ("metadata", re.compile(r"\.metadata\.json$")),
    ("manifest list", re.compile(r"^snap-[^/]*\.avro$")),
    ("manifest", re.compile(r"-m\d+\.avro$")),
)


@dataclass(frozen=True, slots=True)
class TableReferences:
    """Every file a table's current metadata reaches, by kind, as the metadata spells the paths."""

    metadata_files: frozenset[str]
    manifest_lists: frozenset[str]
    manifests: frozenset[str]
    data_files: frozenset[str]

    def all(self) -> frozenset[str]:
        return self.metadata_files | self.manifest_lists | self.manifests | self.data_files


@dataclass(frozen=True, slots=True)
class OrphanSweep:
    """What one sweep deleted: unreferenced data files, and unreferenced metadata, manifest-list and manifest
    files."""

    data_files: int = 0
    metadata_files: int = 0


def table_references(table: Table) -> TableReferences:
    """The files of ``table`` as now loaded: current and logged metadata, and every snapshot's files."""
    metadata_files = {table.metadata_location, *(entry.metadata_file for entry in table.metadata.metadata_log)}
    manifest_lists: set[str] = set()
    manifests: set[str] = set()
    data_files: set[str] = set()
    for snapshot in table.snapshots():
        manifest_lists.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in manifests:
                continue
            manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                data_files.add(entry.data_file.file_path)
    return TableReferences(
        frozenset(metadata_files), frozenset(manifest_lists), frozenset(manifests), frozenset(data_files)
    )


def remove_orphan_files(config: TieredStoreConfig, table: Table, grace_seconds: float) -> OrphanSweep:
    """Delete the table's unreferenced data and metadata files older than ``grace_seconds``."""
    topic = table.name()[-1]
    location = table.location().rstrip("/")
    # Where we placed it or a REST catalog did (location = "catalog"), so long as it is under the cold URL.
    folder = cold_key(config, location)
    if folder is None:
        # Elsewhere (another tool's choice, a catalog's storage of its own): not ours to list or delete.
        log.warning("table %s lies at %s, not under the cold URL: its orphan files are left alone", topic, location)
        return OrphanSweep()
    referenced = {relative for path in table_references(table).all() if (relative := relative_path(path, location))}
    # A catalog that placed the table may keep metadata files its metadata log does not name (versions for
    # its own undo): their lifecycle is the catalog's, and only data files are judged.
    judge_metadata = folder == table_path(config, topic)
    return asyncio.run(_remove(config, folder, referenced, grace_seconds, judge_metadata))


def _metadata_rank(name: str) -> int | None:
    """Where a file of ``metadata/`` comes in the deletion order (None: not a kind a sweep judges)."""
    return next((rank for rank, (_, pattern) in enumerate(_METADATA_KINDS) if pattern.search(name)), None)


async def _remove(
    config: TieredStoreConfig, folder: str, referenced: set[str], grace_seconds: float, judge_metadata: bool
) -> OrphanSweep:
    provider = open_cold_provider(config)
    try:
        if not isinstance(provider, ListsObjects) or not isinstance(provider, DeletesObjects):
            raise StorageError(f"{provider.url} cannot list and delete a table's files")
        cutoff = now_ms() - int(grace_seconds * 1000)

        async def unreferenced(sub: str) -> list[str]:
            stored = await provider.list_objects(f"{folder}/{sub}")
            return [
                item.key
                for item in stored
                if item.key.removeprefix(folder + "/") not in referenced and item.last_modified <= cutoff
            ]

        by_rank: list[list[str]] = [[] for _ in _METADATA_KINDS]
        for key in await unreferenced(METADATA_FOLDER) if judge_metadata else []:
            rank = _metadata_rank(key.rsplit("/", 1)[-1])
            if rank is not None:
                by_rank[rank].append(key)
        for (kind, _), doomed in zip(_METADATA_KINDS, by_rank, strict=True):
            if doomed:
                await provider.delete_objects(doomed)
                log.info("table folder %s: deleted %d unreferenced %s files", folder, len(doomed), kind)
        # Data files last: the manifests deleted above were their only references.
        data = await unreferenced(DATA_FOLDER)
        if data:
            await provider.delete_objects(data)
            log.info("table folder %s: deleted %d unreferenced data files", folder, len(data))
        return OrphanSweep(data_files=len(data), metadata_files=sum(len(doomed) for doomed in by_rank))
    finally:
        await provider.close()
