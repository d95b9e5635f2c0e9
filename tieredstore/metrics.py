"""Prometheus metrics of the archiver and the read path, on a registry of our own.

A registry per process (not the global default) keeps tests independent and lets ``run`` serve exactly
these on ``--metrics-port``. Labels are topic and queue only: never a URL, a key or a credential.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from tieredstore.errors import ConfigError

COMMIT_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Metrics:
    """Every metric tieredstore exports; one instance per process (or per test)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.messages_dispatched = Counter(
            "tieredstore_dispatched_messages", "Messages archived to cold storage", ["topic"], registry=r
        )
        self.bytes_dispatched = Counter(
            "tieredstore_dispatched_bytes", "Record bytes archived to cold storage", ["topic"], registry=r
        )
        self.commit_latency = Histogram(
            "tieredstore_commit_seconds",
            "Time to commit one batch of one queue (commit log, consume queue, index, metadata)",
            buckets=COMMIT_LATENCY_BUCKETS,
            registry=r,
        )
        self.commit_failures = Counter(
            "tieredstore_commit_failures", "Failed batch commits (retried with backoff)", ["topic"], registry=r
        )
        self.commit_timeouts = Counter(
            "tieredstore_commit_timeouts",
            "Commit attempts abandoned after archiver.commit_timeout without an answer (retried from their buffer)",
            ["topic", "queue_id"],
            registry=r,
        )
        self.upload_throttled = Counter(
            "tieredstore_upload_throttled_seconds",
            "Seconds commits waited for archiver.max_upload_bytes_per_second",
            registry=r,
        )
        self.queue_lag = Gauge(
            "tieredstore_queue_lag_messages",
            "Hot max offset minus archived offset",
            ["topic", "queue_id"],
            registry=r,
        )
        self.lost_messages = Counter(
            "tieredstore_lost_messages",
            "Offsets the hot store dropped before they were archived",
            ["topic"],
            registry=r,
        )
        self.hot_behind_archive = Counter(
            "tieredstore_hot_behind_archive",
            "Times a queue's hot store was found holding fewer offsets than are archived (replaced or lost files)",
            ["topic"],
            registry=r,
        )
        self.storage_up = Gauge(
            "tieredstore_cold_storage_up", "1 when the last commit reached cold storage, 0 during an outage", registry=r
        )
        self.conditional_write_probes = Counter(
            "tieredstore_conditional_write_probes",
            "Checks that cold storage refuses a second conditional create, made once before writing it",
            ["result"],
            registry=r,
        )
        self.index_items = Counter(
            "tieredstore_index_items", "Key-index items written (one per key of each archived message)", registry=r
        )
        self.index_files = Gauge(
            "tieredstore_index_files", "This archiver's key-index files by state", ["status"], registry=r
        )
        self.index_upload_failures = Counter(
            "tieredstore_index_upload_failures",
            "Key-index maintenance passes (seal, compact, upload) that failed; the next pass retries",
            registry=r,
        )
        self.retention_segments = Counter(
            "tieredstore_retention_deleted_segments",
            "Cold segments deleted by retention",
            ["topic", "file_type"],
            registry=r,
        )
        self.retention_bytes = Counter(
            "tieredstore_retention_deleted_bytes", "Bytes of cold segments deleted by retention", ["topic"], registry=r
        )
        self.retention_index_files = Counter(
            "tieredstore_retention_deleted_index_files", "Key-index files deleted by retention", registry=r
        )
        self.retention_failures = Counter(
            "tieredstore_retention_failures",
            "Queues (or key-index passes) whose retention failed on a maintenance pass; the next pass retries",
            registry=r,
        )
        self.scrub_deleted_objects = Counter(
            "tieredstore_scrub_deleted_objects",
            "Orphans (segments, or sealed segments' tails) deleted by scrub",
            ["file_type"],
            registry=r,
        )
        self.scrub_deleted_bytes = Counter(
            "tieredstore_scrub_deleted_bytes", "Bytes of orphans deleted by scrub", ["file_type"], registry=r
        )
        self.table_lag = Gauge(
            "tieredstore_table_lag_messages",
            "Archived offsets not in the topic's Iceberg table yet, summed over its queues, after the last table sync",
            ["topic"],
            registry=r,
        )
        self.table_sync_failures = Counter(
            "tieredstore_table_sync_failures",
            "Background table syncs of a topic that failed; the next interval retries",
            ["topic"],
            registry=r,
        )
        self.cache_hits = Counter("tieredstore_read_ahead_hits", "Read-ahead cache hits", registry=r)
        self.cache_misses = Counter("tieredstore_read_ahead_misses", "Read-ahead cache misses", registry=r)
        self.cache_evictions = Counter("tieredstore_read_ahead_evictions", "Read-ahead cache evictions", registry=r)
        self.cache_released = Counter(
            "tieredstore_read_ahead_released",
            "Read-ahead cache records released once read through by read_ahead_readers readers",
            registry=r,
        )
        self.cache_bytes = Gauge("tieredstore_read_ahead_bytes", "Bytes held by the read-ahead cache", registry=r)
        self.cold_reads = Counter(
            "tieredstore_cold_reads", "Range reads sent to cold storage", ["file_type"], registry=r
        )

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve /metrics over HTTP in a daemon thread; returns the bound port (0 picks a free one).

        ConfigError when the address cannot be served (in use, not this machine's, unknown name).
        """
        try:
            server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
        return int(server.server_address[1])
