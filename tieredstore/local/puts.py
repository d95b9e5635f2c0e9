"""Puts into a LocalMessageStore: messages validated, laid out as records and appended with their units."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import structlog

from tieredstore.basics import check_queue_id, now_ms
from tieredstore.errors import InvalidPropertyError, MessageTooLargeError, ValidationError
from tieredstore.formats.checksum import body_crc
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    RecordLayout,
    encode_properties,
    tag_hash,
)
from tieredstore.formats.naming import validate_topic
from tieredstore.local.index_file import KeyEntry, put_index_keys
from tieredstore.local.queue import ConsumeQueue
from tieredstore.local.results import PutRequest, PutResult
from tieredstore.local.store_state import StoreState

log = structlog.get_logger(__name__)

# A batched put that passed validation: topic, queue id, the topic's layout, body, record tail, tag hash,
# record size, body CRC and the keys it is indexed by.
_Batched = tuple[str, int, RecordLayout, bytes, bytes, int, int, int, tuple[str, ...]]


class StorePuts(StoreState):
    """The producer API: ``put_message`` and ``put_messages``, all or nothing per call."""

    def put_message(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        keys: Sequence[str] = (),
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> PutResult:
        """Append one message; under sync flush it returns only once the message is on disk."""
        layout = self._layouts.get(topic) if type(topic) is str else None
        # The common case is checked inline (a known topic, an int queue id in range, bytes within the
        # size limit, no properties); anything else gets every rule, and its error, from _validated.
        if (
            layout is None
            or type(queue_id) is not int
            or type(body) is not bytes
            or keys
            or tags is not None
            or properties
            or not 0 <= queue_id < self._max_queues
            or len(body) > self._max_message_size
        ):
            layout, body, tail, tag_code = self._validated(topic, queue_id, body, keys, tags, properties)
            index_keys = put_index_keys(keys, properties)
        else:
            tail, tag_code, index_keys = layout.empty_tail, 0, ()
        result = self._append(topic, queue_id, layout, body, tail, tag_code, index_keys)
        if self._sync_flusher is not None:
            self._sync_flusher.wait_durable(result.commitlog_offset + result.size)
        return result

    def put_messages(self, requests: Iterable[PutRequest]) -> list[PutResult]:
        """Append a batch atomically with respect to validation and the disk guard: all or nothing."""
        layouts, max_queues, max_size = self._layouts, self._max_queues, self._max_message_size
        batch: list[_Batched] = []
        total = 0
        for topic, queue_id, body, keys, tags, properties in requests:
            layout = layouts.get(topic) if type(topic) is str else None
            # As in put_message: the common case inline, anything else through every rule.
            if (
                layout is None
                or type(queue_id) is not int
                or type(body) is not bytes
                or keys
                or tags is not None
                or properties
                or not 0 <= queue_id < max_queues
                or len(body) > max_size
            ):
                layout, body, tail, tag_code = self._validated(topic, queue_id, body, keys, tags, properties)
                index_keys = put_index_keys(keys, properties)
            else:
                tail, tag_code, index_keys = layout.empty_tail, 0, ()
            size = layout.fixed_size + len(body) + len(tail)
            total += size
            batch.append((topic, queue_id, layout, body, tail, tag_code, size, body_crc(body), index_keys))
        if not batch:
            return []
        results = self._append_batch(batch, total)
        if self._sync_flusher is not None:
            last = results[-1]
            self._sync_flusher.wait_durable(last.commitlog_offset + last.size)
        return results

    def _validated(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        keys: Sequence[str],
        tags: str | None,
        properties: Mapping[str, str] | None,
    ) -> tuple[RecordLayout, bytes, bytes, int]:
        """Check one message against every rule: (layout of its topic, body, record tail, tag hash)."""
        layout = self._layouts.get(topic) if type(topic) is str else None
        if layout is None:
            layout = self._layout_for(topic)
        if type(queue_id) is not int or not 0 <= queue_id < self._max_queues:
            check_queue_id(queue_id, self._max_queues)
        if type(body) is not bytes:
            if not isinstance(body, bytes | bytearray | memoryview):
                raise ValidationError(f"message body must be bytes, not {type(body).__name__}")
            body = bytes(body)
        if len(body) > self._max_message_size:
            raise MessageTooLargeError(
                f"message body is {len(body)} bytes; max_message_size is {self._max_message_size}"
            )
        if not keys and tags is None and not properties:
            return layout, body, layout.empty_tail, 0
        properties_raw, tags_value = _encode_message_properties(keys, tags, properties)
        return layout, body, layout.tail(properties_raw), tag_hash(tags_value)

    def _layout_for(self, topic: str) -> RecordLayout:
        validate_topic(topic)
        topic_raw = topic.encode("ascii")
        layout = RecordLayout(topic_raw, born_host=self._store_host, store_host=self._store_host)
        if type(topic) is str:
            self._layouts[topic] = layout
        return layout

    def _append(
        self,
        topic: str,
        queue_id: int,
        layout: RecordLayout,
        body: bytes,
        tail: bytes,
        tag_code: int,
        index_keys: tuple[str, ...],
    ) -> PutResult:
        """Write one validated record and its unit under the put lock; the common case touches no file metadata."""
        body_size = len(body)
        size = layout.fixed_size + body_size + len(tail)
        crc = body_crc(body)
        now = now_ms()
        log_ = self._commit_log
        with self._put_lock:
            if self._put_refusal is not None:
                raise ValidationError(self._put_refusal)
            if self._disk_cap is not None or not self._disk_checked_ms <= now < self._disk_ok_until:
                self._check_disk(size + UNIT_SIZE, now)
            queue = self._queues.get((topic, queue_id)) or self._queue(topic, queue_id)
            offset = log_.write_offset
            if (
                log_.tail_start <= offset
                and offset + size <= log_.tail_limit
                and (queue.max_offset + 1) * UNIT_SIZE <= queue.ready_upto
            ):
                buffer = log_.tail_buffer
                position = offset - log_.tail_start
            else:
                offset = self._make_room([size], {queue: 1})[0]
                file = log_.file_for(offset)
                assert file is not None
                buffer, position = file.buffer, offset - file.start_offset
            store_timestamp = self._last_store_timestamp
            if now > store_timestamp:
                store_timestamp = self._last_store_timestamp = now
            layout.fixed.pack_into(
                buffer, position, size, layout.magic, crc, queue_id, 0, queue.max_offset, offset,
                layout.sysflag, now, layout.born_raw, store_timestamp, layout.store_raw, 0, 0, body_size,
            )  # fmt: skip
            body_at = position + layout.fixed_size
            buffer[body_at : body_at + body_size] = body
            buffer[body_at + body_size : position + size] = tail
            end = offset + size
            # Publish the record before the unit that points at it: a reader holding a unit can read it.
            log_.write_offset = end
            queue_offset = queue.append_unit(offset, size, tag_code)
            if index_keys:
                # Before the dispatched offset moves: a flush that covers the record covers its keys.
                self._pending_keys.append((topic, index_keys, offset, store_timestamp))
            self._dispatched_offset = end
            self._unit_count += 1
        return PutResult(topic, queue_id, queue_offset, offset, size, store_timestamp)

    def _append_batch(self, batch: list[_Batched], total: int) -> list[PutResult]:
        """Write validated records of ``total`` bytes and their units under one put lock, reserving room once."""
        now = now_ms()
        log_ = self._commit_log
        with self._put_lock:
            if self._put_refusal is not None:
                raise ValidationError(self._put_refusal)
            if self._disk_cap is not None or not self._disk_checked_ms <= now < self._disk_ok_until:
                self._check_disk(total + UNIT_SIZE * len(batch), now)
            queues = self._queues
            targets = [queues.get((item[0], item[1])) or self._queue(item[0], item[1]) for item in batch]
            per_queue = Counter(targets)
            offset = log_.write_offset
            contiguous = (
                log_.tail_start <= offset
                and offset + total <= log_.tail_limit
                and all(queue.room_for(count) for queue, count in per_queue.items())
            )
            positions = None if contiguous else self._make_room([item[6] for item in batch], per_queue)
            store_timestamp = self._last_store_timestamp
            if now > store_timestamp:
                store_timestamp = self._last_store_timestamp = now
            units: dict[ConsumeQueue, list[tuple[int, int, int]]] = {queue: [] for queue in per_queue}
            results: list[PutResult] = []
            parts: list[bytes] = []
            keyed: list[KeyEntry] = []
            record_offset = offset
            for (topic, queue_id, layout, body, tail, tag_code, size, crc, index_keys), queue in zip(
                batch, targets, strict=True
            ):
                if positions is not None:
                    record_offset = positions[len(results)]
                queue_units = units[queue]
                queue_offset = queue.max_offset + len(queue_units)
                queue_units.append((record_offset, size, tag_code))
                header = layout.fixed.pack(
                    size, layout.magic, crc, queue_id, 0, queue_offset, record_offset, layout.sysflag, now,
                    layout.born_raw, store_timestamp, layout.store_raw, 0, 0, len(body),
                )  # fmt: skip
                if positions is None:
                    parts += (header, body, tail)
                else:
                    log_.write(record_offset, b"".join((header, body, tail)))
                results.append(PutResult(topic, queue_id, queue_offset, record_offset, size, store_timestamp))
                if index_keys:
                    keyed.append((topic, index_keys, record_offset, store_timestamp))
                record_offset += size
            if positions is None:
                position = offset - log_.tail_start
                log_.tail_buffer[position : position + total] = b"".join(parts)
            end = results[-1].commitlog_offset + results[-1].size
            # As in _append: records are published before the units that point at them.
            log_.write_offset = end
            for queue, queue_units in units.items():
                queue.append_units(queue_units)
            if keyed:
                self._pending_keys += keyed
            self._dispatched_offset = end
            self._unit_count += len(batch)
        return results

    def _make_room(self, sizes: list[int], per_queue: Mapping[ConsumeQueue, int]) -> list[int]:
        """Create and reserve every file the records and units need, then write the blanks; their offsets.

        All reservations come before any byte is written, so a StoreFullError leaves the data untouched.
        """
        log_ = self._commit_log
        plan = log_.plan(sizes)
        log_.prepare(plan)
        for queue, count in per_queue.items():
            queue.prepare(count)
        for blank_offset, blank_size in plan.blanks:
            log_.write_blank(blank_offset, blank_size)
        return plan.positions


def _encode_message_properties(
    keys: Sequence[str], tags: str | None, properties: Mapping[str, str] | None
) -> tuple[bytes, str | None]:
    """The PROPERTIES bytes of a put and its TAGS value; every rule broken is an InvalidPropertyError."""
    if not keys and tags is None and not properties:
        return b"", None
    merged: dict[str, str] = {}
    for name, value in (properties or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidPropertyError(f"property names and values must be strings, not {name!r}: {value!r}")
        if not name:
            raise InvalidPropertyError("a property name must not be empty")
        merged[name] = value
    if isinstance(keys, str):
        keys = [keys]
    if keys:
        if PROPERTY_KEYS in merged:
            raise InvalidPropertyError("message keys were given both as keys= and as property KEYS")
        for key in keys:
            if not isinstance(key, str) or not key or " " in key:
                raise InvalidPropertyError(
                    f"message key {key!r} must be a non-empty string without spaces (KEYS is space separated)"
                )
            if NAME_VALUE_SEPARATOR in key or PROPERTY_SEPARATOR in key:
                raise InvalidPropertyError(f"message key {key!r} contains a separator byte (0x01 or 0x02)")
        merged[PROPERTY_KEYS] = " ".join(keys)
    if tags is not None:
        if PROPERTY_TAGS in merged:
            raise InvalidPropertyError("tags were given both as tags= and as property TAGS")
        if not isinstance(tags, str) or not tags:
            raise InvalidPropertyError(f"tags must be a non-empty string, not {tags!r}")
        merged[PROPERTY_TAGS] = tags
    return encode_properties(merged), merged.get(PROPERTY_TAGS)
