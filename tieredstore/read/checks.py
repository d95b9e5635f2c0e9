"""Serving a record: its check and the consumer's filter, on the hot tier's records and on cold windows.

The record check itself (``check_window``, ``verify_served``) lives with the cold reader in
``tieredstore.flat.served``, the layer below, so that every reader of either tier calls the same one.
"""

from __future__ import annotations

from tieredstore.flat.served import ReadAheadBatch, Tier, check_record, check_window, parse_units, verify_served
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import decode
from tieredstore.read.results import FetchedMessage, MessageFilter

__all__ = ["check_record", "check_window", "parse_units", "serve", "serve_filtered", "verify_served"]


def serve_filtered(batch: ReadAheadBatch, queue_offset: int, message_filter: MessageFilter) -> FetchedMessage | None:
    """A cold record through ``message_filter`` (tag hash first); its check happened when it was read."""
    tag_hashes = batch.tag_hashes
    if tag_hashes is not None and not message_filter.may_match(tag_hashes[queue_offset - batch.first_offset]):
        return None
    batch.raise_if_corrupt(queue_offset, queue_offset + 1)
    raw = batch.raw(queue_offset)
    record = decode(raw, check_crc=False)
    if not message_filter.matches(record):
        return None
    return FetchedMessage(batch.topic, batch.queue_id, queue_offset, "cold", raw, record)


def serve(
    topic: str,
    queue_id: int,
    queue_offset: int,
    raw: bytes,
    unit: ConsumeQueueUnit,
    tier: Tier,
    message_filter: MessageFilter | None,
) -> FetchedMessage | None:
    """The checked message, or None when the filter rejects it (on its tag hash before decoding).

    Without a filter the record is not decoded here: ``FetchedMessage.record`` does it on first access.
    """
    if message_filter is not None and not message_filter.may_match(unit.tag_hash):
        return None
    verify_served(topic, queue_id, queue_offset, raw, unit, tier)
    if message_filter is None:
        return FetchedMessage(topic, queue_id, queue_offset, tier, raw)
    record = decode(raw, check_crc=False)
    if not message_filter.matches(record):
        return None
    return FetchedMessage(topic, queue_id, queue_offset, tier, raw, record)
