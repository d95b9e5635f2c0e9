"""Cold retention: per-topic reserve hours, provider first then DELETED rows, min offsets, index files, dry run;
readers and restores after it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.read.helpers import BASE_TIMESTAMP, HOUR_MS, append_records, make_config, make_record
from tieredstore.cli.topic import plan_retention
from tieredstore.fetcher import GetMessageStatus
from tieredstore.formats.message import decode
from tieredstore.formats.naming import FileType
from tieredstore.index import IndexFileStatus
from tieredstore.local import LocalMessageStore
from tieredstore.metadata import SegmentStatus
from tieredstore.read.node import open_read_node
from tieredstore.restore import HotStoreSink, RestoreRequest, restore_archive
from tieredstore.retention import apply_retention
from tieredstore.runtime import open_runtime
from tieredstore.store import AsyncTieredMessageStore

NOW = BASE_TIMESTAMP + 100 * HOUR_MS
# Segments cut by size only (the rolling interval is longer than the data's span), so that retention
# leaves commit-log bytes of expired records before the oldest one kept.
SIZED_SEGMENTS = {
    "commit_log_max_size": 4096,
    "consume_queue_max_size": 200,
    "commit_log_rolling_interval": 1000 * 3600,
}


def _stamp(n: int) -> int:
    """Topic A: offsets 0..29 stored 80 h before NOW, 30..59 48 h before, 60..99 1 h before."""
    hours_ago = 80 if n < 30 else 48 if n < 60 else 1
    return NOW - hours_ago * HOUR_MS + n


async def test_expired_segments_go_from_storage_then_metadata_and_min_offsets_move_up(
    tmp_path: Path, migrated_metadata_url: str
) -> None:
    config = make_config(
        tmp_path,
        metadata_url=migrated_metadata_url,
        segments=SIZED_SEGMENTS,
        index={"index_max_items": 30, "index_slot_count": 16},
    )
    async with AsyncTieredMessageStore.open(config, hot=False, owns_cold=True) as store:
        runtime = store.runtime
        await asyncio.to_thread(runtime.metadata.get_or_create_topic, "TopicA", reserve_hours=24)
        await asyncio.to_thread(runtime.metadata.get_or_create_topic, "TopicB", reserve_hours=72)
        a_records = [make_record("TopicA", 0, n, store_timestamp=_stamp(n), keys=(f"a{n}",)) for n in range(100)]
        flat_a = await append_records(runtime, "TopicA", 0, a_records, commit_every=10)
        b_records = [
            make_record("TopicB", 0, n, store_timestamp=NOW - 48 * HOUR_MS, keys=(f"b{n}",)) for n in range(50)
        ]
        flat_b = await append_records(runtime, "TopicB", 0, b_records, commit_every=10)
        segments_before = {
            kind: [(s.base_offset, s.key) for s in file.segments]
            for kind, file in ((FileType.COMMIT_LOG, flat_a.commit_log), (FileType.CONSUME_QUEUE, flat_a.consume_queue))
        }
        b_before = (len(flat_b.commit_log.segments), len(flat_b.consume_queue.segments))
        index_before = [record.file_id for record in runtime.index.files()]

        planned = await apply_retention(runtime, dry_run=True, now_ms=NOW)
        # The CLI's dry run reads only what is recorded (and the index files read-only): the same plan.
        cli_plan = await plan_retention(config, now_ms=NOW)
        assert cli_plan.index_files == planned.index_files == [index_before[0]]
        assert [(q.topic, q.min_offset_after) for q in cli_plan.queues] == [("TopicA", 60)]
        # a dry run changes nothing
        assert flat_a.min_offset == 0 and [r.file_id for r in runtime.index.files()] == index_before
        assert len(flat_a.consume_queue.segments) == len(segments_before[FileType.CONSUME_QUEUE])

        done = await apply_retention(runtime, now_ms=NOW)
        assert done.queues == planned.queues and done.index_files == planned.index_files
        [queue] = done.queues
        # 10 units per consume-queue segment: the six holding offsets 0..59 are older than 24 h
        assert (queue.topic, queue.min_offset_before, queue.min_offset_after) == ("TopicA", 0, 60)
        removed_units = [s for s in queue.segments if s.file_type is FileType.CONSUME_QUEUE]
        removed_records = [s for s in queue.segments if s.file_type is FileType.COMMIT_LOG]
        assert [s.base_offset for s in removed_units] == [n * 200 for n in range(6)]
        assert removed_records and done.bytes_removed > 0
        first_kept = (await flat_a.read_units(60, 1))[0].commitlog_offset
        assert all(s.base_offset + s.size <= first_kept for s in removed_records)
        assert flat_a.commit_log.min_offset <= first_kept

        # gone from the provider, then recorded DELETED
        removed_keys = {key for kind in segments_before for base, key in segments_before[kind]} - {
            s.key for s in (*flat_a.commit_log.segments, *flat_a.consume_queue.segments)
        }
        assert len(removed_keys) == len(queue.segments)
        for kind, listed in segments_before.items():
            for base, _key in listed:
                gone = any(s.base_offset == base and s.file_type is kind for s in queue.segments)
                assert await runtime.provider.segment(kind, flat_a.path, base).exists() is not gone
            deleted = runtime.metadata.list_segments(flat_a.path, kind, statuses=[SegmentStatus.DELETED])
            assert [r.base_offset for r in deleted] == [s.base_offset for s in queue.segments if s.file_type is kind]
        assert runtime.metadata.get_queue("TopicA", 0).min_offset == 60

        # consumers see the new minimum; what is left reads back whole
        result = await store.get_messages("TopicA", 0, 0)
        assert (result.status, result.next_begin_offset, result.min_offset) == (
            GetMessageStatus.OFFSET_TOO_SMALL,
            60,
            60,
        )
        tail = await store.get_messages("TopicA", 0, 60, 100)
        assert [m.queue_offset for m in tail.messages] == list(range(60, 100))
        # TopicB keeps 72 h: nothing of it is older
        assert (len(flat_b.commit_log.segments), len(flat_b.consume_queue.segments)) == b_before
        assert flat_b.min_offset == 0

        # index files hold every topic's keys: only the one older than the longest retention (72 h) went
        assert done.index_files == [index_before[0]]
        assert [r.file_id for r in runtime.index.files()] == index_before[1:]
        assert [m.queue_offset for m in await store.query_by_key("TopicA", "a70")] == [70]

        again = await apply_retention(runtime, now_ms=NOW)
        assert again.queues == [] and again.index_files == []
    # after a restart the queue still starts at 60
    async with AsyncTieredMessageStore.open(config, hot=False) as reopened:
        assert await reopened.get_min_offset("TopicA", 0) == 60
        assert len((await reopened.get_messages("TopicA", 0, 60, 100)).messages) == 40


async def test_a_reader_at_the_oldest_record_after_retention_is_served_what_the_consume_queue_says(
    tmp_path: Path, migrated_metadata_url: str
) -> None:
    config = make_config(
        tmp_path,
        metadata_url=migrated_metadata_url,
        segments=SIZED_SEGMENTS,
    )
    async with AsyncTieredMessageStore.open(config, hot=False, owns_cold=True) as store:
        runtime = store.runtime
        await asyncio.to_thread(runtime.metadata.get_or_create_topic, "TopicA", reserve_hours=24)
        records = [make_record("TopicA", 0, n, store_timestamp=_stamp(n), body=bytes([n]) * 40) for n in range(100)]
        flat = await append_records(runtime, "TopicA", 0, records, commit_every=10, index=False)
        await apply_retention(runtime, now_ms=NOW)
        first_kept = (await flat.read_units(60, 1))[0].commitlog_offset
        # Retention kept commit-log bytes before the oldest record: a reader that looked for it at the
        # commit log's start finds another record there, and must go by the consume queue.
        assert flat.min_offset == 60 and flat.commit_log.min_offset < first_kept
    async with AsyncTieredMessageStore.open(config, hot=False) as reader:
        result = await reader.get_messages("TopicA", 0, 60, 40)
        assert [m.queue_offset for m in result.messages] == list(range(60, 100))
        assert [m.body for m in result.messages] == [bytes([n]) * 40 for n in range(60, 100)]


async def test_a_restore_after_retention_starts_at_the_oldest_record_the_consume_queue_names(
    tmp_path: Path, migrated_metadata_url: str
) -> None:
    config = make_config(
        tmp_path,
        metadata_url=migrated_metadata_url,
        segments=SIZED_SEGMENTS,
    )
    async with AsyncTieredMessageStore.open(config, hot=False, owns_cold=True) as store:
        runtime = store.runtime
        await asyncio.to_thread(runtime.metadata.get_or_create_topic, "TopicA", reserve_hours=24)
        records = [make_record("TopicA", 0, n, store_timestamp=_stamp(n), body=bytes([n]) * 40) for n in range(100)]
        flat = await append_records(runtime, "TopicA", 0, records, commit_every=10, index=False)
        await apply_retention(runtime, now_ms=NOW)
        # the commit log still starts before offset 60's record: a batch read there finds offset 40 or so
        assert flat.commit_log.min_offset < (await flat.read_units(60, 1))[0].commitlog_offset
    async with open_read_node(config) as node:
        sink = HotStoreSink(tmp_path / "restored", node)
        try:
            summary = await restore_archive(node, RestoreRequest("TopicA", batch_messages=16), sink)
        finally:
            sink.close()
    assert summary.messages == 40
    with LocalMessageStore(tmp_path / "restored", read_only=True) as hot:
        restored = hot.read_messages("TopicA", 0, 60, 100, 1 << 20)
        assert [m.queue_offset for m in restored] == list(range(60, 100))
        assert [decode(m.raw).body for m in restored] == [bytes([n]) * 40 for n in range(60, 100)]


async def test_a_dry_run_counts_an_expired_index_file_that_is_still_being_filled(tmp_path: Path) -> None:
    # The catalogue has no time range for a file until it is sealed: the dry run reads the file's header.
    config = make_config(tmp_path)
    async with open_runtime(config, hot=False) as runtime:
        old = [make_record("Old", 0, n, store_timestamp=NOW - 100 * HOUR_MS, keys=(f"o{n}",)) for n in range(5)]
        await append_records(runtime, "Old", 0, old)
        [current] = runtime.index.files()
        assert current.status is IndexFileStatus.UNSEALED
        assert runtime.metadata.list_index_files()[0].end_timestamp is None
        assert (await plan_retention(config, now_ms=NOW)).index_files == [current.file_id]
        assert (await apply_retention(runtime, now_ms=NOW)).index_files == [current.file_id]
        assert runtime.index.files() == []
