"""The store checkpoint file: up to which commit-log offset everything is durable and dispatched.

Laid out like RocketMQ's ``checkpoint`` (a 4096-byte file; physic / logics / index timestamps at
bytes 0 / 8 / 16, master-flushed offset at 24, confirmed physical offset at 32), so an operator's
tools recognise it. ``confirmed_offset`` is the recovery start: every record below it is flushed
and every consume-queue unit for those records is flushed too. A CRC at byte 40 tells a torn or
foreign file from ours; the file is replaced atomically, never rewritten in place.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from tieredstore.formats.checksum import crc32
from tieredstore.local.mapped_file import fsync_directory

CHECKPOINT_FILE_SIZE = 4096
_FIELDS = struct.Struct(">qqqqq")
_CRC = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What the last flush made durable."""

    physic_timestamp: int = 0
    logics_timestamp: int = 0
    index_timestamp: int = 0
    confirmed_offset: int = 0

    def encode(self) -> bytes:
        fields = _FIELDS.pack(
            self.physic_timestamp, self.logics_timestamp, self.index_timestamp, 0, self.confirmed_offset
        )
        raw = fields + _CRC.pack(crc32(fields))
        return raw + bytes(CHECKPOINT_FILE_SIZE - len(raw))

    @classmethod
    def read(cls, path: Path) -> Checkpoint | None:
        """The checkpoint at ``path``; None when it is missing, short or not one of ours."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) < _FIELDS.size + _CRC.size:
            return None
        (crc,) = _CRC.unpack_from(raw, _FIELDS.size)
        if crc != crc32(raw[: _FIELDS.size]):
            return None
        physic, logics, index, _master_flushed, confirmed = _FIELDS.unpack_from(raw)
        return cls(physic, logics, index, confirmed)

    def write(self, path: Path) -> None:
        """Write to a temporary file, fsync, then rename over ``path``: a crash leaves the old or the new one."""
        temporary = path.with_name(path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, self.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        fsync_directory(path.parent)
