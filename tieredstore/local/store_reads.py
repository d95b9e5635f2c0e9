"""The read API of LocalMessageStore: offsets, units, records, batches, timestamps and key lookups."""

from __future__ import annotations

import structlog

from tieredstore.errors import NotFoundError
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import store_timestamp_of
from tieredstore.formats.naming import validate_topic
from tieredstore.local.batch import HotBatch, SharedWindow, parse_units, read_written
from tieredstore.local.index_file import KeyedRecord, find_records, whole_record
from tieredstore.local.reading import (
    TIMESTAMP_PREFIX,
    Boundary,
    StoredMessage,
    UnitReads,
    check_boundary,
    check_unit_record,
    found_record,
    offset_msg_id,
    timestamp_offset,
)
from tieredstore.local.store_state import StoreState

log = structlog.get_logger(__name__)


class StoreReads(UnitReads, StoreState):
    """Reads of the store this process opened; every one is also part of ``HotReader``."""

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) that holds or held messages, sorted."""
        return sorted(key for key, q in list(self._queues.items()) if q.max_offset > 0)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset still in the hot store (0 for a queue never written)."""
        queue = self._existing_queue(topic, queue_id)
        return queue.min_offset if queue else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The offset the next message of this queue will get (0 for a queue never written)."""
        queue = self._existing_queue(topic, queue_id)
        return queue.max_offset if queue else 0

    def durable_max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last message whose record is flushed (0 for a queue never written): what a machine
        crash cannot take back, so all the archiver may take (see ``tieredstore.local.durable``)."""
        queue = self._existing_queue(topic, queue_id)
        if queue is None:
            return 0
        return queue.durable_end.find(
            self._commit_log.flushed_offset, queue.min_offset, queue.max_offset, queue.commitlog_position_at
        )

    def flush_queue(self, topic: str, queue_id: int) -> int:
        """Make the queue's messages written so far durable now; returns its ``durable_max_offset``.

        One commit-log sync up to the queue's last record, shared with sync puts and other callers (group
        commit). Its consume queue and the checkpoint wait for the periodic flush: recovery rebuilds the
        units past the checkpoint from the commit log, so a crash does not need them.
        """
        queue = self._existing_queue(topic, queue_id)
        if queue is None:
            return 0
        end = queue.max_offset
        if self._flusher is not None and end > queue.min_offset:
            offset, size = queue.commitlog_position_at(end - 1)
            if self._commit_log.flushed_offset < offset + size:
                self._flusher.wait_durable(offset + size)
        return self.durable_max_offset(topic, queue_id)

    @property
    def commitlog_min_offset(self) -> int:
        return self._commit_log.min_offset

    @property
    def commitlog_max_offset(self) -> int:
        """End of the valid commit-log data: the offset the next record is written at (or its file's start)."""
        return self._commit_log.write_offset

    @property
    def commitlog_flushed_offset(self) -> int:
        return self._commit_log.flushed_offset

    def release_pages(self, below: int) -> int:
        """Unmap this process's pages of the commit log below ``below``: a reader that is done with
        those bytes (the archiver, below every queue's next unread record) tells the kernel so.

        The bytes stay on disk and in the page cache, and a later read maps them again; without this a
        process that reads the whole hot store once keeps every page of it in its RSS (as mapped file
        pages) until the files are deleted. Only flushed bytes are released here. Returns the bytes
        newly released.
        """
        return self._commit_log.release_pages_below(min(below, self._commit_log.flushed_offset))

    def cq_unit(self, topic: str, queue_id: int, queue_offset: int) -> ConsumeQueueUnit:
        """The consume-queue unit at ``queue_offset``; NotFoundError outside [min_offset, max_offset)."""
        return self._require_queue(topic, queue_id).unit_at(queue_offset)

    def read_record(self, unit: ConsumeQueueUnit) -> bytes:
        """The record bytes a unit points at, checked to be a whole record of the unit's size."""
        return check_unit_record(self._commit_log.read(unit.commitlog_offset, unit.size), unit)

    def read_messages(
        self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32, max_bytes: int = 4 << 20
    ) -> list[StoredMessage]:
        """Consecutive messages from ``queue_offset``: at most ``max_count``, and stopping before ``max_bytes``
        except that the first message is always returned, however large.

        An offset at or past max_offset gives an empty list; one below min_offset is a NotFoundError.
        """
        queue = self._existing_queue(topic, queue_id)
        if queue is None:
            return []
        if queue_offset < queue.min_offset:
            raise NotFoundError(
                f"offset {queue_offset} of {topic}/{queue_id} is below the hot store's min offset {queue.min_offset}"
            )
        messages: list[StoredMessage] = []
        total = 0
        for offset, unit in queue.units(queue_offset, max_count):
            if messages and total + unit.size > max_bytes:
                break
            messages.append(StoredMessage(offset, self.read_record(unit), unit))
            total += unit.size
        return messages

    def read_batch(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int = 32,
        max_bytes: int = 4 << 20,
        *,
        unmap: bool = False,
        window: SharedWindow | None = None,
    ) -> HotBatch:
        """The messages ``read_messages`` gives, as one HotBatch: records joined in one buffer, units in
        one array, checked all at once (see ``tieredstore.local.batch``).

        ``unmap`` is for a reader that reads each record once: the (flushed) commit-log pages the batch
        was copied from are unmapped from this process as the copy goes, so reading a queue among many
        does not map the whole stretch of commit log its records are spread over. ``window`` is for
        readers of many queues that read each record once (the archiver): the pages stay mapped for the
        next queue's batch within the shared window, and only what falls out of it is unmapped as the
        copy goes (``SharedWindow``).
        """
        queue = self._existing_queue(topic, queue_id)
        if queue is None:
            return HotBatch.empty(topic, queue_id, queue_offset)
        if queue_offset < queue.min_offset:
            raise NotFoundError(
                f"offset {queue_offset} of {topic}/{queue_id} is below the hot store's min offset {queue.min_offset}"
            )
        units = parse_units(queue.unit_bytes(queue_offset, max_count), max_bytes)
        return read_written(self._commit_log, topic, queue_id, queue_offset, units, unmap=unmap, window=window)

    def _store_timestamp_of(self, unit: ConsumeQueueUnit) -> int:
        head = self._commit_log.read(unit.commitlog_offset, min(unit.size, TIMESTAMP_PREFIX))
        return store_timestamp_of(head)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int, boundary: Boundary = "lower") -> int:
        """``lower``: the first offset stored at or after ``timestamp`` (max_offset if none);
        ``upper``: the last offset stored at or before it (min_offset if none). Store timestamps never decrease.
        """
        check_boundary(boundary)
        return timestamp_offset(
            self._existing_queue(topic, queue_id),
            timestamp,
            boundary,
            lambda queue, offset: self._store_timestamp_of(queue.unit_at(offset)),
        )

    def query_keys(
        self, topic: str, key: str, max_count: int = 32, begin_timestamp: int = 0, end_timestamp: int = (1 << 63) - 1
    ) -> list[KeyedRecord]:
        """Messages still in the hot store whose KEYS or UNIQ_KEY include ``key``, stored in [begin, end],
        newest first, at most ``max_count``; found through the key index under ``index/``."""
        validate_topic(topic)
        if not self.read_only:
            self._index_pending()  # the keys of every put that returned are found at once
        return find_records(self._key_index, topic, key, max_count, begin_timestamp, end_timestamp, self._record_at)

    def record_at(self, commitlog_offset: int) -> bytes:
        """The whole record starting at ``commitlog_offset``, in whichever commit-log file holds it (its header
        gives its size); NotFoundError when no record of the hot store starts there."""
        return found_record(self._record_at(commitlog_offset), commitlog_offset)

    def _record_at(self, commitlog_offset: int) -> bytes | None:
        """The whole record starting at ``commitlog_offset``; None when no record of the hot store is there."""
        return whole_record(self._read_or_none, commitlog_offset)

    def _read_or_none(self, offset: int, size: int) -> bytes | None:
        try:
            return self._commit_log.read(offset, size)
        except NotFoundError:
            return None

    def offset_msg_id(self, commitlog_offset: int) -> str:
        """RocketMQ's offset message id of a record this store wrote."""
        return offset_msg_id(self._store_host, commitlog_offset)
