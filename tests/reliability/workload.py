"""Messages, archiving with retries and mounts for the reliability scenarios."""

from __future__ import annotations

import contextlib
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tieredstore.errors import StorageError
from tieredstore.flat import FlatFileSettings, FlatFileStore, FlatMessageFile
from tieredstore.flat.message_file import RecordRun
from tieredstore.formats.message import MessageRecord, tag_hash
from tieredstore.metadata import MetadataStore
from tieredstore.providers.base import Provider

BASE_TIMESTAMP = 1_700_000_000_000
TAGS = "TagA"


def make_record(queue_offset: int, *, topic: str, queue_id: int = 0, size: int | None = None) -> bytes:
    """A hot-store record with a body that depends only on its offset (so a test can rebuild the reference)."""
    rng = random.Random(queue_offset * 7919 + queue_id)
    body = rng.randbytes(size if size is not None else rng.randint(50, 900))
    return MessageRecord(
        topic=topic,
        queue_id=queue_id,
        body=body,
        properties={"KEYS": f"key-{queue_offset}", "TAGS": TAGS, "UNIQ_KEY": f"U{queue_offset:010d}"},
        queue_offset=queue_offset,
        physical_offset=10_000_000 + queue_offset * 1024,
        born_timestamp=BASE_TIMESTAMP,
        store_timestamp=BASE_TIMESTAMP + queue_offset,
    ).encode()


async def append_records(queue: FlatMessageFile, start: int, end: int, **kwargs: int) -> dict[int, bytes]:
    """Buffer records ``start``..``end - 1`` in ``queue``; returns them by queue offset (the hot copy)."""
    records = {}
    for offset in range(start, end):
        record = make_record(offset, topic=queue.topic, queue_id=queue.queue_id, **kwargs)
        await queue.append_records(RecordRun.of([(record, offset, BASE_TIMESTAMP + offset, tag_hash(TAGS))]))
        records[offset] = record
    return records


async def commit_until_durable(queue: FlatMessageFile, *, attempts: int = 200) -> tuple[int, int]:
    """Commit, retrying StorageErrors; returns (archived offset, failed attempts)."""
    failures = 0
    for _ in range(attempts):
        try:
            return await queue.commit(), failures
        except StorageError:
            failures += 1
    raise AssertionError(f"{queue} still failing after {attempts} commit attempts")


def new_flat_store(
    provider: Provider, metadata: MetadataStore, settings: FlatFileSettings | None = None
) -> FlatFileStore:
    return FlatFileStore(provider, metadata, cluster="ReliabilityCluster", broker="broker-r", settings=settings)


def _mount(*arguments: str) -> None:
    result = subprocess.run(["mount", *arguments], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(
            f"this scenario needs to mount a small tmpfs (mount {' '.join(arguments)}: {result.stderr.strip()}); "
            "run the reliability suite as root or with CAP_SYS_ADMIN",
            pytrace=False,
        )


class Tmpfs:
    """A tmpfs mounted at ``path``: a real file system that really fills up and really goes read-only."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        _mount("-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))

    def remount(self, *options: str) -> None:
        _mount("-o", ",".join(("remount", *options)), str(self.path))

    @contextlib.contextmanager
    def read_only(self) -> Iterator[None]:
        self.remount("ro")
        try:
            yield
        finally:
            self.remount("rw")

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
