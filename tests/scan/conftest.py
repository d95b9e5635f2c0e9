"""A small POSIX archive for the pyspark-free scan: one queue with a lost range across several segments."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.spark.helpers import Archive, archive_messages, make_message

TOPIC = "orders"
# Offsets 70..94 were lost by the hot store before archiving: a consume-queue hole, no records.
QUEUE_0_OFFSETS = [*range(0, 70), *range(95, 160)]
QUEUE_1_COUNT = 40


@pytest.fixture(scope="session")
def scan_archive(tmp_path_factory: pytest.TempPathFactory) -> Archive:
    root: Path = tmp_path_factory.mktemp("scan-posix")
    archive = Archive("posix", str(root / "cold"), f"sqlite:///{root / 'metadata.db'}")
    messages = {
        (TOPIC, 0): [make_message(TOPIC, 0, offset) for offset in QUEUE_0_OFFSETS],
        (TOPIC, 1): [make_message(TOPIC, 1, offset) for offset in range(QUEUE_1_COUNT)],
    }
    asyncio.run(archive_messages(archive, {}, messages))
    return archive
