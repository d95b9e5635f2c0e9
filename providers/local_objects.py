"""Objects in a local directory: how the POSIX provider stores a framed segment as a folder of chunk files.

A chunk is written whole to a temporary file, synced, and then hard-linked to its name: ``link`` fails
when the name exists, so the create is atomic and conditional as S3's ``If-None-Match: *`` is, and a crash
leaves either the whole chunk or none of it. Temporary files start with ``.tmp-`` (never a chunk's or the
descriptor's name) and are removed with their segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from tieredstore.errors import SegmentNotFoundError
from tieredstore.formats.naming import FileType
from tieredstore.providers.base import StoredObject
from tieredstore.providers.chunks import ObjectInfo, ObjectStore
from tieredstore.providers.posix_files import (
    fsync_directory,
    make_directories,
    pread_exactly,
    pwrite_all,
    translate_os_errors,
)

T = TypeVar("T")
TEMPORARY_PREFIX = ".tmp-"


class LocalObjectStore(ObjectStore):
    """Objects as files under the directories ``resolve`` gives for keys (it confines them to a root)."""

    def __init__(self, resolve: Callable[[str], str]) -> None:
        self._resolve = resolve

    async def _run(self, what: str, key: str, function: Callable[[str], T]) -> T:
        def call() -> T:
            with translate_os_errors(f"{what} {key}"):
                return function(self._resolve(key))

        return await asyncio.to_thread(call)

    async def list_files(self, folder: str) -> list[ObjectInfo]:
        def scan(directory: str) -> list[ObjectInfo]:
            try:
                with os.scandir(directory) as entries:
                    return [
                        ObjectInfo(entry.name, entry.stat().st_size)
                        for entry in entries
                        if entry.is_file(follow_symlinks=False)
                    ]
            except (FileNotFoundError, NotADirectoryError):
                return []

        return await self._run("list", folder, scan)

    async def list_folders(self, folder: str) -> list[str]:
        def scan(directory: str) -> list[str]:
            try:
                with os.scandir(directory) as entries:
                    return [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
            except (FileNotFoundError, NotADirectoryError):
                return []

        return await self._run("list", folder, scan)

    async def list_tree(self, folder: str) -> list[StoredObject]:
        def walk(top: str) -> list[StoredObject]:
            found = []
            for directory, _folders, names in os.walk(top):
                relative = os.path.relpath(directory, top).replace(os.sep, "/")
                for name in names:
                    info = os.stat(os.path.join(directory, name), follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        inner = name if relative == "." else f"{relative}/{name}"
                        found.append(StoredObject(f"{folder}/{inner}", info.st_size, info.st_mtime_ns // 1_000_000))
            return found

        return await self._run("list", folder, walk)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        def read(file: str) -> bytes:
            try:
                fd = os.open(file, os.O_RDONLY)
            except (FileNotFoundError, NotADirectoryError) as error:
                raise SegmentNotFoundError(f"get {key}: no such object") from error
            try:
                available = max(0, min(length, os.fstat(fd).st_size - start))
                return pread_exactly(fd, available, start)
            finally:
                os.close(fd)

        return await self._run("get", key, read)

    async def put_if_absent(self, key: str, data: bytes | bytearray, *, file_type: FileType | None = None) -> bool:
        def create(file: str) -> bool:
            temporary = self._write_temporary(file, data)
            try:
                os.link(temporary, file)
            except FileExistsError:
                return False
            finally:
                os.unlink(temporary)
            fsync_directory(os.path.dirname(file))
            return True

        return await self._run("create", key, create)

    async def put(self, key: str, data: bytes | bytearray, *, file_type: FileType | None = None) -> None:
        def replace(file: str) -> None:
            os.replace(self._write_temporary(file, data), file)
            fsync_directory(os.path.dirname(file))

        await self._run("put", key, replace)

    @staticmethod
    def _write_temporary(file: str, data: bytes | bytearray) -> str:
        directory = os.path.dirname(file)
        make_directories(directory)
        temporary = os.path.join(directory, f"{TEMPORARY_PREFIX}{uuid.uuid4().hex}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            pwrite_all(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        return temporary

    async def delete(self, keys: Sequence[str]) -> None:
        def remove(file: str) -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(file)

        touched: set[str] = set()
        for key in keys:
            await self._run("delete", key, remove)
            touched.add(key.rpartition("/")[0])
        for folder in sorted(touched):
            await self._run("sync", folder, _sync_existing)

    async def remove_folder(self, folder: str) -> None:
        """Remove ``folder`` once it is empty (a destroyed segment); anything left in it keeps it."""

        def remove(directory: str) -> None:
            with contextlib.suppress(FileNotFoundError, OSError):
                os.rmdir(directory)
                fsync_directory(os.path.dirname(directory))

        await self._run("remove", folder, remove)


def _sync_existing(directory: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fsync_directory(directory)
