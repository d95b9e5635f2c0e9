"""The FileSegment provider interface: a small abstract core, and the base class that owns the rest.

A provider implements seven coroutines on one file of cold storage — ``_real_size``, ``_exists``,
``_create``, ``_destroy``, ``_read``, ``_commit`` and ``_truncate`` — and a ``Provider`` factory
that makes segments and lists what exists. The base class owns append buffers, the append and
commit positions, the max size, the single in-flight commit and failure correction: when a commit
raises, it asks the provider for the real size and moves the commit position there, so bytes that
landed although the reply was lost are never written twice and the rest is retried from the buffer.
"""

from __future__ import annotations

import abc
import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from tieredstore.basics import GIB, MIB
from tieredstore.errors import CommitConflictError, SizeUnknownError, StorageError, ValidationError
from tieredstore.formats.naming import FileType, segment_key
from tieredstore.providers.codec import Codecs, Keyring

DEFAULT_MAX_SIZE: dict[FileType, int | None] = {
    FileType.COMMIT_LOG: GIB,
    FileType.CONSUME_QUEUE: 100 * MIB,
    FileType.INDEX: None,  # unbounded
}
DEFAULT_MAX_PENDING_BUFFERS = 10_000


class AppendResult(enum.Enum):
    """What ``FileSegment.append`` did; never a string."""

    SUCCESS = "SUCCESS"
    FILE_FULL = "FILE_FULL"
    BUFFER_FULL = "BUFFER_FULL"
    FILE_CLOSED = "FILE_CLOSED"


@dataclass(frozen=True, slots=True)
class SegmentId:
    """Which file of cold storage: its type, the logical folder of its queue and its base offset."""

    file_type: FileType
    path: str
    base_offset: int

    @property
    def key(self) -> str:
        return segment_key(self.path, self.file_type, self.base_offset)


@dataclass(frozen=True, slots=True)
class ByteRange:
    """``length`` bytes from ``start`` within one segment."""

    start: int
    length: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.length < 0:
            raise ValidationError(f"byte range start={self.start} length={self.length} must not be negative")

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One object of cold storage as a listing shows it: its key under the provider root, its size
    and when it was last written (epoch milliseconds, as storage reports it)."""

    key: str
    size: int
    last_modified: int


@runtime_checkable
class ListsObjects(Protocol):
    """A provider that lists stored objects with their sizes and last-modified times (every shipped one)."""

    async def list_objects(self, path: str) -> list[StoredObject]:
        """Every object stored at or under the logical ``path`` ('' is the root), recursively, by key.

        A provider that stores a segment as one file lists that file under the segment's key; one that
        stores it in pieces lists each piece under ``<segment key>/``. A missing path lists nothing.
        """
        ...


@runtime_checkable
class DeletesObjects(Protocol):
    """A provider that deletes stored objects by key (every shipped one): for files that are not segments,
    such as an Iceberg table's Parquet files under the cold URL."""

    async def delete_objects(self, keys: Sequence[str]) -> None:
        """Delete each object at ``keys`` (as ``list_objects`` names them); a missing one is no error."""
        ...


@runtime_checkable
class PutsObjects(Protocol):
    """A provider that stores a whole object that is not a segment in one request (the object stores: S3,
    fsspec), such as an Iceberg table's Parquet file under the cold URL."""

    async def put_object(self, key: str, data: bytes | bytearray) -> None:
        """Store ``data`` at the logical ``key``, replacing what was there."""
        ...


class FileSegment(abc.ABC):
    """One file of cold storage with buffered appends and a commit position.

    ``commit_position`` is how many bytes are durable in the provider; ``append_position`` adds
    the buffered bytes not committed yet. Reads see only committed bytes and are trimmed at the
    commit position: a read wholly past it returns ``b""``.
    """

    def __init__(
        self,
        segment_id: SegmentId,
        *,
        commit_position: int = 0,
        max_size: int | None = None,
        max_pending_buffers: int = DEFAULT_MAX_PENDING_BUFFERS,
    ) -> None:
        self.segment_id = segment_id
        self._key: str | None = None
        self.max_size = max_size if max_size is not None else DEFAULT_MAX_SIZE[segment_id.file_type]
        self.max_pending_buffers = max_pending_buffers
        self._commit_position = commit_position
        self._buffers: list[bytes | bytearray] = []
        self._buffered_bytes = 0
        self._commit_lock = asyncio.Lock()
        self._closed = False
        self.min_timestamp: int | None = None
        self.max_timestamp: int | None = None

    # ---- the abstract core a provider implements -------------------------------------------------

    @abc.abstractmethod
    async def _real_size(self) -> int:
        """Bytes durable in storage: 0 when the file does not exist; SizeUnknownError when unknowable."""

    @abc.abstractmethod
    async def _exists(self) -> bool:
        """Whether the file exists in storage."""

    @abc.abstractmethod
    async def _create(self) -> None:
        """Create the empty file; creating an existing file is not an error."""

    @abc.abstractmethod
    async def _destroy(self) -> None:
        """Remove the file and everything it holds; a missing file is not an error."""

    @abc.abstractmethod
    async def _read(self, position: int, length: int) -> bytes:
        """Exactly ``length`` committed bytes from ``position`` (the base class has trimmed the range)."""

    async def _read_from(self, position: int, length: int) -> bytes:
        """At most ``length`` committed bytes from ``position``, at least one (the range is trimmed).

        A provider that stores a file in pieces stops at the end of the piece holding ``position``,
        so that one request serves the read; by default this is ``_read`` of the whole range.
        """
        return await self._read(position, length)

    @abc.abstractmethod
    async def _commit(self, position: int, data: bytes | bytearray) -> None:
        """Make ``data`` durable at ``position`` without ever overwriting committed bytes.

        ``position`` is where the base class believes the end is. When storage already holds bytes
        there (a lost reply, or another writer), they are compared with ``data``: a matching prefix
        counts as committed and only the rest is written; different bytes raise CommitConflictError.
        Any other failure raises a StorageError.
        """

    @abc.abstractmethod
    async def _truncate(self, size: int) -> None:
        """Remove every byte at or after ``size`` (recovery of orphan bytes); a no-op past the end."""

    # ---- identity and positions ------------------------------------------------------------------

    @property
    def file_type(self) -> FileType:
        return self.segment_id.file_type

    @property
    def base_offset(self) -> int:
        return self.segment_id.base_offset

    @property
    def key(self) -> str:
        key = self._key
        if key is None:
            # Asked for on every read (chunk keys, messages): hashed once, not each time.
            key = self._key = self.segment_id.key
        return key

    @property
    def commit_position(self) -> int:
        return self._commit_position

    @property
    def append_position(self) -> int:
        return self._commit_position + self._buffered_bytes

    @property
    def pending_bytes(self) -> int:
        return self._buffered_bytes

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def buffers_full(self) -> bool:
        """Whether ``append`` answers BUFFER_FULL now: the pending buffers must be committed first."""
        return len(self._buffers) >= self.max_pending_buffers

    @property
    def is_full(self) -> bool:
        return self.max_size is not None and self.append_position >= self.max_size

    def close(self) -> None:
        """Refuse further appends (FILE_CLOSED); buffered bytes may still be committed."""
        self._closed = True

    def forget_after(self, size: int) -> None:
        """Count only the first ``size`` committed bytes from now on, without any storage call; drops buffers.

        The later bytes stay in storage, past the size the caller then records (sealing the segment),
        where no read goes: reads stop at the commit position. For bytes nobody may delete (see
        ``FlatAppendFile.abandon_tail``).
        """
        if not 0 <= size <= self._commit_position:
            raise ValidationError(f"{self.key}: cannot count {size} of {self._commit_position} committed bytes")
        self._commit_position = size
        self._buffers = []
        self._buffered_bytes = 0

    # ---- appends and commits ---------------------------------------------------------------------

    def append(
        self, data: bytes | bytearray | memoryview, timestamp: int | None = None, max_timestamp: int | None = None
    ) -> AppendResult:
        """Buffer ``data`` at the append position. An empty segment admits one append of any size.

        ``timestamp`` (and ``max_timestamp`` when the data spans a time range) widen the segment's time
        range. A ``bytearray`` is taken over, not copied, so a whole batch reaches storage without a
        copy: the caller must not change it afterwards. A ``memoryview`` is copied.
        """
        if self._closed:
            return AppendResult.FILE_CLOSED
        if self.buffers_full:
            return AppendResult.BUFFER_FULL
        if self.max_size is not None and self.append_position > 0 and self.append_position + len(data) > self.max_size:
            return AppendResult.FILE_FULL
        self._buffers.append(data if isinstance(data, bytes | bytearray) else bytes(data))
        self._buffered_bytes += len(data)
        if timestamp is not None:
            newest = timestamp if max_timestamp is None else max_timestamp
            self.min_timestamp = timestamp if self.min_timestamp is None else min(self.min_timestamp, timestamp)
            self.max_timestamp = newest if self.max_timestamp is None else max(self.max_timestamp, newest)
        return AppendResult.SUCCESS

    async def commit(self) -> None:
        """Make every buffered byte durable, one commit in flight at a time.

        On failure the commit position is corrected from the provider's real size (when it can be
        known) and the bytes that did not land stay buffered for the next call; the error is re-raised.
        Bytes found at the commit position that are not ours raise CommitConflictError: this writer
        has been fenced and its buffer is kept untouched.
        """
        async with self._commit_lock:
            if not self._buffers:
                return
            data = self._collapse_buffers()
            position = self._commit_position
            try:
                await self._commit(position, data)
            except CommitConflictError:
                raise
            except Exception as error:
                await self._correct_after_failure(position, data, error)
                raise
            self._mark_committed(len(data), data)

    async def _correct_after_failure(self, position: int, data: bytes | bytearray, error: Exception) -> None:
        try:
            real = await self._real_size()
            landed = min(real - position, len(data))
            stored = await self._read(position, landed) if landed > 0 else b""
        except StorageError:
            return  # unknowable now: keep everything buffered; the provider resolves the overlap later
        if landed > 0:
            self._accept_landed(position, data, stored, error)

    def _accept_landed(self, position: int, data: bytes | bytearray, stored: bytes, cause: Exception | None) -> None:
        """Count ``stored`` (the bytes found at ``position``) as committed if they are the head of ``data``."""
        if stored != data[: len(stored)]:
            raise CommitConflictError(
                f"{self.key}: {len(stored)} bytes at position {position} were written by another writer"
            ) from cause
        self._mark_committed(len(stored), data)

    def _collapse_buffers(self) -> bytes | bytearray:
        """Join the pending buffers into one head buffer and return it; later appends queue behind it.

        A single buffer (one batch per commit, the archiver's case) is handed on as it is, not copied.
        """
        data = b"".join(self._buffers) if len(self._buffers) > 1 else self._buffers[0]
        self._buffers[:] = [data]
        return data

    def _mark_committed(self, count: int, data: bytes | bytearray) -> None:
        """The first ``count`` bytes of the head buffer ``data`` are durable; keep the rest and any later appends."""
        self._commit_position += count
        if not self._buffers or self._buffers[0] is not data:
            return  # destroyed meanwhile: nothing buffered any more
        rest = data[count:]
        if rest:
            self._buffers[0] = rest
        else:
            del self._buffers[0]
        self._buffered_bytes -= count

    async def correct_commit_position(self) -> int:
        """Set the commit position to the provider's real size (after a restart or a lost reply).

        Buffered bytes that the provider already holds are dropped from the buffer after checking
        they are ours (CommitConflictError otherwise); returns the corrected position. Raises
        SizeUnknownError when storage cannot say.
        """
        async with self._commit_lock:
            real = await self._real_size()
            if real > self._commit_position and self._buffers:
                data = self._collapse_buffers()
                landed = min(real - self._commit_position, len(data))
                stored = await self._read(self._commit_position, landed)
                self._accept_landed(self._commit_position, data, stored, None)
            self._commit_position = real
            return real

    # ---- reads and life cycle --------------------------------------------------------------------

    async def read(self, position: int, length: int) -> bytes:
        """Committed bytes in [position, position + length), trimmed at the commit position."""
        request = ByteRange(position, length)
        end = min(request.end, self._commit_position)
        if end <= request.start:
            return b""
        return await self._read(request.start, end - request.start)

    async def read_from(self, position: int, max_length: int) -> bytes:
        """Committed bytes from ``position`` for a reader going through the file in order.

        At least one byte when any is committed at ``position``, at most ``max_length``, and possibly
        fewer: an object-store provider stops at the end of the object holding ``position`` and reads
        it with one request, so the next call, starting there, costs one request too and no listing.
        """
        request = ByteRange(position, max_length)
        end = min(request.end, self._commit_position)
        if end <= request.start:
            return b""
        return await self._read_from(request.start, end - request.start)

    async def read_ranges(self, ranges: Sequence[ByteRange]) -> list[bytes]:
        return [await self.read(r.start, r.length) for r in ranges]

    async def rewrap(self, keyring: Keyring, key_id: str | None = None) -> str | None:
        """Wrap an encrypted segment's data key under ``key_id`` (the keyring's active key by default)
        without rewriting its data; returns the key id that wraps it now, None for a segment that is
        not encrypted (the default: a provider that never frames)."""
        return None

    async def stored_key_id(self) -> str | None:
        """The id of the key wrapping this segment's data key, as storage says, read without unwrapping
        anything; None when it is not encrypted (the default: a provider that never frames)."""
        return None

    async def real_size(self) -> int:
        """The provider's durable size: 0 for a missing file; SizeUnknownError when it cannot know."""
        return await self._real_size()

    async def exists(self) -> bool:
        return await self._exists()

    async def create(self) -> None:
        await self._create()

    async def destroy(self) -> None:
        """Delete the file from storage; the segment is closed and its buffers dropped."""
        self._closed = True
        self._buffers = []
        self._buffered_bytes = 0
        await self._destroy()

    async def truncate(self, size: int) -> None:
        """Drop committed bytes at and after ``size`` (crash recovery of unreferenced bytes).

        Buffered bytes are dropped too: after a truncation the caller re-appends what it still wants.
        """
        async with self._commit_lock:
            if size < 0:
                raise ValidationError(f"cannot truncate to negative size {size}")
            await self._truncate(size)
            self._commit_position = min(self._commit_position, size)
            self._buffers = []
            self._buffered_bytes = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r}, commit={self._commit_position}, append={self.append_position})"


class Provider(abc.ABC):
    """A cold-storage root: makes FileSegments for logical paths and lists what exists.

    ``url`` never carries credentials; ``scheme`` names the registry entry that built it.
    """

    scheme: ClassVar[str]

    def __init__(self, url: str) -> None:
        self.url = url
        self._codecs = Codecs()

    @property
    def codecs(self) -> Codecs:
        """How new segments are framed (compression, encryption) and the keyring framed ones are read with;
        by default nothing is framed and a segment framed earlier is read if it is not encrypted."""
        return self._codecs

    @codecs.setter
    def codecs(self, codecs: Codecs) -> None:
        self._codecs = codecs

    @abc.abstractmethod
    def segment(
        self,
        file_type: FileType,
        path: str,
        base_offset: int,
        *,
        commit_position: int = 0,
        max_size: int | None = None,
    ) -> FileSegment:
        """A handle on one segment; no I/O happens until it is used."""

    @abc.abstractmethod
    async def list_segments(self, path: str, file_type: FileType) -> list[int]:
        """Base offsets of the segments of ``file_type`` under ``path`` that exist, ascending."""

    @abc.abstractmethod
    async def list_children(self, path: str) -> list[str]:
        """Names of the folders directly under ``path`` ('' is the root); for metadata-free discovery."""

    async def prepare(self) -> None:  # noqa: B027 - an optional hook; most providers have nothing to build
        """Build what requests need (clients) before the first one, so that it does not pay for it;
        no request is made. The default needs nothing."""

    async def check_conditional_writes(self) -> bool:
        """Before this process writes: make sure storage refuses to create a file that exists, which
        fencing and "a commit never overwrites committed bytes" rest on; ConditionalWritesUnsupportedError
        otherwise. Checked once per provider; True when this call asked storage (an object-store probe).
        Storage that cannot be reached raises StorageUnavailableError, and is then checked again before
        the provider's first write. The default has nothing to check: a local file is compared and
        written under the operating system's exclusive lock."""
        return False

    async def close(self) -> None:  # noqa: B027 - an optional hook; most providers hold no connections
        """Release connections; the default holds none."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    async def __aenter__(self) -> Provider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = [
    "DEFAULT_MAX_SIZE",
    "AppendResult",
    "ByteRange",
    "FileSegment",
    "ListsObjects",
    "Provider",
    "SegmentId",
    "SizeUnknownError",
    "StoredObject",
]
