"""A commit watchdog as a provider wrapper: no storage call of a segment may wait longer than a timeout.

An upload that hangs (a server that accepts the request and never answers, a black-holed connection, a
hung network file system) would otherwise hold its queue's commit forever. A call that takes longer
than ``timeout`` is abandoned: a commit raises CommitTimeoutError, a size lookup SizeUnknownError and
any other call StorageUnavailableError, so the base class corrects the commit position as after any
failure, keeps the unwritten bytes buffered, and the archiver retries them with backoff.

"No progress" is measured as the whole call exceeding the timeout. Progress inside one call cannot be
seen: an S3 upload is one PUT sent by botocore in a worker thread (one request per chunk, a chunk being
at most one batch or one 8 MiB piece of an index file), a POSIX commit one ``pwrite`` and ``fsync``. At
the 120 s default a call fails only on a link slower than about 70 KiB/s for the largest chunk, while a
healthy one completes in well under a second; the S3 client's own ``read_timeout`` does not bound a
call, since it is per socket read and each failed attempt is retried.

An abandoned call is cancelled, but a request already handed to a worker thread runs on until storage
answers. It cannot corrupt what the retry writes: on S3 it is a conditional create of the chunk named
by its position, so it either lands first (the retry finds the same bytes there and counts them) or is
refused (If-None-Match); on POSIX no other write to the file starts until its thread returns
(``PosixProvider.ask_to_write``), so it lands before the retry, which finds its bytes and counts them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import ClassVar, TypeVar

from tieredstore.errors import CommitTimeoutError, SizeUnknownError, StorageError, StorageUnavailableError
from tieredstore.providers.base import FileSegment, Provider
from tieredstore.providers.wrapper import WrappedProvider, WrappedSegment

T = TypeVar("T")


class WatchdogSegment(WrappedSegment):
    """A segment whose storage calls are abandoned after ``timeout`` seconds (a typed, retryable error)."""

    def __init__(self, inner: FileSegment, timeout: float) -> None:
        super().__init__(inner)
        self.timeout = timeout

    async def _bounded(self, call: Awaitable[T], what: str, error: type[StorageError]) -> T:
        deadline = asyncio.timeout(self.timeout)
        try:
            async with deadline:
                return await call
        except TimeoutError as cause:
            if not deadline.expired():
                raise  # the call's own timeout, already an error of the provider's kind
            raise error(f"{self.key}: {what} made no progress for {self.timeout:g}s; abandoned") from cause

    async def _commit(self, position: int, data: bytes | bytearray) -> None:
        await self._bounded(
            self.inner._commit(position, data), f"commit of {len(data)} bytes at {position}", CommitTimeoutError
        )

    async def _real_size(self) -> int:
        return await self._bounded(self.inner._real_size(), "size lookup", SizeUnknownError)

    async def _exists(self) -> bool:
        return await self._bounded(self.inner._exists(), "existence check", StorageUnavailableError)

    async def _create(self) -> None:
        await self._bounded(self.inner._create(), "create", StorageUnavailableError)

    async def _destroy(self) -> None:
        await self._bounded(self.inner._destroy(), "destroy", StorageUnavailableError)

    async def _read(self, position: int, length: int) -> bytes:
        return await self._bounded(
            self.inner._read(position, length), f"read of {length} bytes at {position}", StorageUnavailableError
        )

    async def _read_from(self, position: int, length: int) -> bytes:
        return await self._bounded(
            self.inner._read_from(position, length), f"read at {position}", StorageUnavailableError
        )

    async def _truncate(self, size: int) -> None:
        await self._bounded(self.inner._truncate(size), f"truncate to {size}", StorageUnavailableError)


class WatchdogProvider(WrappedProvider):
    """A provider whose segments' storage calls are each bounded by ``timeout`` seconds."""

    scheme: ClassVar[str] = "watchdog"

    def __init__(self, inner: Provider, timeout: float) -> None:
        super().__init__(inner)
        self.timeout = timeout

    def wrap(self, segment: FileSegment) -> WatchdogSegment:
        return WatchdogSegment(segment, self.timeout)
