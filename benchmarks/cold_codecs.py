"""What the issue-33 benchmarks share: the demo's JSON messages, codec settings with a fixed test key, stored bytes.

The demo workload is the one ``tieredstore run --demo`` puts (its own producer, unthrottled): JSON order
bodies with a key and a tag each, over two topics. The codec settings are the ``[cold]`` and
``[encryption]`` sections a node reads, with a keyring file holding one fixed key: these benchmarks
measure the codecs, not key management. Stored bytes are counted per file type from what the cold tier
holds (every object or file, descriptors included), which is what a bill or a disk would count.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.workloads import HotData, config_for
from tieredstore.cli.run import DEMO_TOPICS, DemoProducer
from tieredstore.formats.naming import FileType
from tieredstore.runtime import open_hot_store

BENCH_KEY_ID = "bench-kek"
# A fixed key: the benchmark measures sealing, and a reproducible keyring keeps its runs comparable.
BENCH_KEY = bytes(range(32))
DEMO_QUEUES: tuple[tuple[str, int], ...] = tuple(
    (topic, queue_id) for topic, count in DEMO_TOPICS for queue_id in range(count)
)
UNTHROTTLED = 1e12  # messages per second: the demo producer never waits


def codec_sections(directory: Path, *, compression: bool, encrypt: bool) -> dict[str, dict[str, Any]]:
    """``cold`` and ``encryption`` config sections: zstd at its default level or none, sealed or not.

    With ``encrypt`` a keyring file holding the fixed test key is written in ``directory``.
    """
    sections: dict[str, dict[str, Any]] = {"cold": {"compression": "zstd" if compression else "none"}}
    if encrypt:
        keyring = directory / "keyring.toml"
        keyring.write_text(f'[keys]\n{BENCH_KEY_ID} = "{base64.b64encode(BENCH_KEY).decode()}"\n', encoding="utf-8")
        keyring.chmod(0o600)
        sections["encryption"] = {"keyring_file": str(keyring), "active_key": BENCH_KEY_ID}
    return sections


def codec_label(*, compression: bool, encrypt: bool) -> str:
    return {
        (False, False): "uncompressed",
        (True, False): "zstd",
        (False, True): "AES-256-GCM",
        (True, True): "zstd + AES-256-GCM",
    }[(compression, encrypt)]


def fill_demo_hot_store(data_dir: Path, *, messages: int) -> HotData:
    """A hot store holding ``messages`` of the demo workload, put by the demo's own producer."""
    config = config_for(data_dir, queues=len(DEMO_QUEUES))
    with open_hot_store(config) as hot:
        producer = DemoProducer(hot, messages, UNTHROTTLED)
        producer.start()
        producer.join()
        if producer.error is not None or producer.produced != messages:
            raise RuntimeError(f"the demo producer put {producer.produced} of {messages}: {producer.error}")
        hot.flush()
        record_bytes = hot.commitlog_max_offset - hot.commitlog_min_offset
    return HotData(data_dir, messages, len(DEMO_QUEUES), record_bytes)


@dataclass(frozen=True, slots=True)
class StoredBytes:
    """Bytes the cold tier holds, by file type (``other``: anything outside a type folder)."""

    commit_log: int = 0
    consume_queue: int = 0
    index: int = 0
    other: int = 0

    @property
    def data(self) -> int:
        """Commit log and consume queues together: the messages and their positions."""
        return self.commit_log + self.consume_queue

    @property
    def total(self) -> int:
        return self.data + self.index + self.other

    def as_extras(self) -> dict[str, float]:
        return {
            "commit_log_bytes": float(self.commit_log),
            "consume_queue_bytes": float(self.consume_queue),
            "index_bytes": float(self.index),
        }


def tally(objects: Iterable[tuple[str, int]]) -> StoredBytes:
    """Sizes of ``(key, size)`` pairs summed by the type folder in each key's path."""
    sizes = dict.fromkeys(("commit_log", "consume_queue", "index", "other"), 0)
    folders = {
        FileType.COMMIT_LOG.value: "commit_log",
        FileType.CONSUME_QUEUE.value: "consume_queue",
        FileType.INDEX.value: "index",
    }
    for key, size in objects:
        kind = next((folders[part] for part in key.split("/") if part in folders), "other")
        sizes[kind] += size
    return StoredBytes(**sizes)


def stored_in_directory(root: Path) -> StoredBytes:
    """What a POSIX cold tier under ``root`` holds."""
    return tally(
        (os.path.relpath(os.path.join(folder, name), root), os.path.getsize(os.path.join(folder, name)))
        for folder, _, names in os.walk(root)
        for name in names
    )


def stored_in_bucket(client: Any, bucket: str) -> StoredBytes:
    """What an S3 bucket holds."""
    return tally(
        (item["Key"], int(item["Size"]))
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for item in page.get("Contents", [])
    )
