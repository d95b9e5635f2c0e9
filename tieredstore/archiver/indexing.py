"""The archiver's key-index entries: found in a batch as it is read, and written again for what recovery found."""

from __future__ import annotations

import asyncio

from tieredstore.flat.message_file import RecoveryResult
from tieredstore.formats.message import PROPERTY_KEYS, PROPERTY_UNIQ_KEY, index_keys_of
from tieredstore.index import IndexEntry, IndexService
from tieredstore.local.batch import HotBatch
from tieredstore.local.hot_reader import HotReader
from tieredstore.metrics import Metrics

# A record can only carry keys if these bytes occur in it; the search is much cheaper than a decode.
_KEY_MARKERS = (f"{PROPERTY_KEYS}\x01".encode(), f"{PROPERTY_UNIQ_KEY}\x01".encode())
# How many messages one re-indexing read takes from the hot store.
_REINDEX_BATCH = 1024


def index_entries(topic: str, topic_id: int, queue_id: int, records: HotBatch) -> list[IndexEntry]:
    """Key-index entries of the records that carry keys; only records holding a key marker are decoded."""
    entries = []
    for index in records.records_holding(_KEY_MARKERS):
        raw = records.record(index)
        keys = index_keys_of(raw)
        if keys:
            entries.append(
                IndexEntry(
                    topic=topic,
                    topic_id=topic_id,
                    queue_id=queue_id,
                    queue_offset=records.first_offset + index,
                    size=len(raw),
                    timestamp=int(records.store_timestamps[index]),
                    keys=keys,
                )
            )
    return entries


def needs_reindex(result: RecoveryResult | None) -> bool:
    """Whether recovery found messages archived that metadata had not recorded: their entries may be missing."""
    return result is not None and result.archived_offset > result.previous_archived_offset


async def reindex(
    hot: HotReader,
    index: IndexService,
    metrics: Metrics,
    queue: tuple[str, int, int],
    result: RecoveryResult,
) -> None:
    """Index the keys of what recovery found archived but unrecorded (``queue`` is topic, topic id, queue id).

    A crash between the consume-queue commit and the metadata record leaves messages archived whose
    key-index entries may never have been written; indexing them again is harmless (lookups
    de-duplicate by queue offset).
    """
    topic, topic_id, queue_id = queue
    end = result.archived_offset
    hot_min = await asyncio.to_thread(hot.min_offset, topic, queue_id)
    offset = max(result.previous_archived_offset, hot_min)
    while offset < end:
        batch = await asyncio.to_thread(hot.read_batch, topic, queue_id, offset, min(_REINDEX_BATCH, end - offset))
        if not len(batch):
            return
        metrics.index_items.inc(await index.put(index_entries(topic, topic_id, queue_id, batch)))
        offset = batch.next_offset
