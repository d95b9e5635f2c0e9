"""A segment and a provider that run another provider's storage core: the base of cross-cutting wrappers.

A wrapper (a rate limit, a watchdog, injected faults) changes how storage calls are made, never what a
segment is: ``WrappedSegment`` keeps the base class's buffers and positions itself and hands each of
the seven storage calls to the inner segment, so a wrapper overrides only the calls it changes.
``WrappedProvider`` makes such segments and passes listings and the life cycle through.
"""

from __future__ import annotations

from typing import ClassVar

from tieredstore.errors import StorageError
from tieredstore.formats.naming import FileType
from tieredstore.providers.base import FileSegment, ListsObjects, Provider, StoredObject
from tieredstore.providers.codec import Codecs, Keyring


class WrappedSegment(FileSegment):
    """A segment whose storage calls go to ``inner``; subclasses override the calls they change."""

    def __init__(self, inner: FileSegment) -> None:
        super().__init__(
            inner.segment_id,
            commit_position=inner.commit_position,
            max_size=inner.max_size,
            max_pending_buffers=inner.max_pending_buffers,
        )
        self.inner = inner

    async def _real_size(self) -> int:
        return await self.inner._real_size()

    async def _exists(self) -> bool:
        return await self.inner._exists()

    async def _create(self) -> None:
        await self.inner._create()

    async def _destroy(self) -> None:
        await self.inner._destroy()

    async def _read(self, position: int, length: int) -> bytes:
        return await self.inner._read(position, length)

    async def _read_from(self, position: int, length: int) -> bytes:
        return await self.inner._read_from(position, length)

    async def _truncate(self, size: int) -> None:
        await self.inner._truncate(size)

    async def _commit(self, position: int, data: bytes | bytearray) -> None:
        await self.inner._commit(position, data)

    async def rewrap(self, keyring: Keyring, key_id: str | None = None) -> str | None:
        return await self.inner.rewrap(keyring, key_id)

    async def stored_key_id(self) -> str | None:
        return await self.inner.stored_key_id()


class WrappedProvider(Provider):
    """A provider over ``inner`` whose segments ``wrap`` turns into wrapped ones."""

    scheme: ClassVar[str] = "wrapped"

    def __init__(self, inner: Provider) -> None:
        super().__init__(inner.url)
        self.inner = inner

    @property
    def codecs(self) -> Codecs:
        return self.inner.codecs

    @codecs.setter
    def codecs(self, codecs: Codecs) -> None:
        self.inner.codecs = codecs

    def wrap(self, segment: FileSegment) -> FileSegment:
        """The segment this provider hands out for one of the inner provider's."""
        return WrappedSegment(segment)

    def segment(
        self,
        file_type: FileType,
        path: str,
        base_offset: int,
        *,
        commit_position: int = 0,
        max_size: int | None = None,
    ) -> FileSegment:
        return self.wrap(
            self.inner.segment(file_type, path, base_offset, commit_position=commit_position, max_size=max_size)
        )

    async def list_segments(self, path: str, file_type: FileType) -> list[int]:
        return await self.inner.list_segments(path, file_type)

    async def list_children(self, path: str) -> list[str]:
        return await self.inner.list_children(path)

    async def list_objects(self, path: str) -> list[StoredObject]:
        # Scrub's listing passes through a wrapper; a provider that cannot list objects says so here.
        if not isinstance(self.inner, ListsObjects):
            raise StorageError(f"{self.inner!r} cannot list objects with their last-modified times")
        return await self.inner.list_objects(path)

    async def prepare(self) -> None:
        await self.inner.prepare()

    async def close(self) -> None:
        await self.inner.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
