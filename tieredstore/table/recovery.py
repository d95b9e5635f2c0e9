"""A table the catalog forgot: its newest metadata file, found under the table's folder, to register again.

The catalog (the SQL catalog lives in the metadata database) can be lost while the table's files survive on
the cold tier, e.g. a lost SQLite file rebuilt with ``tieredstore db rebuild``. Creating a new table over the
old folder would backfill everything again and then delete the old data files as orphans; registering the
newest metadata file brings the table back as it was, offsets included, so the next sync adds only what is new.
"""

from __future__ import annotations

import asyncio
import re

from tieredstore.config import TieredStoreConfig
from tieredstore.errors import StorageError
from tieredstore.providers.base import ListsObjects
from tieredstore.runtime import open_cold_provider
from tieredstore.table.catalog import table_location, table_path

METADATA_FOLDER = "metadata"
# pyiceberg and Java Iceberg both name a table's versions <number>-<uuid>.metadata.json; the number grows.
_VERSION = re.compile(r"^(\d+)-[^/]*\.metadata\.json$")


def newest_metadata_location(config: TieredStoreConfig, topic: str) -> str | None:
    """The URL of the highest-numbered metadata file under ``topic``'s table folder, or None when it has none."""
    names = metadata_file_names(config, topic)
    versions = [(int(match.group(1)), name) for name in names if (match := _VERSION.match(name))]
    if not versions:
        return None
    return f"{table_location(config, topic)}/{METADATA_FOLDER}/{max(versions)[1]}"


def metadata_file_names(config: TieredStoreConfig, topic: str) -> list[str]:
    """The names of the files in ``topic``'s table metadata folder (none when it has no folder)."""
    return asyncio.run(_list_names(config, f"{table_path(config, topic)}/{METADATA_FOLDER}"))


async def _list_names(config: TieredStoreConfig, folder: str) -> list[str]:
    provider = open_cold_provider(config)
    try:
        if not isinstance(provider, ListsObjects):
            raise StorageError(f"{provider.url} cannot list a table's files")
        stored = await provider.list_objects(folder)
        return [item.key.rsplit("/", 1)[-1] for item in stored]
    finally:
        await provider.close()
