"""A writer process that behaves like a RocketMQ broker beside a sidecar archiver: RocketMQ's file layout at
scaled-down sizes (64 KiB commit-log files, 20-unit consume-queue files), its own time-based retention that
deletes the oldest files whatever the archive holds, and a broker's checkpoint after every flush.

Usage: python -m tests.archiver.broker_writer STORE_DIR SECONDS RATE RETENTION_SECONDS

It puts about RATE messages a second for SECONDS, then flushes, checkpoints and exits. Retention deletes a
commit-log file once the first record after it is RETENTION_SECONDS old (the broker's fileReservedTime),
then the consume-queue files wholly below the commit log's first file. One line per event on stdout, times
from the system-wide monotonic clock:

    PUT topic queue_id queue_offset commitlog_offset size crc32(body)   once the put returned
    DURABLE commitlog_end time      flushed, and a checkpoint covering every record below commitlog_end written
    DELETED file_start file_end time    a commit-log file retention deleted
    DONE
"""

from __future__ import annotations

import os
import random
import struct
import sys
import time
import zlib
from pathlib import Path

import structlog

from tieredstore.local import LocalMessageStore, LocalStoreConfig, PutRequest

QUEUES = (("Orders", 0), ("Orders", 1), ("Payments", 0))
FILE_SIZE = 64 << 10
FLUSH_INTERVAL = 0.05
RETENTION_INTERVAL = 0.1
_CHECKPOINT = struct.Struct(">qqqqq")


def write_broker_checkpoint(store_dir: Path, physic_timestamp: int, confirm_phy_offset: int) -> None:
    """The checkpoint a broker in controller mode keeps (StoreCheckpoint: physic / logics / index timestamps,
    master-flushed and confirmed offsets, no CRC), replaced whole so that a reader never sees half of it."""
    fields = _CHECKPOINT.pack(physic_timestamp, physic_timestamp, 0, 0, confirm_phy_offset)
    temporary = store_dir / "checkpoint.writing"
    temporary.write_bytes(fields + bytes(4096 - len(fields)))
    os.replace(temporary, store_dir / "checkpoint")


def main(store_dir: Path, seconds: float, rate: float, retention: float) -> None:
    config = LocalStoreConfig(
        commit_log_file_size=FILE_SIZE,
        max_message_size=16 << 10,
        consume_queue_units_per_file=20,
        flush_interval=3600.0,  # flushed here, each flush followed by the broker's checkpoint
        hot_retention_hours=retention / 3600,
    )
    rng = random.Random(7)
    out = sys.stdout
    with LocalMessageStore(store_dir, config=config) as store:
        started = time.monotonic()
        flushed_at = retained_at = started
        produced, last_stamp, end = 0, 0, 0
        while (now := time.monotonic()) - started < seconds:
            batch = [PutRequest(*rng.choice(QUEUES), rng.randbytes(rng.randint(200, 2000))) for _ in range(5)]
            for put, request in zip(store.put_messages(batch), batch, strict=True):
                out.write(
                    f"PUT {put.topic} {put.queue_id} {put.queue_offset} {put.commitlog_offset} {put.size} "
                    f"{zlib.crc32(request.body)}\n"
                )
                last_stamp, end = put.store_timestamp, put.commitlog_offset + put.size
            produced += len(batch)
            if now - flushed_at >= FLUSH_INTERVAL:
                flushed_at = now
                store.flush()
                write_broker_checkpoint(store_dir, last_stamp, end)
                out.write(f"DURABLE {end} {time.monotonic()}\n")
            if now - retained_at >= RETENTION_INTERVAL:
                retained_at = now
                # Everything counts as archived: a broker deletes by age alone.
                report = store.delete_expired(lambda topic, queue_id: 1 << 62)
                deleted_at = time.monotonic()
                for name in report.commit_log_files:
                    out.write(f"DELETED {int(name)} {int(name) + FILE_SIZE} {deleted_at}\n")
            out.flush()
            ahead = produced / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        store.flush()
        write_broker_checkpoint(store_dir, last_stamp, end)
        out.write(f"DURABLE {end} {time.monotonic()}\nDONE\n")
        out.flush()


if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout is the event log
    main(Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
