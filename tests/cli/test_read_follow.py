"""A reader of a queue's archive that goes on from where the last read ended (``read``, each poll of
``tail``) follows the cold commit log: the consume queue is read only where it starts."""

from __future__ import annotations

import asyncio

import pytest

from tests.cli.helpers import Node, hot_records
from tests.cli.test_lost_ranges import node_config
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.formats.message import same_but_physical_offset
from tieredstore.formats.naming import FileType
from tieredstore.read.node import open_read_node
from tieredstore.read.queue_reader import QueueReader


def test_later_reads_and_later_polls_follow_the_cold_commit_log(posix: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    produce(posix, 0, 60)
    archive(posix)
    originals = hot_records(posix.hot_dir, TOPIC, 0)
    config = node_config(posix, monkeypatch)
    reads: list[FileType] = []

    async def poll(previous: QueueReader | None, offset: int) -> QueueReader:
        async with open_read_node(config, hot=False) as node:
            before = None if previous is None else previous.cold_reader
            reader = await QueueReader.open(node, TOPIC, 0, "cold", cold_reader=before)
            for start in (offset, offset + 10):
                batch = await reader.read(start, 10, "cold")
                assert [m.record.queue_offset for m in batch.messages] == list(range(start, start + 10))
                assert all(same_but_physical_offset(m.raw, originals[at]) for at, m in enumerate(batch.messages, start))
            assert reader.cold_reader is not None
            reader.cold_reader.count_read = reads.append
            return reader

    async def go() -> None:
        first = await poll(None, 5)
        reads.clear()
        await poll(first, 25)  # a later poll, with its own view of the queue's files
        assert reads and FileType.CONSUME_QUEUE not in reads

    asyncio.run(go())
