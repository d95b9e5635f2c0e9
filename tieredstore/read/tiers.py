"""One call's read from one tier: the hot store's records, or cold windows through the read-ahead cache."""

from __future__ import annotations

import asyncio

from tieredstore.flat.cold_reader import ColdQueueReader
from tieredstore.flat.served import ReadAheadBatch
from tieredstore.local.hot_reader import HotReader
from tieredstore.read.cache import ReadAheadCache
from tieredstore.read.checks import serve, serve_filtered
from tieredstore.read.results import FetchedMessage, MessageFilter, ReadBatch, window_messages


async def read_hot(
    hot: HotReader,
    topic: str,
    queue_id: int,
    offset: int,
    scan_end: int,
    max_count: int,
    message_filter: MessageFilter | None,
    max_bytes: int,
) -> ReadBatch:
    """Up to ``max_count`` messages from ``offset`` through ``message_filter``, scanning no further than
    ``scan_end``, each checked as it is served; ``max_bytes`` bounds each read of the hot store."""
    messages: list[FetchedMessage] = []
    position = offset
    while position < scan_end and len(messages) < max_count:
        wanted = max_count - len(messages) if message_filter is None else scan_end - position
        stored = await asyncio.to_thread(
            hot.read_messages, topic, queue_id, position, min(wanted, scan_end - position), max_bytes
        )
        if not stored:
            break
        for item in stored:
            position = item.queue_offset + 1
            message = serve(topic, queue_id, item.queue_offset, item.raw, item.unit, "hot", message_filter)
            if message is not None:
                messages.append(message)
                if len(messages) == max_count:
                    break
    return ReadBatch(messages, position)


async def read_cold(
    reader: ColdQueueReader,
    cache: ReadAheadCache,
    offset: int,
    scan_end: int,
    run_end: int,
    max_count: int,
    message_filter: MessageFilter | None,
    *,
    read_ahead: bool,
) -> ReadBatch:
    """Up to ``max_count`` messages from ``offset`` through ``message_filter``, scanning no further than
    ``scan_end``: from the cache where it holds them, else from windows ``reader`` reads (``read_ahead``:
    through the cache, with windows read ahead)."""
    topic, queue_id = reader.key
    messages: list[FetchedMessage] = []
    position = offset
    window: ReadAheadBatch | None = None
    while position < scan_end and len(messages) < max_count:
        needed = max_count - len(messages)
        limit = min(needed if message_filter is None else scan_end - position, scan_end - position)
        run = cache.get_run(topic, queue_id, position, limit) if read_ahead else []
        if not run:
            batch = await reader.window(position, scan_end, needed, run_end, use_cache=read_ahead)
            if batch is None:
                break
            run = [(batch, position, min(batch.end_offset, position + limit))]
        for batch, begin, end in run:
            if message_filter is None:
                messages += window_messages(batch, begin, end)
                position = end
                window = batch if read_ahead else None
            else:
                for queue_offset in range(begin, end):
                    position = queue_offset + 1
                    message = serve_filtered(batch, queue_offset, message_filter)
                    if message is not None:
                        messages.append(message)
                        if len(messages) == max_count:
                            break
            if position == batch.end_offset:
                cache.read_through(batch)
            if len(messages) == max_count:
                break
    return ReadBatch(messages, position, window)
