"""Settings of the local hot store."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from tieredstore.basics import GIB, MIB
from tieredstore.config.section import Section


class HotSettings(Section):
    """The local hot store."""

    section: ClassVar[str] = "hot"

    commit_log_file_size: int = Field(
        default=GIB,
        ge=4096,
        description="bytes of each commit-log file of a new hot store; existing files keep their size on disk",
    )
    consume_queue_units_per_file: int = Field(
        default=300_000, ge=1, description="units (20 bytes each) of each consume-queue file of a new hot store"
    )
    max_message_size: int = Field(default=4 * MIB, ge=1, description="bytes of the largest body a put accepts")
    max_queues_per_topic: int = Field(default=1024, ge=1, description="queue ids a topic may use: 0 to this minus one")
    flush_mode: Literal["async", "sync"] = Field(
        default="async",
        description="sync: a put returns once its bytes are on disk; async: flushed every flush_interval",
    )
    flush_interval: float = Field(
        default=0.5, gt=0, description="seconds between hot-store flushes; the archiver takes only flushed messages"
    )
    hot_retention_hours: float = Field(
        default=72, ge=0, description="hours a hot commit-log file is kept, and then deleted only once archived"
    )
    hot_disk_high_watermark: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description="fraction of the hot store's file system in use above which puts are refused",
    )
    index_slot_count: int = Field(
        default=100_000,
        ge=1,
        le=50_000_000,
        description="hash slots of each hot key-index file (<hot>/index/; RocketMQ's maxHashSlotNum, 5,000,000)",
    )
    index_max_items: int = Field(
        default=400_000,
        ge=2,
        le=50_000_000,
        description="items of each hot key-index file, one key each but item 0 (RocketMQ's maxIndexNum, 20,000,000)",
    )
