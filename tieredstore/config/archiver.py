"""Settings of the archiver: group commit, concurrency, leases, topic filters, and the key index it writes."""

from __future__ import annotations

from typing import Any, ClassVar

import pydantic
from pydantic import Field

from tieredstore.basics import MIB
from tieredstore.config.section import Section
from tieredstore.topic_filter import check_topic_pattern


class ArchiverSettings(Section):
    """The dispatcher's group commit and concurrency."""

    section: ClassVar[str] = "archiver"
    removed_keys: ClassVar[dict[str, str]] = {
        "unmap_hot_reads": "batch reads always unmap the hot pages they copy, which bounds the archiver's memory",
        "tune_allocator": "tieredstore run always tunes glibc's allocator, except where a MALLOC_* variable is set",
    }

    group_commit_timeout: float = Field(
        default=30.0, ge=0, description="seconds the oldest pending message of a queue may wait for its batch"
    )
    group_commit_count: int = Field(default=4096, ge=1, description="messages pending in a queue that make it commit")
    group_commit_size: int = Field(
        default=4 * MIB, ge=1, description="bytes of one batch, always at least one message however large"
    )
    max_pending_commits: int = Field(
        default=8,
        ge=1,
        description="batches in memory or in flight, all queues together: slow storage slows the archiver instead",
    )
    scan_interval: float = Field(default=1.0, gt=0, description="seconds between scans of idle queues")
    start_from: str = Field(
        default="earliest",
        description="where a queue seen for the first time starts: earliest | latest | an epoch-ms timestamp",
    )
    shutdown_timeout: float = Field(
        default=30.0, gt=0, description="seconds in-flight commits may take to finish on SIGTERM or SIGINT"
    )
    max_upload_bytes_per_second: int | None = Field(
        default=None,
        gt=0,
        description="cap on the bytes the archiver writes to cold storage a second, all queues and the key index "
        "together (None: no cap); a commit larger than one second's worth still goes, alone",
    )
    commit_timeout: float = Field(
        default=120.0,
        gt=0,
        description="seconds a storage call of a commit may take before it is abandoned and retried from its buffer",
    )
    retry_initial_backoff: float = Field(
        default=0.2, gt=0, description="seconds before a failed commit's first retry; doubled at each failure"
    )
    retry_max_backoff: float = Field(default=30.0, gt=0, description="seconds between retries at the most")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve Prometheus /metrics on this port (0: a free one; none: off)"
    )
    metrics_addr: str = Field(default="127.0.0.1", description="address /metrics binds to; 0.0.0.0 in a container")
    maintain_interval: float = Field(
        default=60.0,
        gt=0,
        description="seconds between maintenance passes: hot and cold retention (rolling segments that are due), "
        "key-index upload",
    )
    leases: bool | None = Field(
        default=None,
        description="split queues among several archivers by lease; default: on for PostgreSQL, off for SQLite",
    )
    owner_id: str | None = Field(
        default=None, max_length=200, description="this archiver's name in leases; default: <hostname>-<pid>-<random>"
    )
    lease_duration: float = Field(default=30.0, gt=0, description="seconds a queue lease lasts unless renewed")
    lease_renew_interval: float = Field(default=10.0, gt=0, description="seconds between lease renewals")
    topics_include: tuple[str, ...] = Field(
        default=("*",),
        min_length=1,
        description="glob patterns (* ? [...], case-sensitive) of the hot topics to archive",
    )
    topics_exclude: tuple[str, ...] = Field(
        default=(),
        description="glob patterns of topics not to archive even if included; what was archived stays readable",
    )
    archive_system_topics: bool = Field(
        default=False,
        description="also archive RocketMQ's system topics (rmq_sys_*, SCHEDULE_TOPIC_XXXX, "
        "RMQ_SYS_TRANS_HALF_TOPIC, ...: tieredstore.topic_filter), excluded by default",
    )

    @pydantic.model_validator(mode="after")
    def _check_lease_timing(self) -> ArchiverSettings:
        # A renewal may fail once and the lease must still be renewed well before it can be taken over.
        if self.lease_renew_interval * 3 > self.lease_duration * (1 + 1e-9):
            raise ValueError(
                f"lease_renew_interval ({self.lease_renew_interval:g}s) must be at most a third of "
                f"lease_duration ({self.lease_duration:g}s)"
            )
        return self

    @pydantic.field_validator("topics_include", "topics_exclude", mode="before")
    @classmethod
    def _require_a_list(cls, value: Any) -> Any:
        # A bare string would otherwise be refused as "not a valid tuple", which names no TOML type.
        if not isinstance(value, list | tuple):
            raise ValueError('must be a list of glob patterns, e.g. ["Orders*", "%DLQ%*"]')
        return value

    @pydantic.field_validator("topics_include", "topics_exclude")
    @classmethod
    def _check_topic_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            check_topic_pattern(pattern)
        return patterns

    @pydantic.field_validator("start_from")
    @classmethod
    def _check_start_from(cls, value: str) -> str:
        if value not in ("earliest", "latest") and not value.isdigit():
            raise ValueError("must be 'earliest', 'latest' or an epoch-millisecond timestamp")
        return value


class IndexSettings(Section):
    """The key index the archiver writes: RocketMQ IndexFiles (items as maxIndexNum, slots as maxHashSlotNum)."""

    section: ClassVar[str] = "index"

    index_max_items: int = Field(
        default=20_000_000, ge=1, description="items (keys) of each archived key-index file (RocketMQ's maxIndexNum)"
    )
    index_slot_count: int = Field(default=5_000_000, ge=1, description="hash slots of each archived key-index file")
    index_seal_interval: float = Field(
        default=3600.0,
        gt=0,
        description="seconds after which a key-index file is sealed and uploaded even if not full: "
        "readers elsewhere find its keys once uploaded",
    )
