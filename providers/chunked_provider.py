"""The provider of chunked segments and the check it makes before writing: storage must refuse to create
an object that exists (``If-None-Match: *``), since fencing a zombie writer rests on it (see
``providers.chunks`` for the scheme).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import uuid
from collections.abc import Sequence

from tieredstore.errors import ConditionalWritesUnsupportedError, StorageError
from tieredstore.formats.naming import FileType, parse_segment_name
from tieredstore.providers.base import Provider, SegmentId, StoredObject
from tieredstore.providers.chunks import PROBE_FOLDER, ChunkedSegment, ObjectStore
from tieredstore.providers.paths import check_logical_path
from tieredstore.providers.s3_choices import UNSUPPORTED_SETTING


async def probe_conditional_create(store: ObjectStore, where: str) -> None:
    """Create one new key under PROBE_FOLDER twice, then delete it; ConditionalWritesUnsupportedError
    unless storage created it the first time and refused the second."""
    name = uuid.uuid4().hex
    key, ours = f"{PROBE_FOLDER}/{name}", f"first create {name}".encode()
    try:
        first = await store.put_if_absent(key, ours)
        if not first:
            # A create retried after its reply was lost finds itself there: nobody else writes this key.
            first = await store.get_range(key, 0, len(ours) + 1) == ours
        second = await store.put_if_absent(key, b"second create")
    except BaseException:
        with contextlib.suppress(StorageError):
            await store.delete([key])
        raise
    await store.delete([key])
    if first and not second:
        return
    happened = (
        "a second conditional create (If-None-Match: *) of one key replaced it instead of being refused"
        if first
        else "a conditional create (If-None-Match: *) of a new key was refused as if it existed"
    )
    raise ConditionalWritesUnsupportedError(
        f"{where}: {happened} (probe under {PROBE_FOLDER}/), so a retried or zombie write could overwrite "
        f"archived bytes; refusing to archive there. Set {UNSUPPORTED_SETTING} to archive with one archiver "
        "only (no leases), each chunk read back after it is written"
    )


class ChunkedProvider(Provider):
    """A provider whose segments are ChunkedSegments in one ObjectStore."""

    _conditional_create_checked = False
    # Set by the first check: until one passes, each commit checks first (storage was unreachable).
    _check_before_writes = False
    _check_lock: asyncio.Lock | None = None

    @property
    @abc.abstractmethod
    def store(self) -> ObjectStore:
        """The object store under this provider's root."""

    def segment(
        self,
        file_type: FileType,
        path: str,
        base_offset: int,
        *,
        commit_position: int = 0,
        max_size: int | None = None,
    ) -> ChunkedSegment:
        return ChunkedSegment(
            self.store,
            SegmentId(file_type, check_logical_path(path), base_offset),
            before_write=self._before_write,
            codecs=self.codecs,
            commit_position=commit_position,
            max_size=max_size,
        )

    async def list_segments(self, path: str, file_type: FileType) -> list[int]:
        check_logical_path(path)
        offsets = []
        for name in await self.store.list_folders(f"{path}/{file_type.value}"):
            with contextlib.suppress(ValueError):
                offsets.append(parse_segment_name(name))
        return sorted(offsets)

    async def list_children(self, path: str) -> list[str]:
        check_logical_path(path, allow_root=True)
        return sorted(await self.store.list_folders(path))

    async def list_objects(self, path: str) -> list[StoredObject]:
        check_logical_path(path, allow_root=True)
        # A segment is a folder of chunks here: nothing is stored at a segment's own key.
        return sorted(await self.store.list_tree(path), key=lambda stored: stored.key)

    async def delete_objects(self, keys: Sequence[str]) -> None:
        await self.store.delete([check_logical_path(key) for key in keys])

    async def put_object(self, key: str, data: bytes | bytearray) -> None:
        await self.store.put(check_logical_path(key), data)

    async def check_conditional_writes(self) -> bool:
        if not self.store.conditional_create or self._conditional_create_checked:
            return False
        self._check_before_writes = True
        if self._check_lock is None:
            self._check_lock = asyncio.Lock()
        async with self._check_lock:  # queues committing at once wait for one probe
            if self._conditional_create_checked:
                return False
            await probe_conditional_create(self.store, self.url)
            self._conditional_create_checked = True
        return True

    async def _before_write(self) -> None:
        if self._check_before_writes and not self._conditional_create_checked:
            await self.check_conditional_writes()

    async def close(self) -> None:
        await self.store.close()
