"""The generic provider for any fsspec URL (``s3a://`` through s3fs, ``gs://``, ``abfs://``, ``local://`` ...).

Segments follow the same chunk scheme as the S3 provider (``tieredstore.providers.chunks``). An
asynchronous filesystem (s3fs, gcsfs, adlfs) is driven through fsspec's async API in the running
event loop; a synchronous one (local, memory, sftp) through ``asyncio.to_thread``.

How conditional the chunk create is depends on the filesystem:

- an async filesystem whose ``_pipe_file`` takes ``mode="create"`` (s3fs sends ``If-None-Match: *``)
  is truly conditional;
- a synchronous filesystem is opened with mode ``"xb"`` (``O_EXCL`` on the local filesystem, a
  checked insert in fsspec's memory filesystem), which is conditional where the filesystem honours it;
- anything else falls back to compare-before-write (exists, then write), which two racing writers
  can both pass; each chunk is then read back after it is written (``conditional_create`` False), so
  a writer that lost the race sees a conflict. Such filesystems are only safe with a single writer per queue.

A store that claims a conditional create is probed once before a process writes
(``ChunkedProvider.check_conditional_writes``): s3fs against an endpoint that ignores ``If-None-Match``
is refused, as the S3 provider is. The ``[s3]`` settings (conditional_writes, storage classes) reach the
``s3://`` provider only; an endpoint without conditional writes is archived to through it.

On the local filesystem a chunk is written in place, so a crash can leave a short chunk; the next
commit sees it as a prefix of its own bytes and writes the rest into a new chunk.

A URL that names a server (``ftp://HOST:PORT/PATH``) gives the filesystem its host and port, as
``fsspec.open`` does, and the root is the path on that server.

Storage options (credentials included) are passed to the filesystem and never shown in ``repr``,
``url`` or error messages. Errors are translated to the tieredstore.errors tree; retries are the
filesystem's own (s3fs retries throttling and 5xx itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import fsspec
from fsspec.core import split_protocol

from tieredstore.errors import (
    ConfigError,
    MissingExtraError,
    SegmentNotFoundError,
    StorageAccessError,
    StorageError,
    StorageUnavailableError,
)
from tieredstore.formats.naming import FileType
from tieredstore.providers.base import StoredObject
from tieredstore.providers.chunked_provider import ChunkedProvider
from tieredstore.providers.chunks import ObjectInfo, ObjectStore, epoch_ms

T = TypeVar("T")


@contextlib.contextmanager
def translate_fsspec_errors(what: str) -> Iterator[None]:
    """Map the built-in exceptions fsspec filesystems raise to the typed tree, cause chained."""
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError as error:
        raise SegmentNotFoundError(f"{what}: not found") from error
    except PermissionError as error:
        raise StorageAccessError(f"{what}: permission denied") from error
    except OSError as error:
        reason = f"errno {error.errno}" if error.errno is not None else type(error).__name__
        if error.strerror:
            reason = f"{reason} ({error.strerror})"
        raise StorageUnavailableError(f"{what}: {reason}") from error


def _is_precondition_failure(error: BaseException) -> bool:
    """Whether an error from a conditional create means "it exists" (s3fs reports 412 two ways)."""
    if isinstance(error, FileExistsError):
        return True
    if isinstance(error, OSError) and error.errno == errno.EINVAL:
        response = getattr(error.__cause__, "response", None)
        return isinstance(response, dict) and response.get("Error", {}).get("Code") == "PreconditionFailed"
    return False


# Where filesystems put an entry's last write: s3fs, fsspec's local filesystem, adlfs, gcsfs, memory.
_MODIFIED_FIELDS = ("LastModified", "mtime", "last_modified", "updated", "created")


def _modified_ms(info: dict[str, Any], what: str) -> int:
    for name in _MODIFIED_FIELDS:
        value = info.get(name)
        if value is not None:
            return epoch_ms(value)
    raise StorageError(f"{what}: the filesystem does not report when {info.get('name')!r} was last written")


def _base_name(entry_name: str) -> str:
    return entry_name.rstrip("/").rsplit("/", 1)[-1]


class FsspecObjectStore(ObjectStore):
    """The chunk scheme's object operations on one fsspec filesystem and root path."""

    def __init__(self, protocol: str, root: str, storage_options: dict[str, Any]) -> None:
        try:
            self._filesystem_class = fsspec.get_filesystem_class(protocol)
        except ImportError as error:
            extra = "pip install 'tieredstore[s3]'" if protocol in ("s3", "s3a", "s3n") else str(error)
            raise MissingExtraError(f"the {protocol}:// filesystem is not installed: {extra}") from error
        except ValueError as error:
            raise ConfigError(f"no fsspec filesystem is known for {protocol}://") from error
        url = f"{protocol}://{root}".rstrip("/")
        server = self._filesystem_class._get_kwargs_from_urls(url)
        if server:
            # The URL names a server (ftp://HOST:PORT/PATH): the filesystem connects to it, and the root is
            # the path on it. Options given explicitly win over the URL's.
            storage_options = {**server, **storage_options}
            root = self._filesystem_class._strip_protocol(url)
        self.protocol = protocol
        self.root = root.rstrip("/")
        # What the store is called in messages: the URL naming the server, or the root as the filesystem takes it.
        self.url = url if server else f"{protocol}://{self.root}"
        self.is_async = bool(getattr(self._filesystem_class, "async_impl", False))
        self._storage_options = storage_options
        self._filesystem: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.conditional_create = (
            not self.is_async or "mode" in inspect.signature(self._filesystem_class._pipe_file).parameters
        )

    @contextlib.contextmanager
    def _options_checked(self) -> Iterator[None]:
        """A filesystem that cannot be built from the URL and options (one it needs is missing) is a ConfigError."""
        try:
            yield
        except TypeError as error:
            name = self._filesystem_class.__name__
            raise ConfigError(f"cannot open {self.protocol}:// storage with fsspec's {name}: {error}") from error

    def _path(self, key: str) -> str:
        if not key:
            return self.root
        return f"{self.root}/{key}" if self.root else key

    async def _fs(self) -> Any:
        """The filesystem instance; an async one is created in (and bound to) the running loop."""
        if not self.is_async:
            if self._filesystem is None:
                with translate_fsspec_errors(f"connect {self.url}"), self._options_checked():
                    self._filesystem = await asyncio.to_thread(
                        self._filesystem_class,
                        skip_instance_cache=True,
                        use_listings_cache=False,
                        **self._storage_options,
                    )
            return self._filesystem
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                raise RuntimeError("an fsspec provider is bound to the event loop it was first used in")
            self._filesystem, self._loop = None, loop
        if self._filesystem is None:
            with translate_fsspec_errors(f"connect {self.url}"), self._options_checked():
                filesystem = self._filesystem_class(
                    asynchronous=True, skip_instance_cache=True, use_listings_cache=False, **self._storage_options
                )
                set_session = getattr(filesystem, "set_session", None)
                if set_session is not None:
                    await set_session()
            self._filesystem = filesystem
        return self._filesystem

    async def _run(self, what: str, call_async: Callable[[Any], Any], call_sync: Callable[[Any], T]) -> T:
        """One filesystem call, async or in a thread, with its errors translated."""
        filesystem = await self._fs()
        with translate_fsspec_errors(what):
            if self.is_async:
                result: T = await call_async(filesystem)
                return result
            return await asyncio.to_thread(call_sync, filesystem)

    async def _entries(self, folder: str) -> list[dict[str, Any]]:
        path = self._path(folder)

        async def list_async(fs: Any) -> list[dict[str, Any]]:
            fs.invalidate_cache(path)
            try:
                return list(await fs._ls(path, detail=True))
            except FileNotFoundError:
                return []

        def list_sync(fs: Any) -> list[dict[str, Any]]:
            fs.invalidate_cache(path)
            try:
                return list(fs.ls(path, detail=True))
            except FileNotFoundError:
                return []

        return await self._run(f"list {self.protocol}://{path}", list_async, list_sync)

    async def list_files(self, folder: str) -> list[ObjectInfo]:
        return [
            ObjectInfo(_base_name(entry["name"]), int(entry.get("size") or 0))
            for entry in await self._entries(folder)
            if entry.get("type") == "file"
        ]

    async def list_tree(self, folder: str) -> list[StoredObject]:
        path = self._path(folder)
        what = f"list {self.protocol}://{path}"

        async def find_async(fs: Any) -> dict[str, dict[str, Any]]:
            fs.invalidate_cache(path)
            try:
                return dict(await fs._find(path, detail=True))
            except FileNotFoundError:
                return {}

        def find_sync(fs: Any) -> dict[str, dict[str, Any]]:
            fs.invalidate_cache(path)
            try:
                return dict(fs.find(path, detail=True))
            except FileNotFoundError:
                return {}

        found = await self._run(what, find_async, find_sync)
        strip = len(self.root) + 1 if self.root else 0
        return [
            StoredObject(name.rstrip("/")[strip:], int(info.get("size") or 0), _modified_ms(info, what))
            for name, info in found.items()
            if info.get("type") == "file"
        ]

    async def list_folders(self, folder: str) -> list[str]:
        return [_base_name(entry["name"]) for entry in await self._entries(folder) if entry.get("type") == "directory"]

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        path = self._path(key)
        end = start + length

        async def get_async(fs: Any) -> bytes:
            return bytes(await fs._cat_file(path, start=start, end=end))

        def get_sync(fs: Any) -> bytes:
            return bytes(fs.cat_file(path, start=start, end=end))

        return await self._run(f"read {self.protocol}://{path}", get_async, get_sync)

    async def put_if_absent(self, key: str, data: bytes | bytearray, *, file_type: FileType | None = None) -> bool:
        path = self._path(key)

        async def put_async(fs: Any) -> bool:
            try:
                if self.conditional_create:
                    await fs._pipe_file(path, data, mode="create")
                else:
                    if await fs._exists(path):
                        return False
                    await fs._pipe_file(path, data)
            except OSError as error:
                if _is_precondition_failure(error):
                    return False
                raise
            return True

        def put_sync(fs: Any) -> bool:
            def create() -> None:
                with fs.open(path, "xb") as file:
                    file.write(data)

            try:
                self._with_parent(fs, path, create)
            except FileExistsError:
                return False
            except ValueError:
                # This filesystem has no exclusive-create mode: compare-before-write (see module docstring).
                if fs.exists(path):
                    return False
                self._with_parent(fs, path, lambda: fs.pipe_file(path, data))
            return True

        return await self._run(f"create {self.protocol}://{path}", put_async, put_sync)

    @staticmethod
    def _with_parent(fs: Any, path: str, write: Callable[[], None]) -> None:
        """Run ``write``; where the filesystem has real directories, create the parent first if needed."""
        try:
            write()
        except FileNotFoundError:
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            write()

    async def put(self, key: str, data: bytes | bytearray, *, file_type: FileType | None = None) -> None:
        path = self._path(key)

        async def put_async(fs: Any) -> None:
            await fs._pipe_file(path, data)

        def put_sync(fs: Any) -> None:
            self._with_parent(fs, path, lambda: fs.pipe_file(path, data))

        await self._run(f"write {self.protocol}://{path}", put_async, put_sync)

    async def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            path = self._path(key)

            async def delete_async(fs: Any, path: str = path) -> None:
                with contextlib.suppress(FileNotFoundError):
                    await fs._rm_file(path)

            def delete_sync(fs: Any, path: str = path) -> None:
                with contextlib.suppress(FileNotFoundError):
                    fs.rm_file(path)

            await self._run(f"delete {self.protocol}://{path}", delete_async, delete_sync)
        if not self.is_async and keys:
            await self._remove_empty_folder(keys[-1].rsplit("/", 1)[0])

    async def _remove_empty_folder(self, folder: str) -> None:
        """Synchronous filesystems keep directories; drop a segment's once it is empty, so it is not listed."""
        path = self._path(folder)

        def remove(fs: Any) -> None:
            with contextlib.suppress(OSError):
                if not fs.ls(path, detail=False):
                    fs.rmdir(path)

        await self._run(f"remove {self.protocol}://{path}", remove, remove)

    async def close(self) -> None:
        filesystem, loop = self._filesystem, self._loop
        self._filesystem = None
        # s3fs's public close is for its synchronous mode; in async mode its client context is closed directly.
        creator = getattr(filesystem, "_s3creator", None)
        if self.is_async and creator is not None and loop is asyncio.get_running_loop():
            await creator.__aexit__(None, None, None)


class FsspecProvider(ChunkedProvider):
    """Segments as chunk objects under any fsspec URL; ``storage_options`` go to the filesystem."""

    scheme: ClassVar[str] = "fsspec"

    def __init__(self, url: str, **storage_options: Any) -> None:
        protocol, path = split_protocol(url)
        if protocol is None:
            raise ConfigError(f"{url!r} has no scheme; the fsspec provider needs a URL such as s3a://bucket/prefix")
        if "@" in url.split("://", 1)[1].split("/", 1)[0]:
            raise ConfigError("credentials must not be given in the URL; pass them as storage options")
        self._store = FsspecObjectStore(protocol, path, dict(storage_options))
        super().__init__(self._store.url)

    @property
    def store(self) -> FsspecObjectStore:
        return self._store

    def __repr__(self) -> str:
        return f"FsspecProvider({self.url!r})"
