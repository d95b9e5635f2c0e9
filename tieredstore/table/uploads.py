"""Uploading a table's data files through our own object-store client, the one the archive's objects go through.

On S3 (and fsspec object stores) a sync's Parquet file is encoded into memory and stored with one PUT by the
cold tier's provider: the same endpoint, credentials, server-side encryption, timeouts, retries and CRC32
checksums as every archived object, where pyarrow's S3 file system would send a multipart upload of its own
(aws-chunked parts with trailing checksums). On POSIX the file is streamed to disk through pyiceberg's FileIO.
"""

from __future__ import annotations

import asyncio

from tieredstore.config import TieredStoreConfig
from tieredstore.errors import StorageError
from tieredstore.providers.base import PutsObjects
from tieredstore.providers.registry import url_scheme
from tieredstore.runtime import open_cold_provider
from tieredstore.table.catalog import cold_key
from tieredstore.table.data_files import Upload


def object_upload(config: TieredStoreConfig, location: str) -> Upload | None:
    """How the data files of a table at ``location`` are stored whole, or None to stream them through its FileIO
    (a POSIX cold tier, or a table a catalog placed outside the cold URL)."""
    if url_scheme(config.effective_cold_url) == "file" or cold_key(config, location) is None:
        return None

    def upload(path: str, data: bytes) -> None:
        key = cold_key(config, path)
        if key is None:
            raise StorageError(f"{path} is not under the cold URL, where the table's files are uploaded")
        asyncio.run(_put(config, key, data))

    return upload


async def _put(config: TieredStoreConfig, key: str, data: bytes) -> None:
    provider = open_cold_provider(config)
    try:
        if not isinstance(provider, PutsObjects):
            raise StorageError(f"{provider.url} cannot store a table's data file")
        await provider.put_object(key, data)
    finally:
        await provider.close()
