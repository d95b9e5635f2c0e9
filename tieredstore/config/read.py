"""Settings of the read path: which tier serves a read, and the read-ahead cache."""

from __future__ import annotations

import enum
from typing import ClassVar

from pydantic import Field

from tieredstore.basics import MIB
from tieredstore.config.section import Section


class ReadPolicy(enum.StrEnum):
    """Which tier serves a read (RocketMQ's TieredStorageLevel)."""

    DISABLE = "DISABLE"  # hot only
    NOT_IN_DISK = "NOT_IN_DISK"  # cold only when the hot store no longer has the offset
    NOT_IN_MEM = "NOT_IN_MEM"  # cold when the hot copy is not resident in memory
    FORCE = "FORCE"  # cold always


class ReadSettings(Section):
    """The fetcher and its read-ahead cache."""

    section: ClassVar[str] = "read"
    removed_keys: ClassVar[dict[str, str]] = {
        "prefetch_handoff": "a reader that starts a prefetch gives its read a turn of the event loop to start",
    }

    read_policy: ReadPolicy = Field(
        default=ReadPolicy.NOT_IN_DISK,
        description="which tier serves a read: DISABLE hot only, NOT_IN_DISK cold once the hot store lost the offset, "
        "NOT_IN_MEM cold when the hot copy is not in memory, FORCE cold always",
    )
    read_ahead_count: int = Field(
        default=4096, ge=1, description="messages a cold miss reads ahead in one window (two more are prefetched)"
    )
    read_ahead_size: int = Field(
        default=16 * MIB, ge=1, description="bytes of one read-ahead window at the most, never below one message"
    )
    read_ahead_cache_bytes: int = Field(
        default=256 * MIB, ge=0, description="bytes the read-ahead cache holds at the most; 0: no cache"
    )
    read_ahead_ttl: float = Field(default=15.0, gt=0, description="seconds a cached window stays after its last read")
    read_ahead_readers: int = Field(
        default=1,
        ge=0,
        description=(
            "how many readers read each cold window through: a cached window is released once its last record "
            "has been served that many times (0: kept until read_ahead_ttl or eviction). Set it to the number of "
            "consumer groups that read the same queues at about the same time"
        ),
    )
