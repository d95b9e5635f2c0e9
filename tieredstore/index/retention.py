"""Retention of IndexService: deleting index files whose newest item is older than a cut-off."""

from __future__ import annotations

import asyncio

from tieredstore.index.records import IndexFileRecord, IndexFileStatus
from tieredstore.index.service_state import IndexServiceState


class IndexRetention(IndexServiceState):
    """Finds and deletes expired index files from cold storage, the index directory and the catalogue."""

    def _expired(self, before_timestamp: int, *, uploaded_only: bool) -> list[IndexFileRecord]:
        """Files whose newest item is older than ``before_timestamp`` (live counts for the current file)."""
        return [
            record
            for record in self.files()
            if record.item_count
            and record.end_timestamp is not None
            and record.end_timestamp < before_timestamp
            and (record.status is IndexFileStatus.UPLOAD or not uploaded_only)
        ]

    async def expired_files(self, before_timestamp: int, *, uploaded_only: bool = False) -> list[int]:
        """The ids ``delete_expired`` would remove now, changing nothing (a dry run)."""
        self._require_started()
        if self.read_only:
            await asyncio.to_thread(self._reload_catalogue)
        return [record.file_id for record in self._expired(before_timestamp, uploaded_only=uploaded_only)]

    async def delete_expired(
        self, before_timestamp: int, *, uploaded_only: bool = False, local_only: bool = False
    ) -> list[int]:
        """Delete every index file whose newest item is older than ``before_timestamp``; returns their ids.

        Cold bytes go first, then local files, then the record, so an interrupted deletion is finished
        by the next call instead of leaving a record that points at nothing. ``uploaded_only`` is
        retention of a namespace whose archiver runs elsewhere, or is gone, and is allowed read-only:
        its uploaded files are immutable, so deleting them cannot race a write, and its local files
        are left to their owner. ``local_only`` is the converse, for an owner whose uploaded files
        another archiver deletes (``KeyIndex.delete_expired``): it stops answering from them, and
        returns only the ids it deleted itself.
        """
        if not uploaded_only:
            self._refuse_if_read_only("delete index files")
        self._require_started()
        if self.read_only:
            await asyncio.to_thread(self._reload_catalogue)
        removed = []
        async with self._maintain_lock, self._write_lock:
            for record in self._expired(before_timestamp, uploaded_only=uploaded_only):
                if local_only and record.status is IndexFileStatus.UPLOAD:
                    self._records.pop(record.file_id, None)
                    continue
                current = self._current
                if current is not None and current.file_id == record.file_id:
                    current.close()
                    self._current = None
                await self._forget(record, local=not uploaded_only)
                removed.append(record.file_id)
        return removed
