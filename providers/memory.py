"""The ``memory://NAME`` provider: segments in a process-wide dict, for tests and the embedded demo.

Two providers built from the same URL see the same bytes, so a test can "restart" by making a new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tieredstore.basics import now_ms
from tieredstore.errors import CommitConflictError
from tieredstore.formats.naming import FileType, parse_segment_name
from tieredstore.providers.base import FileSegment, Provider, SegmentId, StoredObject
from tieredstore.providers.paths import check_logical_path


class Volume(dict[str, bytearray]):
    """The bytes of each key, and (``modified``) the epoch ms of each key's last write."""

    def __init__(self) -> None:
        super().__init__()
        self.modified: dict[str, int] = {}


_VOLUMES: dict[str, Volume] = {}


class MemorySegment(FileSegment):
    """A segment whose bytes live in a bytearray of its provider's volume."""

    def __init__(self, volume: dict[str, bytearray], segment_id: SegmentId, **kwargs: int | None) -> None:
        super().__init__(segment_id, **kwargs)  # type: ignore[arg-type]
        self._volume = volume
        # A plain dict (a volume someone built by hand) keeps no write times: they are not asked of it.
        self._modified: dict[str, int] = volume.modified if isinstance(volume, Volume) else {}

    async def _real_size(self) -> int:
        data = self._volume.get(self.key)
        return 0 if data is None else len(data)

    async def _exists(self) -> bool:
        return self.key in self._volume

    async def _create(self) -> None:
        if self.key not in self._volume:
            self._volume[self.key] = bytearray()
            self._modified[self.key] = now_ms()

    async def _destroy(self) -> None:
        self._volume.pop(self.key, None)
        self._modified.pop(self.key, None)

    async def _read(self, position: int, length: int) -> bytes:
        return bytes(self._volume.get(self.key, b"")[position : position + length])

    async def _commit(self, position: int, data: bytes | bytearray) -> None:
        stored = self._volume.setdefault(self.key, bytearray())
        if len(stored) < position:
            raise CommitConflictError(
                f"{self.key}: holds {len(stored)} bytes, fewer than the commit position {position}"
            )
        overlap = bytes(stored[position : position + len(data)])
        if overlap != data[: len(overlap)]:
            raise CommitConflictError(f"{self.key}: other bytes are already committed at position {position}")
        if len(overlap) < len(data):
            stored.extend(data[len(overlap) :])
            self._modified[self.key] = now_ms()
        self._modified.setdefault(self.key, now_ms())

    async def _truncate(self, size: int) -> None:
        stored = self._volume.get(self.key)
        if stored is not None and size < len(stored):
            del stored[size:]
            self._modified[self.key] = now_ms()


class MemoryProvider(Provider):
    """All segments of one ``memory://NAME`` volume."""

    scheme: ClassVar[str] = "memory"

    def __init__(self, url: str = "memory://default") -> None:
        super().__init__(url)
        name = url.split("://", 1)[-1]
        self.volume = _VOLUMES.setdefault(name, Volume())

    def segment(
        self,
        file_type: FileType,
        path: str,
        base_offset: int,
        *,
        commit_position: int = 0,
        max_size: int | None = None,
    ) -> MemorySegment:
        return MemorySegment(
            self.volume,
            SegmentId(file_type, check_logical_path(path), base_offset),
            commit_position=commit_position,
            max_size=max_size,
        )

    async def list_segments(self, path: str, file_type: FileType) -> list[int]:
        check_logical_path(path)
        prefix = f"{path}/{file_type.value}/"
        names = [key[len(prefix) :] for key in self.volume if key.startswith(prefix)]
        return sorted(parse_segment_name(n) for n in names if "/" not in n)

    async def list_children(self, path: str) -> list[str]:
        check_logical_path(path, allow_root=True)
        prefix = f"{path}/" if path else ""
        children = {key[len(prefix) :].split("/", 1)[0] for key in self.volume if key.startswith(prefix)}
        return sorted(children)

    async def list_objects(self, path: str) -> list[StoredObject]:
        check_logical_path(path, allow_root=True)
        prefix = f"{path}/" if path else ""
        return [
            # A key a test wrote into the volume directly has no recorded write: it counts as written now.
            StoredObject(key, len(data), self.volume.modified.get(key, now_ms()))
            for key, data in sorted(self.volume.items())
            if key == path or key.startswith(prefix)
        ]

    async def delete_objects(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.volume.pop(check_logical_path(key), None)
            self.volume.modified.pop(key, None)

    @staticmethod
    def wipe(name: str | None = None) -> None:
        """Forget one volume (or all): for test isolation."""
        if name is None:
            _VOLUMES.clear()
        else:
            _VOLUMES.pop(name, None)
