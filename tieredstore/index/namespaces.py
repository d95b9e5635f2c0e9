"""Key-index namespaces: archivers that share queues by lease each write a key index of their own.

A single archiver writes the broker's index: files under ``<index path>/INDEX/``, catalogue rows
``<index path>/<file id>``, local files in ``<data dir>/index``. Archivers that split the queues by
lease cannot share that index, because each keeps the file being filled open in its own process and
numbers files by the clock. So each claims a *namespace* ``<node>-<slot>``:

- ``node`` is a random id made once per data directory (``<data dir>/index/node-id``), so archivers
  on two machines (two data directories, one database) never pick the same name;
- ``slot`` is the lowest number whose lock file ``<data dir>/index/<node>-<slot>/lock`` the process
  can ``flock``. The lock goes with the process, also when it is killed, so a restarted archiver
  takes its slot back and recovers the files there exactly as the single archiver does.

A namespace's files go to ``<index path>/<namespace>/INDEX/`` and its catalogue rows are
``<index path>/<namespace>/<file id>``. ``KeyIndex`` answers queries from every namespace the
catalogue knows, and applies retention to all of them. A namespace whose archiver has stopped and
whose slot nobody claimed again (after a scale-in) is *swept* by any archiver of the same data
directory that can take its lock: the file being filled is sealed and everything is uploaded, so no
key waits on a local disk for an archiver that is not coming back.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import os
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from tieredstore.errors import IntegrityError
from tieredstore.index.service import ConfirmKeys, IndexHit, IndexService

log = structlog.get_logger(__name__)

NODE_ID_FILE = "node-id"
LOCK_FILE = "lock"
_NODE_ID = re.compile(r"[0-9a-f]{12}")
_NAMESPACE = re.compile(r"([0-9a-f]{12})-([1-9][0-9]*)")

OpenNamespace = Callable[[str, bool], IndexService]
"""``open(namespace, read_only)``: an index service over one namespace, not started yet."""


def node_id(base: Path) -> str:
    """This data directory's node id, made (once, whoever comes first) if it has none yet."""
    base.mkdir(parents=True, exist_ok=True)
    path = base / NODE_ID_FILE
    with contextlib.suppress(FileNotFoundError):
        return _read_node_id(path)
    # Written in full under a private name, then linked: a reader never sees half an id, and of two
    # processes making one at once the second link fails and that process takes the first one's id.
    candidate = base / f"{NODE_ID_FILE}.{os.getpid()}.{secrets.token_hex(4)}.new"
    try:
        with candidate.open("w", encoding="ascii") as handle:
            handle.write(secrets.token_hex(6) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(candidate, path)
    finally:
        candidate.unlink(missing_ok=True)
    return _read_node_id(path)


def _read_node_id(path: Path) -> str:
    text = path.read_text(encoding="ascii").strip()
    if not _NODE_ID.fullmatch(text):
        raise IntegrityError(f"{path} holds {text[:40]!r}, not a key-index node id (12 hex digits); remove it")
    return text


def _try_lock(directory: Path) -> int | None:
    """An open descriptor holding ``directory``'s lock, or None when another process (or descriptor) holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


@dataclass
class NamespaceClaim:
    """A namespace this process writes, held by an ``flock`` until ``release`` (or the process ends)."""

    name: str
    directory: Path
    _descriptor: int | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


def claim_namespace(base: Path) -> NamespaceClaim:
    """Claim the lowest free slot of this data directory's node (see the module docstring)."""
    node = node_id(base)
    for slot in itertools.count(1):
        name = f"{node}-{slot}"
        directory = base / name
        descriptor = _try_lock(directory)
        if descriptor is not None:
            return NamespaceClaim(name, directory, descriptor)
    raise AssertionError("unreachable")  # pragma: no cover - itertools.count never ends


class KeyIndex:
    """The broker's key index over all its namespaces: this process's own one, and every other read-only.

    ``own`` is the service this process writes (or, for a reader, the broker's root namespace opened
    read-only). ``namespaces`` lists the namespaces the catalogue knows besides the root one.
    """

    def __init__(
        self,
        own: IndexService,
        open_namespace: OpenNamespace,
        namespaces: Callable[[], Iterable[str]],
        *,
        base_directory: Path,
        claim: NamespaceClaim | None = None,
    ) -> None:
        self.own = own
        self._open = open_namespace
        self._namespaces = namespaces
        self.base_directory = base_directory
        self.claim = claim
        self._readers: dict[str, IndexService] = {}

    async def _others(self) -> list[IndexService]:
        """A started read-only service for every namespace but our own, the root one first."""
        names = {"", *await asyncio.to_thread(self._namespaces)}
        names.discard(self.own.namespace)
        services = []
        for name in sorted(names):
            reader = self._readers.get(name)
            if reader is None:
                reader = self._open(name, True)
                await reader.start()
                self._readers[name] = reader
            services.append(reader)
        return services

    async def query(
        self,
        topic: str,
        topic_id: int,
        key: str,
        max_count: int,
        begin_timestamp: int,
        end_timestamp: int,
        confirm: ConfirmKeys,
    ) -> list[IndexHit]:
        """``IndexService.query`` over every namespace; with hits from several, the newest ``max_count``."""
        found: list[list[IndexHit]] = []
        for service in [self.own, *await self._others()]:
            hits = await service.query(topic, topic_id, key, max_count, begin_timestamp, end_timestamp, confirm)
            if hits:
                found.append(hits)
        if len(found) <= 1:
            return found[0] if found else []
        # A message can be indexed twice (an archiver that took a queue over re-indexes what its
        # predecessor committed but did not record): one hit per message.
        merged: list[IndexHit] = []
        seen: set[tuple[int, int, int]] = set()
        for hit in sorted(itertools.chain.from_iterable(found), key=lambda h: h.timestamp, reverse=True):
            where = (hit.topic_id, hit.queue_id, hit.queue_offset)
            if where not in seen:
                seen.add(where)
                merged.append(hit)
        return merged[:max_count]

    async def expired_files(self, before_timestamp: int) -> list[int]:
        """The ids ``delete_expired`` would remove now (for a dry run)."""
        expired = await self.own.expired_files(before_timestamp)
        for reader in await self._others():
            expired += await reader.expired_files(before_timestamp, uploaded_only=True)
        return expired

    async def delete_expired(self, before_timestamp: int, *, every_namespace: bool = True) -> list[int]:
        """Our own expired files, and the expired uploaded files of every other namespace; returns their ids.

        Archivers sharing queues by lease each run retention, and each file must go once: one of them
        deletes as above, every other one (``every_namespace=False``) only its own files that are not
        uploaded yet, which no other process can reach.
        """
        if not every_namespace:
            return await self.own.delete_expired(before_timestamp, local_only=True)
        removed = await self.own.delete_expired(before_timestamp)
        for reader in await self._others():
            removed += await reader.delete_expired(before_timestamp, uploaded_only=True)
        return removed

    async def maintain(self) -> list[int]:
        """Seal and upload our own files; then sweep namespaces of this data directory nobody holds."""
        uploaded = await self.own.maintain()
        if self.claim is not None:
            await self.sweep()
        return uploaded

    async def sweep(self) -> list[str]:
        """Seal and upload every local file of a namespace whose archiver is gone; returns the namespaces swept."""
        swept = []
        for directory in sorted(self.base_directory.iterdir()):
            if not _NAMESPACE.fullmatch(directory.name) or directory.name == self.own.namespace:
                continue
            if not any(directory.glob("*.index")) and not any(directory.glob("*.compacted")):
                continue  # nothing local: everything of it is in cold storage already
            descriptor = await asyncio.to_thread(_try_lock, directory)
            if descriptor is None:
                continue  # its archiver is running
            try:
                service = self._open(directory.name, False)
                await service.start()
                try:
                    await service.seal_current()
                    uploaded = await service.maintain()
                finally:
                    await service.close()
            finally:
                os.close(descriptor)
            log.info("swept a key-index namespace its archiver left", namespace=directory.name, uploaded=len(uploaded))
            swept.append(directory.name)
        return swept

    async def close(self) -> None:
        """Close the read-only services; the own service and the claim are closed by whoever opened them."""
        for reader in self._readers.values():
            await reader.close()
        self._readers.clear()
