"""Segments as runs of immutable chunk objects: the scheme shared by the S3 and fsspec providers.

Object stores have no append. A segment ``<key>`` is a folder of chunk objects
``<key>/<%020d start>``, each written once by a conditional create, plus an empty marker
``<key>/.created`` written by ``create``. The segment's size is the end of the contiguous run of
chunks from position 0, learned from one listing. A commit that finds its chunk already there
compares bytes: the same bytes (a retry whose first reply was lost) count as committed, a prefix of
ours counts as committed and the rest goes into the next chunk, anything else is a
CommitConflictError and nothing is overwritten.

A provider supplies an ``ObjectStore`` (list, ranged get, put-if-absent, put, delete) that raises
only the typed tree; ``ChunkedSegment`` and ``ChunkedProvider`` do the rest.

Conditional writes are checked, not assumed: some S3-compatible servers accept ``If-None-Match: *`` and
ignore it. Before a process writes, ``ChunkedProvider.check_conditional_writes`` creates one new key
under ``.tieredstore-probe/`` twice and deletes it; a store that does not refuse the second create is
refused with ConditionalWritesUnsupportedError. Once asked for, the check also guards every commit
until it has passed, so storage unreachable at the first check is checked before its first write. A
store that does not claim a conditional create
(``conditional_create`` False: S3 configured with conditional_writes = "unsupported", fsspec filesystems
without one) is not probed; instead every chunk is read back after it is written, so that another
writer's bytes in it are a CommitConflictError rather than a silent loss (they can still have replaced
bytes committed earlier: such storage is for one writer at a time).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import datetime as dt
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from tieredstore.errors import (
    CommitConflictError,
    IntegrityError,
    SegmentNotFoundError,
    SizeUnknownError,
    StorageError,
    StorageUnavailableError,
)
from tieredstore.formats.naming import FileType
from tieredstore.providers.base import FileSegment, SegmentId, StoredObject
from tieredstore.providers.codec import (
    DESCRIPTOR_NAME,
    HEADER_SIZE,
    MAX_FRAME,
    Codecs,
    Keyring,
    SegmentFormat,
    descriptor_key_id,
    is_frame,
    new_format,
    parse_descriptor,
    read_header,
)

CREATED_MARKER = ".created"
# Where the conditional-create probe writes (under the store's root; no cluster folder starts with a dot).
PROBE_FOLDER = ".tieredstore-probe"
# ASCII digits only, matched whole: "\d" takes any Unicode digit and "$" a trailing newline, and either
# would let a foreign object alias a chunk.
_CHUNK_NAME = re.compile(r"[0-9]{20}")
# A length past any object's end: a frame is read whole, and its stored size is known only from a listing.
WHOLE = 1 << 40


def chunk_name(start: int) -> str:
    """The object name of the chunk starting at byte ``start``: 20 zero-padded digits, so names sort."""
    return f"{start:020d}"


def epoch_ms(value: dt.datetime | float | int | str) -> int:
    """A last-modified time as object stores report it (a datetime, ISO-8601 text, or epoch seconds) in
    epoch milliseconds; a naive datetime is UTC."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return int(moment.timestamp() * 1000)
    return int(value * 1000)


def parse_chunk_name(name: str) -> int | None:
    """The start position in a chunk name, or None for any other object (the marker, foreign files)."""
    return int(name) if _CHUNK_NAME.fullmatch(name) else None


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object directly inside a folder: its last name component and its size in bytes."""

    name: str
    size: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """``size`` bytes of a segment stored as one object, starting at ``start``; a frame of a framed
    segment stores them in ``stored`` bytes (None: unframed, the object holds the bytes as they are)."""

    start: int
    size: int
    stored: int | None = None

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def name(self) -> str:
        return chunk_name(self.start)


@dataclass(frozen=True, slots=True)
class ChunkSlice:
    """The part of one chunk a read needs: ``length`` bytes from ``offset`` within the chunk."""

    chunk: Chunk
    offset: int
    length: int


def chunks_in(objects: Iterable[ObjectInfo]) -> list[Chunk]:
    """Every chunk among ``objects``, ordered by start; other objects are ignored."""
    chunks = []
    for info in objects:
        start = parse_chunk_name(info.name)
        if start is not None:
            chunks.append(Chunk(start, info.size))
    return sorted(chunks, key=lambda chunk: chunk.start)


def contiguous_run(chunks: Sequence[Chunk]) -> list[Chunk]:
    """The chunks that follow each other without a gap from position 0 (``chunks`` sorted by start).

    An empty chunk ends the run: it would make the next chunk's name ambiguous.
    """
    run: list[Chunk] = []
    end = 0
    for chunk in chunks:
        if chunk.start != end or chunk.size == 0:
            break
        run.append(chunk)
        end = chunk.end
    return run


def slices_for(run: Sequence[Chunk], position: int, length: int) -> list[ChunkSlice]:
    """Which parts of which chunks hold ``[position, position + length)``; empty if the run does not cover it."""
    end = position + length
    if length <= 0 or not run or run[-1].end < end:
        return []
    slices = []
    for chunk in run:
        if chunk.end <= position or chunk.start >= end:
            continue
        start = max(position, chunk.start)
        slices.append(ChunkSlice(chunk, start - chunk.start, min(end, chunk.end) - start))
    return slices


class ObjectStore(abc.ABC):
    """The object operations a chunked segment needs. Keys are ``/``-separated and relative to the
    store's root; every method raises only the tieredstore.errors tree.

    ``file_type`` says what a written object belongs to (a segment's chunk), None for anything else
    (markers, probes); a store may place objects by it (an S3 storage class).
    """

    # Whether ``put_if_absent`` asks storage itself to refuse an existing key (then it is probed once
    # before writing); False: chunks are read back after they are written (see the module docstring).
    conditional_create: bool = True

    @abc.abstractmethod
    async def list_files(self, folder: str) -> list[ObjectInfo]:
        """Objects directly inside ``folder`` (not deeper); empty when the folder does not exist."""

    @abc.abstractmethod
    async def list_folders(self, folder: str) -> list[str]:
        """Names of the folders directly inside ``folder`` ('' is the root)."""

    async def list_tree(self, folder: str) -> list[StoredObject]:
        """Every object under ``folder`` ('' the root), recursively, keyed from the store's root, with its
        size and last-modified time. Not abstract so that a store written before it still opens; the
        shipped stores implement it."""
        raise StorageError(f"{type(self).__name__} cannot list objects with their last-modified times")

    @abc.abstractmethod
    async def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``key`` from ``start`` (fewer at its end); SegmentNotFoundError if missing."""

    @abc.abstractmethod
    async def put_if_absent(self, key: str, data: bytes | bytearray, *, file_type: FileType | None = None) -> bool:
        """Create ``key`` holding ``data`` unless it exists: True if written, False if it was there."""

    @abc.abstractmethod
    async def put(self, key: str, data: bytes | bytearray, *, file_type: FileType | None = None) -> None:
        """Write ``key``, replacing what it held (used only to shorten a chunk during truncation)."""

    @abc.abstractmethod
    async def delete(self, keys: Sequence[str]) -> None:
        """Remove ``keys`` one after another in the given order; missing keys are not an error."""

    async def folder_exists(self, folder: str) -> bool:
        return bool(await self.list_files(folder))

    async def close(self) -> None:  # noqa: B027 - an optional hook; a local store holds no connections
        """Release connections."""


class ChunkedSegment(FileSegment):
    """A segment held as a run of immutable chunk objects in an ObjectStore.

    The chunks this handle has seen are remembered (they never change), so reads after the first
    one cost no listing; a listing happens only to learn the size or after a restart.

    A folder holding a ``.codec`` object is framed (``providers.codec``): each chunk is one frame named
    by its logical start, read whole and decoded, and positions stay logical. Whether a segment is
    framed is learned from its listing, or from the first frame a read by name meets, and never changes.
    """

    def __init__(
        self,
        store: ObjectStore,
        segment_id: SegmentId,
        *,
        before_write: Callable[[], Awaitable[object]] | None = None,
        codecs: Codecs | None = None,
        **kwargs: int | None,
    ) -> None:
        """``before_write`` runs before each commit writes anything (the provider's conditional-write check)."""
        super().__init__(segment_id, **kwargs)  # type: ignore[arg-type]
        self._store = store
        self._before_write = before_write
        self._known_run: list[Chunk] | None = None
        self._codecs = codecs if codecs is not None else Codecs()
        # Whether the segment is framed (None: not learned yet), and its format, read from ``.codec`` only
        # when a frame is decoded or written: sizing a segment needs no key.
        self._framed: bool | None = None
        self._format: SegmentFormat | None = None
        self._decoded: tuple[int, bytes] | None = None  # the last frame decoded: windows straddle frames

    def _chunk_key(self, start: int) -> str:
        return f"{self.key}/{chunk_name(start)}"

    @property
    def framed_format(self) -> SegmentFormat | None:
        """This segment's framed format, None while unframed or not known yet."""
        return self._format

    async def _load_run(self) -> list[Chunk]:
        objects = await self._store.list_files(self.key)
        chunks = chunks_in(objects)
        if any(info.name == DESCRIPTOR_NAME for info in objects):
            self._framed = True
            run = await self._framed_run(chunks)
        else:
            if chunks:
                self._framed = False
            run = contiguous_run(chunks)
        self._known_run = run
        return run

    async def _learn_format(self) -> SegmentFormat:
        if self._format is None:
            where = self.key
            descriptor = await read_descriptor(self._store, self.key)
            if descriptor is None:
                raise IntegrityError(f"{where}: a framed chunk but no {DESCRIPTOR_NAME} object")
            # In a worker thread: unwrapping may be a call to KMS.
            self._format = await asyncio.to_thread(parse_descriptor, descriptor, self._codecs.keyring, where)
        self._framed = True
        return self._format

    async def _framed_run(self, chunks: Sequence[Chunk]) -> list[Chunk]:
        """The contiguous frames from 0: each ends where the next starts, the last where its header says."""
        run: list[Chunk] = []
        for index, chunk in enumerate(chunks):
            if chunk.start != (run[-1].end if run else 0) or chunk.size < HEADER_SIZE:
                break
            if index + 1 < len(chunks):
                size = chunks[index + 1].start - chunk.start
            else:
                header = await self._store.get_range(self._chunk_key(chunk.start), 0, HEADER_SIZE)
                size = read_header(header, self.key)[0]
            if size <= 0:
                break
            run.append(Chunk(chunk.start, size, chunk.size))
        return run

    async def _frame(self, chunk: Chunk) -> bytes:
        """The logical bytes of one frame, fetched whole and decoded."""
        decoded = self._decoded
        if decoded is not None and decoded[0] == chunk.start:
            return decoded[1]
        blob = await self._store.get_range(self._chunk_key(chunk.start), 0, chunk.stored or WHOLE)
        data = await (await self._learn_format()).decode_async(blob, self.key, chunk.start)
        if len(data) != chunk.size:
            raise IntegrityError(
                f"{self.key}: frame at {chunk.start} holds {len(data)} bytes where the next starts after {chunk.size}"
            )
        self._decoded = (chunk.start, data)
        return data

    async def _real_size(self) -> int:
        try:
            run = await self._load_run()
        except StorageUnavailableError as error:
            raise SizeUnknownError(f"{self.key}: size unknown while storage is unavailable: {error}") from error
        return run[-1].end if run else 0

    async def _exists(self) -> bool:
        return await self._store.folder_exists(self.key)

    async def _create(self) -> None:
        await self._writing_format(0)
        await self._store.put_if_absent(f"{self.key}/{CREATED_MARKER}", b"")

    async def _destroy(self) -> None:
        self._known_run = None
        self._decoded = None
        objects = await self._store.list_files(self.key)
        chunks = chunks_in(objects)
        others = [info.name for info in objects if parse_chunk_name(info.name) is None]
        # Last chunk first, the marker last: a destroy cut short still looks like a shorter segment.
        ordered = [chunk.name for chunk in reversed(chunks)]
        ordered += sorted(others, key=lambda name: name == CREATED_MARKER)
        await self._store.delete([f"{self.key}/{name}" for name in ordered])
        self._format, self._framed = None, None

    async def _read(self, position: int, length: int) -> bytes:
        run = self._known_run
        slices = slices_for(run, position, length) if run else []
        if not slices:
            slices = slices_for(await self._load_run(), position, length)
        if not slices:
            raise SegmentNotFoundError(f"{self.key}: storage no longer holds bytes {position}..{position + length}")
        if self._framed:
            frames = await asyncio.gather(*(self._frame(s.chunk) for s in slices))
            return b"".join(frame[s.offset : s.offset + s.length] for frame, s in zip(frames, slices, strict=True))
        parts = await asyncio.gather(
            *(self._store.get_range(self._chunk_key(s.chunk.start), s.offset, s.length) for s in slices)
        )
        return b"".join(parts)

    async def _read_from(self, position: int, length: int) -> bytes:
        """The rest of the chunk holding ``position``, at most ``length`` bytes: one GET.

        Before the chunks are listed, a chunk starting at ``position`` is read by its name: a reader
        going from chunk to chunk (each read starting where the last one ended) never lists at all.
        """
        run = self._known_run
        if not run or run[-1].end <= position:
            with contextlib.suppress(SegmentNotFoundError):
                data = await self._read_by_name(position, length)
                if data:
                    return data
            run = await self._load_run()
        slices = slices_for(run, position, 1)
        if not slices:
            raise SegmentNotFoundError(f"{self.key}: storage no longer holds byte {position}")
        holding = slices[0]
        if self._framed:
            frame = await self._frame(holding.chunk)
            return frame[holding.offset : holding.offset + length]
        return await self._store.get_range(
            self._chunk_key(holding.chunk.start), holding.offset, min(length, holding.chunk.size - holding.offset)
        )

    async def _read_by_name(self, position: int, length: int) -> bytes:
        key = self._chunk_key(position)
        if self._framed:
            blob = await self._store.get_range(key, 0, WHOLE)
        else:
            blob = await self._store.get_range(key, 0, length)
            if self._framed is False or not is_frame(blob):
                return blob
            if len(blob) >= length:  # only the frame's head: its rest is fetched beside the descriptor
                _, rest = await asyncio.gather(self._learn_format(), self._store.get_range(key, len(blob), WHOLE))
                blob += rest
        frame = await (await self._learn_format()).decode_async(blob, self.key, position)
        self._decoded = (position, frame)
        self._remember(Chunk(position, len(frame), len(blob)))
        return frame[:length]

    def _remember(self, chunk: Chunk) -> None:
        if chunk.start == 0:
            self._known_run = [chunk]
        elif self._known_run and self._known_run[-1].end == chunk.start:
            self._known_run.append(chunk)

    async def _writing_format(self, position: int) -> SegmentFormat | None:
        """The format a commit at ``position`` writes in: the segment's own once known, else the codec
        policy's for a new segment (its ``.codec`` written first; one already there wins)."""
        if self._framed is None and position > 0:
            await self._load_run()
        if self._framed is not None:
            return await self._learn_format() if self._framed else None
        codec = self._codecs.for_segment(self.segment_id)
        if codec is None:
            return None
        chosen = await asyncio.to_thread(new_format, codec, self._codecs.keyring, self.key)
        if not await self._store.put_if_absent(f"{self.key}/{DESCRIPTOR_NAME}", chosen.descriptor()):
            self._format = None
            return await self._learn_format()  # another attempt's descriptor: its data key holds
        self._format, self._framed = chosen, True
        return chosen

    async def _commit(self, position: int, data: bytes | bytearray) -> None:
        if self._before_write is not None:
            await self._before_write()
        framed = await self._writing_format(position)
        if framed is not None:
            await self._commit_frames(framed, position, data)
            return
        while data:
            key = self._chunk_key(position)
            if await self._store.put_if_absent(key, data, file_type=self.file_type):
                if not self._store.conditional_create:
                    await check_written(self._store, key, data, f"{self.key}: chunk at position {position}")
                self._remember(Chunk(position, len(data)))
                return
            # One byte more than ours tells a longer chunk apart from an equal one.
            existing = await self._store.get_range(key, 0, len(data) + 1)
            if existing == data:
                self._remember(Chunk(position, len(data)))
                return
            if not existing or len(existing) > len(data) or not data.startswith(existing):
                raise CommitConflictError(
                    f"{self.key}: chunk at position {position} already holds other bytes; nothing was overwritten"
                )
            self._remember(Chunk(position, len(existing)))
            position += len(existing)
            data = data[len(existing) :]

    async def _commit_frames(self, framed: SegmentFormat, position: int, data: bytes | bytearray) -> None:
        """Write ``data`` as frames of at most MAX_FRAME bytes; a frame already there must hold our bytes
        (a retry whose reply was lost) or a head of them, as with unframed chunks."""
        view = memoryview(data)
        done = 0
        while done < len(view):
            start = position + done
            piece = view[done : done + MAX_FRAME]
            frame = await framed.encode_async(piece, self.key, start)
            key = self._chunk_key(start)
            if await self._store.put_if_absent(key, frame, file_type=self.file_type):
                if not self._store.conditional_create:
                    await check_written(self._store, key, frame, f"{self.key}: chunk at position {start}")
                self._remember(Chunk(start, len(piece), len(frame)))
                done += len(piece)
                continue
            blob = await self._store.get_range(key, 0, WHOLE)
            try:
                existing = await framed.decode_async(blob, self.key, start)
            except IntegrityError as error:
                raise CommitConflictError(f"{self.key}: chunk at position {start} holds other bytes") from error
            if not existing or len(existing) > len(piece) or piece[: len(existing)] != existing:
                raise CommitConflictError(
                    f"{self.key}: chunk at position {start} already holds other bytes; nothing was overwritten"
                )
            self._remember(Chunk(start, len(existing), len(blob)))
            done += len(existing)

    async def _truncate(self, size: int) -> None:
        self._known_run = None
        self._decoded = None
        objects = await self._store.list_files(self.key)
        chunks = chunks_in(objects)
        framed = any(info.name == DESCRIPTOR_NAME for info in objects)
        doomed = [chunk for chunk in reversed(chunks) if chunk.start >= size]
        # Highest first, so a truncation cut short leaves a contiguous run, never a gap.
        await self._store.delete([self._chunk_key(chunk.start) for chunk in doomed])
        if framed:
            run = await self._framed_run([chunk for chunk in chunks if chunk.start < size])
            for chunk in (c for c in run if c.start < size < c.end):
                head = (await self._frame(chunk))[: size - chunk.start]
                self._decoded = None
                frame = await (await self._learn_format()).encode_async(head, self.key, chunk.start)
                await self._store.put(self._chunk_key(chunk.start), frame, file_type=self.file_type)
            return
        run = contiguous_run(chunks)
        straddling = [chunk for chunk in run if chunk.start < size < chunk.end]
        for chunk in straddling:
            head = await self._store.get_range(self._chunk_key(chunk.start), 0, size - chunk.start)
            await self._store.put(self._chunk_key(chunk.start), head, file_type=self.file_type)

    async def rewrap(self, keyring: Keyring, key_id: str | None = None) -> str | None:
        """Wrap this segment's data key under ``key_id`` (the active key by default), replacing only its
        ``.codec`` object; returns the key id it is wrapped under now, None for an unencrypted segment."""
        rewrapped = await rewrap_descriptor(self._store, self.key, keyring, key_id)
        if rewrapped is None or rewrapped.wrapped_key is None:
            return None
        self._format = rewrapped
        return rewrapped.wrapped_key.key_id

    async def stored_key_id(self) -> str | None:
        descriptor = await read_descriptor(self._store, self.key)
        return descriptor_key_id(descriptor) if descriptor is not None else None


async def check_written(store: ObjectStore, key: str, stored: bytes | bytearray, where: str) -> None:
    """Read a chunk back after writing it where storage does not refuse a second create: bytes other than
    ours mean another writer replaced it, a conflict as a refused create would have been."""
    readback = await store.get_range(key, 0, len(stored) + 1)
    if readback != stored:
        raise CommitConflictError(
            f"{where} holds other bytes after our write: another writer replaced it (this storage does not "
            "refuse to overwrite)"
        )


async def read_descriptor(store: ObjectStore, segment_key: str) -> bytes | None:
    """A framed segment's ``.codec`` object; None when the segment has none."""
    try:
        return await store.get_range(f"{segment_key}/{DESCRIPTOR_NAME}", 0, WHOLE)
    except SegmentNotFoundError:
        return None


async def rewrap_descriptor(
    store: ObjectStore, segment_key: str, keyring: Keyring, key_id: str | None
) -> SegmentFormat | None:
    """The segment's format with its data key wrapped under ``key_id`` (the active key by default), its
    ``.codec`` replaced when that changed it; None for a segment without a descriptor."""
    descriptor = await read_descriptor(store, segment_key)
    if descriptor is None:
        return None
    # In a thread: a KMS key wraps and unwraps through a request.
    current = await asyncio.to_thread(parse_descriptor, descriptor, keyring, segment_key)
    target = key_id or keyring.active
    if current.wrapped_key is None or current.wrapped_key.key_id == target:
        return current
    rewrapped = await asyncio.to_thread(current.rewrapped, keyring, target, segment_key)
    await store.put(f"{segment_key}/{DESCRIPTOR_NAME}", rewrapped.descriptor())
    return rewrapped
