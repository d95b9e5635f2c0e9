"""The key index: messages found by ``topic#key`` in local and uploaded index files.

``format`` holds the byte layouts, ``file`` the local files and lookups, ``records`` the catalogue of index
files, ``service`` the IndexService (with its parts ``service_state``, ``lookups`` and ``retention``),
``namespaces`` the KeyIndex over the namespaces of archivers that share queues by lease.
"""

from tieredstore.index.service import (
    ConfirmKeys,
    IndexCatalogue,
    IndexEntry,
    IndexFileRecord,
    IndexFileStatus,
    IndexHit,
    IndexService,
    JsonIndexCatalogue,
    MemoryIndexCatalogue,
)

__all__ = [
    "ConfirmKeys",
    "IndexCatalogue",
    "IndexEntry",
    "IndexFileRecord",
    "IndexFileStatus",
    "IndexHit",
    "IndexService",
    "JsonIndexCatalogue",
    "MemoryIndexCatalogue",
]
