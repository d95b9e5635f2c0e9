"""Settings of the local hot store: file sizes, limits, flush policy, retention and the disk guard."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tieredstore.errors import ConfigError
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import HostAddress

FlushMode = Literal["async", "sync"]

# RocketMQ's index file is mapped whole and its item numbers are i32: keep it well inside both.
INDEX_CAPACITY_LIMIT = 50_000_000
# Room for everything around the body: header, hosts, topic and a generous property block.
RECORD_OVERHEAD_BOUND = 512 + 0x7FFF


def parse_host(text: str) -> HostAddress:
    """``ip:port`` or ``[ipv6]:port`` as a HostAddress; ConfigError when malformed."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(f"store_host {text!r} must be 'ip:port' or '[ipv6]:port'")
    host = host.removeprefix("[").removesuffix("]")
    address = HostAddress(host, int(port_text))
    try:
        address.encode()
    except ValueError as exc:
        raise ConfigError(f"store_host {text!r} does not hold an IP address: {exc}") from exc
    return address


def check_commit_log_file_size(file_size: int, max_message_size: int) -> None:
    """ConfigError unless a commit-log file of ``file_size`` bytes holds a record of ``max_message_size``."""
    smallest_file = max_message_size + RECORD_OVERHEAD_BOUND + 8
    if file_size < smallest_file:
        raise ConfigError(
            f"commit-log files of {file_size} bytes (commit_log_file_size, or the size of the files already on "
            f"disk) cannot hold a record of max_message_size {max_message_size}; they must be at least {smallest_file}"
        )


@dataclass(frozen=True, slots=True)
class LocalStoreConfig:
    """Everything a LocalMessageStore can be told; validated on construction, frozen afterwards.

    ``hot_disk_high_watermark`` is the fraction of the file system that may be used before puts are
    refused; ``hot_disk_max_bytes`` additionally caps the bytes this store itself holds.
    ``index_slot_count`` and ``index_max_items`` size each key-index file (``<dir>/index/``): RocketMQ's
    broker defaults are 5,000,000 and 20,000,000 (a 420 MB file); ours make an 8.4 MB one. A file takes
    ``index_max_items - 1`` keys, since item 0 is never written.
    """

    commit_log_file_size: int = 1 << 30
    consume_queue_units_per_file: int = 300_000
    max_message_size: int = 4 << 20
    max_queues_per_topic: int = 1024
    flush_mode: FlushMode = "async"
    flush_interval: float = 0.5
    hot_retention_hours: float = 72.0
    hot_disk_high_watermark: float = 0.9
    hot_disk_max_bytes: int | None = None
    store_host: str = "127.0.0.1:10911"
    index_slot_count: int = 100_000
    index_max_items: int = 400_000
    store_host_address: HostAddress = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.flush_mode not in ("async", "sync"):
            raise ConfigError(f"flush_mode must be 'async' or 'sync', not {self.flush_mode!r}")
        if self.max_message_size < 1:
            raise ConfigError(f"max_message_size must be positive, not {self.max_message_size}")
        check_commit_log_file_size(self.commit_log_file_size, self.max_message_size)
        if self.consume_queue_units_per_file < 1:
            raise ConfigError("consume_queue_units_per_file must be at least 1")
        if not 1 <= self.max_queues_per_topic <= 1 << 20:
            raise ConfigError(f"max_queues_per_topic must be in 1..{1 << 20}, not {self.max_queues_per_topic}")
        if not self.flush_interval > 0:
            raise ConfigError(f"flush_interval must be positive seconds, not {self.flush_interval}")
        if self.hot_retention_hours < 0:
            raise ConfigError(f"hot_retention_hours must not be negative, not {self.hot_retention_hours}")
        if not 0.0 < self.hot_disk_high_watermark <= 1.0:
            raise ConfigError(f"hot_disk_high_watermark is a fraction in (0, 1], not {self.hot_disk_high_watermark}")
        if self.hot_disk_max_bytes is not None and self.hot_disk_max_bytes < 0:
            raise ConfigError(f"hot_disk_max_bytes must not be negative, not {self.hot_disk_max_bytes}")
        if not 1 <= self.index_slot_count <= INDEX_CAPACITY_LIMIT:
            raise ConfigError(f"index_slot_count must be in 1..{INDEX_CAPACITY_LIMIT}, not {self.index_slot_count}")
        if not 2 <= self.index_max_items <= INDEX_CAPACITY_LIMIT:
            raise ConfigError(f"index_max_items must be in 2..{INDEX_CAPACITY_LIMIT}, not {self.index_max_items}")
        object.__setattr__(self, "store_host_address", parse_host(self.store_host))

    @property
    def consume_queue_file_size(self) -> int:
        return self.consume_queue_units_per_file * UNIT_SIZE
