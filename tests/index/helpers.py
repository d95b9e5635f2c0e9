"""Test helpers for the key index: a memory provider that counts ranged reads and injects commit outages."""

from __future__ import annotations

import uuid

from tieredstore.errors import StorageUnavailableError
from tieredstore.formats.naming import FileType
from tieredstore.providers.memory import MemoryProvider, MemorySegment


class CountingSegment(MemorySegment):
    """A memory segment that reports each provider read to its provider's counter."""

    counter: CountingProvider

    async def _read(self, position: int, length: int) -> bytes:
        self.counter.reads.append((self.key, position, length))
        return await super()._read(position, length)

    async def _commit(self, position: int, data: bytes) -> None:
        if self.counter.commits_left is not None:
            if self.counter.commits_left == 0:
                raise StorageUnavailableError(f"{self.key}: injected outage at position {position}")
            self.counter.commits_left -= 1
        await super()._commit(position, data)


class CountingProvider(MemoryProvider):
    """MemoryProvider that records every ranged read in ``reads`` (key, position, length) and can fail commits."""

    def __init__(self, url: str | None = None) -> None:
        super().__init__(url or f"memory://index-{uuid.uuid4().hex}")
        self.reads: list[tuple[str, int, int]] = []
        self.commits_left: int | None = None  # commits that succeed before an injected outage; None: no outage

    def segment(
        self,
        file_type: FileType,
        path: str,
        base_offset: int,
        *,
        commit_position: int = 0,
        max_size: int | None = None,
    ) -> CountingSegment:
        plain = super().segment(file_type, path, base_offset, commit_position=commit_position, max_size=max_size)
        counted = CountingSegment(
            self.volume, plain.segment_id, commit_position=plain.commit_position, max_size=plain.max_size
        )
        counted.counter = self
        return counted
