"""The 20-byte consume-queue unit: commit-log offset(8), size(4), tag hash(8); pure functions."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from tieredstore.errors import CorruptRecordError

UNIT_SIZE = 20
# commit-log offset, size, tag hash: for writers that pack many units straight into one buffer.
UNIT_STRUCT = struct.Struct(">qiq")
_UNIT = UNIT_STRUCT


@dataclass(frozen=True, slots=True)
class ConsumeQueueUnit:
    """Where one message of a queue lives in its commit log, and its tag hash."""

    commitlog_offset: int
    size: int
    tag_hash: int

    def encode(self) -> bytes:
        return _UNIT.pack(self.commitlog_offset, self.size, self.tag_hash)

    @property
    def is_empty(self) -> bool:
        """A zero-filled slot: preallocated file space that was never written."""
        return self.commitlog_offset == 0 and self.size == 0 and self.tag_hash == 0

    @classmethod
    def decode(cls, buf: bytes | memoryview, pos: int = 0) -> ConsumeQueueUnit:
        if len(buf) - pos < UNIT_SIZE:
            raise CorruptRecordError(f"truncated consume-queue unit: {len(buf) - pos} of {UNIT_SIZE} bytes", offset=pos)
        offset, size, tag = _UNIT.unpack_from(buf, pos)
        if offset < 0 or size < 0:
            raise CorruptRecordError(f"consume-queue unit with negative offset {offset} or size {size}", offset=pos)
        return cls(offset, size, tag)


def encode_units(units: list[ConsumeQueueUnit]) -> bytes:
    return b"".join(u.encode() for u in units)


def iter_units(buf: bytes | memoryview) -> Iterator[ConsumeQueueUnit]:
    """Every whole unit in ``buf``; a trailing partial unit is a CorruptRecordError."""
    if len(buf) % UNIT_SIZE:
        raise CorruptRecordError(f"consume-queue bytes of length {len(buf)} are not a multiple of {UNIT_SIZE}")
    for pos in range(0, len(buf), UNIT_SIZE):
        yield ConsumeQueueUnit.decode(buf, pos)
