"""The store checkpoint file: up to which commit-log offset everything is durable and dispatched.

Laid out like RocketMQ's ``checkpoint`` (a 4096-byte file; physic / logics / index timestamps at
bytes 0 / 8 / 16, master-flushed offset at 24, confirmed physical offset at 32), so an operator's
tools recognise it. ``confirmed_offset`` is the recovery start: every record below it is flushed
and every consume-queue unit for those records is flushed too. A CRC at byte 40 tells a torn or
foreign file from ours; the file is replaced atomically, never rewritten in place.

A follower also reads a RocketMQ broker's own checkpoint (no CRC) as a ``FlushedBound``; see there.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from tieredstore.formats.checksum import crc32
from tieredstore.local.mapped_file import fsync_directory

CHECKPOINT_FILE_SIZE = 4096
_FIELDS = struct.Struct(">qqqqq")
_CRC = struct.Struct(">I")
CheckpointSource = Literal["tieredstore", "rocketmq", "missing", "unrecognised"]


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
        return cls.decode(raw)

    @classmethod
    def decode(cls, raw: bytes) -> Checkpoint | None:
        """The checkpoint ``raw`` holds; None when it is short or not one of ours."""
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


# RocketMQ's recovery starts where records are older than the checkpoint's timestamp minus this margin
# (StoreCheckpoint.getMinTimestamp), so that a wall clock stepped back a little since cannot make an
# unflushed record look older than the last flushed one; the margin also covers later records stored
# in the flushed record's own millisecond.
CLOCK_STEP_MARGIN_MS = 3000


@dataclass(frozen=True, slots=True)
class FlushedBound:
    """What a writer's checkpoint file says is flushed, as a follower reads it.

    A record is flushed when it ends at or below ``offset``, or when its store timestamp is at or
    before ``stored_until`` (ms; 0 when the checkpoint gives no time; for a broker, its
    physicMsgTimestamp less ``CLOCK_STEP_MARGIN_MS``). ``source`` says which checkpoint
    the bound comes from: ``tieredstore`` (ours: ``offset`` is its confirmed offset), ``rocketmq`` (a
    broker's own, without our CRC), ``missing`` (no file: nothing is flushed yet) or ``unrecognised``
    (too short to be either: nothing is known to be flushed).

    A RocketMQ broker sets physicMsgTimestamp after each thorough flush to the store timestamp of the
    last record the flush covered, and its abnormal recovery trusts every record older than that
    (less the clock margin). It writes confirmPhyOffset at every start, as the end its recovery found,
    and moves it while running only in controller or duplication mode; so that offset is a floor
    that may stay put for the broker's whole life, never the only bound. The file does not say
    which mode a broker runs in, so under controller mode a record flushed on this broker but not
    yet acknowledged by its sync-state set counts as flushed, though a failover may truncate it.
    """

    source: CheckpointSource
    offset: int = 0
    stored_until: int = 0

    @property
    def known(self) -> bool:
        """Whether the file says anything is flushed."""
        return self.offset > 0 or self.stored_until > 0

    def covers(self, ends: npt.NDArray[np.int64], store_timestamps: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which of some records (where each ends in the commit log, when each was stored) this bound says are
        flushed."""
        flushed: npt.NDArray[np.bool_] = ends <= self.offset
        if self.stored_until > 0:
            flushed |= store_timestamps <= self.stored_until
        return flushed

    @classmethod
    def read(cls, path: Path) -> FlushedBound:
        """The bound the checkpoint at ``path`` gives: ours when our CRC checks out, else a broker's."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls("missing")
        ours = Checkpoint.decode(raw)
        if ours is not None:
            return cls("tieredstore", offset=ours.confirmed_offset)
        if len(raw) < _FIELDS.size:
            return cls("unrecognised")
        physic, _logics, _index, _master_flushed, confirm_phy = _FIELDS.unpack_from(raw)
        return cls("rocketmq", offset=max(confirm_phy, 0), stored_until=max(physic - CLOCK_STEP_MARGIN_MS, 0))
