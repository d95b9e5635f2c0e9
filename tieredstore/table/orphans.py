"""Data files under a table's folder that no snapshot references: what a sync killed before its commit left.

They are listed and deleted through our provider, which does both on every backend, and only once older
than a grace period: a younger file may belong to a sync (here or on another node) about to commit it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from tieredstore.basics import now_ms
from tieredstore.config import TieredStoreConfig
from tieredstore.errors import StorageError
from tieredstore.providers.base import DeletesObjects, ListsObjects
from tieredstore.runtime import open_cold_provider
from tieredstore.table.catalog import table_location, table_path

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

DATA_FOLDER = "data"


def referenced_data_files(table: Table) -> set[str]:
    """The paths of the data files of every snapshot the table still has, as its manifests spell them."""
    referenced: set[str] = set()
    seen_manifests: set[str] = set()
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                referenced.add(entry.data_file.file_path)
    return referenced


def _relative(path: str, location: str) -> str | None:
    """``path`` relative to the table's folder, whichever way a writer spelt a local path (file:// or not)."""
    for prefix in (location, location.removeprefix("file://")):
        if path.startswith(prefix + "/"):
            return path[len(prefix) + 1 :]
    return None


def remove_orphan_files(config: TieredStoreConfig, table: Table, grace_seconds: float) -> int:
    """Delete the table's unreferenced data files older than ``grace_seconds``; how many were deleted."""
    topic = table.name()[-1]
    location = table_location(config, topic)
    if _relative(table.location() + "/x", location) != "x":
        # A table placed elsewhere (another tool, a REST catalog's choice): its files are not ours to judge.
        log.warning("table %s lies at %s, not under the cold URL: its orphan files are left alone", topic, location)
        return 0
    folder = table_path(config, topic)
    referenced = {relative for path in referenced_data_files(table) if (relative := _relative(path, location))}
    return asyncio.run(_remove(config, folder, referenced, grace_seconds))


async def _remove(config: TieredStoreConfig, folder: str, referenced: set[str], grace_seconds: float) -> int:
    provider = open_cold_provider(config)
    try:
        if not isinstance(provider, ListsObjects) or not isinstance(provider, DeletesObjects):
            raise StorageError(f"{provider.url} cannot list and delete a table's files")
        stored = await provider.list_objects(f"{folder}/{DATA_FOLDER}")
        cutoff = now_ms() - int(grace_seconds * 1000)
        doomed = [
            item.key
            for item in stored
            if item.key.removeprefix(folder + "/") not in referenced and item.last_modified <= cutoff
        ]
        if doomed:
            await provider.delete_objects(doomed)
            log.info("table folder %s: deleted %d unreferenced data files", folder, len(doomed))
        return len(doomed)
    finally:
        await provider.close()
