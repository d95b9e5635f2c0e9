"""The POSIX provider (``file://`` URL or a plain path): one file per segment under a root directory.

Every logical path is confined under the root: paths with ``..``, empty segments, NUL or an
absolute start are refused, and a symlink that would lead outside the root is refused when the
file is touched (PathEscapeError). Commits write at the commit position with ``os.pwrite`` under an
exclusive ``flock`` and are ``fsync``ed before they count; directories are ``fsync``ed after a file
is created or removed in them. Bytes already at the commit position are compared, never
overwritten, so a retried or a zombie write cannot change committed bytes. Blocking calls run in
``asyncio.to_thread``. A write whose caller gave up on it (a hung file system) runs on in its thread;
until it returns, no other write to that file starts in this process, and a write given up on before its
thread started writes nothing once it does: a late write can only land before the retry, never after.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import ClassVar, TypeVar
from urllib.parse import unquote, urlsplit

from tieredstore.errors import (
    CommitConflictError,
    ConfigError,
    PathEscapeError,
    StorageUnavailableError,
)
from tieredstore.formats.naming import FileType, parse_segment_name
from tieredstore.providers.base import FileSegment, Provider, SegmentId, StoredObject
from tieredstore.providers.chunks import ChunkedSegment
from tieredstore.providers.codec import Keyring
from tieredstore.providers.local_objects import LocalObjectStore
from tieredstore.providers.paths import check_logical_path
from tieredstore.providers.posix_files import (
    fsync_directory,
    make_directories,
    pread_exactly,
    pwrite_all,
    translate_os_errors,
)

T = TypeVar("T")


class PosixSegment(FileSegment):
    """A segment stored as one regular file ``<root>/<path>/<TYPE>/<name>``, or, framed
    (``providers.codec``), as a folder of that name holding chunk files (``providers.local_objects``).

    Which one is learned from the file system once per handle; a new segment is framed when the
    provider's codec policy says so.
    """

    def __init__(self, provider: PosixProvider, segment_id: SegmentId, **kwargs: int | None) -> None:
        super().__init__(segment_id, **kwargs)  # type: ignore[arg-type]
        self._provider = provider
        self._chunked: ChunkedSegment | None = None
        self._plain = False  # a plain file was found: the segment is not framed

    async def _framed(self, *, writing_at: int | None = None) -> ChunkedSegment | None:
        """The folder of chunks this segment is, or None for a plain file (or nothing, when not writing
        a new segment that the codec policy frames)."""
        if self._chunked is not None or self._plain:
            return self._chunked
        kind = await self._run("stat", _file_kind)
        if kind == "file":
            self._plain = True
            return None
        if kind is None and (writing_at != 0 or self._provider.codecs.for_segment(self.segment_id) is None):
            return None
        self._chunked = ChunkedSegment(
            self._provider.objects,
            self.segment_id,
            codecs=self._provider.codecs,
            commit_position=self.commit_position,
            max_size=self.max_size,
        )
        return self._chunked

    async def _run(self, action: str, function: Callable[[str], T]) -> T:
        def call() -> T:
            with translate_os_errors(f"{action} {self.key}"):
                return function(self._provider.resolve(self.key))

        return await asyncio.to_thread(call)

    async def _real_size(self) -> int:
        if (chunked := await self._framed()) is not None:
            return await chunked._real_size()

        def size(file: str) -> int:
            try:
                return os.stat(file).st_size
            except (FileNotFoundError, NotADirectoryError):
                return 0

        return await self._run("size of", size)

    async def _exists(self) -> bool:
        return await self._run("exists", os.path.exists)

    async def _create(self) -> None:
        if (chunked := await self._framed(writing_at=0)) is not None:
            await chunked._create()
            return

        def create(file: str) -> None:
            if os.path.isfile(file):
                return
            make_directories(os.path.dirname(file))
            # O_EXCL makes creation atomic and never clobbers a file another writer made first;
            # an empty file has no partial content a temp-and-rename would protect against.
            try:
                fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_directory(os.path.dirname(file))

        await self._run("create", create)

    async def _destroy(self) -> None:
        if (chunked := await self._framed()) is not None:
            await chunked._destroy()
            await self._provider.objects.remove_folder(self.key)
            self._chunked = None
            return

        def destroy(file: str) -> None:
            try:
                os.unlink(file)
            except FileNotFoundError:
                return
            fsync_directory(os.path.dirname(file))

        await self._run("destroy", destroy)

    async def _read(self, position: int, length: int) -> bytes:
        if (chunked := await self._framed()) is not None:
            return await chunked._read(position, length)

        def read(file: str) -> bytes:
            fd = os.open(file, os.O_RDONLY)
            try:
                return pread_exactly(fd, length, position)
            finally:
                os.close(fd)

        return await self._run("read", read)

    async def _read_from(self, position: int, length: int) -> bytes:
        if (chunked := await self._framed()) is not None:
            return await chunked._read_from(position, length)
        return await self._read(position, length)

    async def rewrap(self, keyring: Keyring, key_id: str | None = None) -> str | None:
        chunked = await self._framed()
        return await chunked.rewrap(keyring, key_id) if chunked is not None else None

    async def stored_key_id(self) -> str | None:
        chunked = await self._framed()
        return await chunked.stored_key_id() if chunked is not None else None

    async def _commit(self, position: int, data: bytes | bytearray) -> None:
        if (chunked := await self._framed(writing_at=position)) is not None:
            await chunked._commit(position, data)
            return
        number = self._provider.ask_to_write(self.key)

        def commit(file: str) -> None:
            with self._provider.writing(self.key, number) as newest:
                if newest:
                    write(file)

        def write(file: str) -> None:
            created = not os.path.exists(file)
            if created:
                make_directories(os.path.dirname(file))
            fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                # One writer at a time across processes, so compare-then-write is not racy.
                fcntl.flock(fd, fcntl.LOCK_EX)
                size = os.fstat(fd).st_size
                if size < position:
                    raise CommitConflictError(
                        f"{self.key}: holds {size} bytes, fewer than the commit position {position}"
                    )
                overlap = pread_exactly(fd, min(len(data), size - position), position)
                if overlap != data[: len(overlap)]:
                    raise CommitConflictError(f"{self.key}: other bytes are already committed at position {position}")
                if len(overlap) < len(data):
                    # A view, not a slice: slicing would copy the whole commit (4 MiB) with the GIL held.
                    with memoryview(data) as rest:
                        pwrite_all(fd, rest[len(overlap) :], position + len(overlap))
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                fsync_directory(os.path.dirname(file))

        await self._run("commit to", commit)
        # Storage now holds a plain file here: later calls need not look again.
        self._plain = True

    async def _truncate(self, size: int) -> None:
        if (chunked := await self._framed()) is not None:
            await chunked._truncate(size)
            return
        number = self._provider.ask_to_write(self.key)

        def truncate(file: str) -> None:
            with self._provider.writing(self.key, number) as newest:
                if newest:
                    cut(file)

        def cut(file: str) -> None:
            try:
                current = os.stat(file).st_size
            except FileNotFoundError:
                return
            if size >= current:
                return
            os.truncate(file, size)
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        await self._run("truncate", truncate)


def _file_kind(file: str) -> str | None:
    try:
        mode = os.stat(file).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return "folder" if stat.S_ISDIR(mode) else "file"


def root_from_url(url: str) -> str:
    """The absolute root directory named by ``file:///dir``, ``file://localhost/dir`` or a plain path."""
    if "://" not in url:
        path = url
    else:
        parts = urlsplit(url)
        if parts.scheme != "file":
            raise ConfigError(f"the POSIX provider takes file:// URLs or plain paths, not {parts.scheme}://")
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"file:// URL names host {parts.netloc!r}; only local paths are supported")
        if parts.query or parts.fragment:
            raise ConfigError("file:// URLs take no query or fragment")
        path = unquote(parts.path)
    if not path or "\x00" in path:
        raise ConfigError("the POSIX provider needs a root directory")
    return os.path.abspath(os.path.expanduser(path))


class PosixProvider(Provider):
    """All segments under one local root directory."""

    scheme: ClassVar[str] = "file"

    def __init__(self, url: str) -> None:
        self.root = root_from_url(url)
        super().__init__(f"file://{self.root}")
        # Writes (commits, truncations) asked for per file, and the worker threads running them: a write
        # whose caller gave up on it (``providers.watchdog``) keeps its thread until the file system answers.
        self._writes_asked: Counter[str] = Counter()
        self._writes_running: Counter[str] = Counter()
        self._writes_lock = threading.Lock()
        self.objects = LocalObjectStore(self.resolve)

    def ask_to_write(self, key: str) -> int:
        """Number a new write to ``key``; StorageUnavailableError while an earlier one's thread still runs, so
        that a hung file costs one thread and no write starts beside one that may still land."""
        with self._writes_lock:
            if self._writes_running[key]:
                raise StorageUnavailableError(f"write to {key}: an earlier write to it has not returned yet")
            self._writes_asked[key] += 1
            return self._writes_asked[key]

    @contextlib.contextmanager
    def writing(self, key: str, number: int) -> Iterator[bool]:
        """In the worker thread, around write ``number``: whether it is still the newest write asked for.

        One that is not was given up on before its thread started; a later write or truncation owns the
        file now, so it must write nothing.
        """
        with self._writes_lock:
            self._writes_running[key] += 1
            newest = self._writes_asked[key] == number
        try:
            yield newest
        finally:
            with self._writes_lock:
                self._writes_running[key] -= 1
                if not self._writes_running[key]:
                    del self._writes_running[key]

    def resolve(self, key: str) -> str:
        """The absolute file for a (checked) logical key; PathEscapeError if symlinks lead outside the root."""
        check_logical_path(key)
        candidate = os.path.join(self.root, *key.split("/"))
        real_root = os.path.realpath(self.root)
        real = os.path.realpath(candidate)
        if os.path.commonpath([real_root, real]) != real_root or real == real_root:
            raise PathEscapeError(f"logical path {key!r} resolves outside the provider root")
        return candidate

    def segment(
        self,
        file_type: FileType,
        path: str,
        base_offset: int,
        *,
        commit_position: int = 0,
        max_size: int | None = None,
    ) -> PosixSegment:
        return PosixSegment(
            self,
            SegmentId(file_type, check_logical_path(path), base_offset),
            commit_position=commit_position,
            max_size=max_size,
        )

    async def _scan(self, path: str, *, directories: bool) -> list[str]:
        def scan() -> list[str]:
            folder = self.resolve(path) if path else self.root
            try:
                with os.scandir(folder) as entries:
                    # A segment is a file, or a folder when framed: both are listed as segments.
                    return [entry.name for entry in entries if entry.is_dir() or (not directories and entry.is_file())]
            except (FileNotFoundError, NotADirectoryError):
                return []

        def guarded() -> list[str]:
            with translate_os_errors(f"list {path!r}"):
                return scan()

        return await asyncio.to_thread(guarded)

    async def list_segments(self, path: str, file_type: FileType) -> list[int]:
        check_logical_path(path)
        names = await self._scan(f"{path}/{file_type.value}", directories=False)
        offsets = []
        for name in names:
            with contextlib.suppress(ValueError):
                offsets.append(parse_segment_name(name))
        return sorted(offsets)

    async def list_children(self, path: str) -> list[str]:
        check_logical_path(path, allow_root=True)
        return sorted(await self._scan(path, directories=True))

    async def list_objects(self, path: str) -> list[StoredObject]:
        check_logical_path(path, allow_root=True)

        def walk() -> list[StoredObject]:
            top = self.resolve(path) if path else self.root
            found: list[StoredObject] = []
            if os.path.isfile(top):
                info = os.stat(top)
                return [StoredObject(path, info.st_size, info.st_mtime_ns // 1_000_000)]
            # Symlinks are neither followed nor listed: nothing this provider writes is one.
            for folder, _folders, names in os.walk(top):
                relative = os.path.relpath(folder, self.root).replace(os.sep, "/")
                for name in names:
                    info = os.stat(os.path.join(folder, name), follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        key = name if relative == "." else f"{relative}/{name}"
                        found.append(StoredObject(key, info.st_size, info.st_mtime_ns // 1_000_000))
            return sorted(found, key=lambda stored: stored.key)

        def guarded() -> list[StoredObject]:
            with translate_os_errors(f"list {path!r}"):
                return walk()

        return await asyncio.to_thread(guarded)
