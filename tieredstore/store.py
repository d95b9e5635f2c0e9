"""TieredMessageStore: the facade applications use to put messages and read them back from either tier.

``AsyncTieredMessageStore`` is the core (one event loop; blocking hot-store and database calls go
through worker threads). ``TieredMessageStore`` is the explicit synchronous wrapper for scripts: it
owns one ``asyncio.Runner`` and runs every call on it, in the calling thread — there is no hidden
loop thread, so it must not be used from inside a running event loop (use the async class there).

Both open their parts through ``tieredstore.runtime.open_runtime``. The archiver (``tieredstore.dispatcher``)
runs either in the same process as the facade (pass it ``store.runtime``) or as its own process
(``tieredstore run``), which then follows the hot store read-only; the facade, as the hot store's
writer, deletes archived hot files: ``delete_expired_hot`` or ``hot_retention_interval``.

Opened without its hot store (``hot=False``) the facade is a cold-only reader, usually beside an
archiver in another process that owns the cold queues: it never recovers them (recovery truncates
bytes that archiver may be about to record) and reads each queue through a read-only view that it
refreshes from metadata to see later commits (``MessageFetcher(read_only_cold=True)``).

Key lookups answer from both tiers: the hot store's own index (RocketMQ's IndexFile, written as
messages are put) and the cold key index the archiver builds after each commit.
"""

from __future__ import annotations

import asyncio
import binascii
import struct
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Literal, TypeVar

import structlog

from tieredstore.basics import Boundary
from tieredstore.config import ReadPolicy, TieredStoreConfig
from tieredstore.errors import CorruptRecordError, NotFoundError, TieredStoreError, ValidationError
from tieredstore.fetcher import (
    FetchedMessage,
    GetMessageResult,
    MessageFetcher,
    MessageFilter,
    check_record,
)
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import MIN_RECORD_SIZE, decode
from tieredstore.formats.naming import validate_topic
from tieredstore.index.service import newest_first
from tieredstore.local.hot_reader import HotReader, hot_writer
from tieredstore.local.index_file import record_index_keys
from tieredstore.local.store import PutResult, RetentionReport
from tieredstore.metrics import Metrics
from tieredstore.runtime import Runtime, open_runtime
from tieredstore.topic_filter import TopicFilter

log = structlog.get_logger(__name__)
T = TypeVar("T")
MAX_TIMESTAMP = (1 << 63) - 1
_HEAD = struct.Struct(">iI")


class AsyncTieredMessageStore:
    """Puts to the hot store; reads, time lookups and key lookups over both tiers.

    Build it on an opened ``Runtime`` (the composition root), or with ``open(config)``, which opens
    and closes the runtime too. ``read_policy`` overrides ``config.read.read_policy``;
    ``hot_in_memory_bytes`` and ``cache_clock`` are passed to the MessageFetcher. Unless the runtime
    owns the cold side, it reads cold queues through read-only views, never through
    ``runtime.flat``'s recovered ones.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        read_policy: ReadPolicy | None = None,
        hot_in_memory_bytes: int | None = None,
        cache_clock: Callable[[], float] | None = None,
    ) -> None:
        self.runtime = runtime
        settings = runtime.config.read
        if read_policy is not None:
            settings = settings.model_copy(update={"read_policy": ReadPolicy(read_policy)})
        extra: dict[str, Any] = {} if cache_clock is None else {"cache_clock": cache_clock}
        self.fetcher = MessageFetcher(
            runtime.hot,
            runtime.flat,
            settings=settings,
            metrics=runtime.metrics,
            hot_in_memory_bytes=hot_in_memory_bytes,
            read_only_cold=not runtime.cold_owner,
            **extra,
        )

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        config: TieredStoreConfig,
        *,
        hot: bool = True,
        metrics: Metrics | None = None,
        read_policy: ReadPolicy | None = None,
        hot_in_memory_bytes: int | None = None,
        cache_clock: Callable[[], float] | None = None,
        hot_retention_interval: float | None = None,
        owns_cold: bool = False,
    ) -> AsyncIterator[AsyncTieredMessageStore]:
        """Open the runtime and a store on it; both close on exit.

        The store reads cold storage and never writes it: the archiver process owns the cold side, and
        recovery or key-index maintenance here would cut bytes it committed but has not recorded yet.
        ``owns_cold=True`` is for a process that archives in-process on ``store.runtime`` (tests, an
        embedded single-process setup): then cold queues are recovered at open and the index is writable.
        ``hot=False`` opens cold storage only.

        ``hot_retention_interval`` (seconds) runs ``delete_expired_hot`` that often in the background.
        """
        async with open_runtime(config, hot=hot, recover=owns_cold, cold_owner=owns_cold, metrics=metrics) as runtime:
            store = cls(
                runtime, read_policy=read_policy, hot_in_memory_bytes=hot_in_memory_bytes, cache_clock=cache_clock
            )
            retention = None
            if hot_retention_interval is not None:
                retention = asyncio.create_task(store._hot_retention_loop(hot_retention_interval))
            try:
                yield store
            finally:
                if retention is not None:
                    retention.cancel()
                    await asyncio.gather(retention, return_exceptions=True)
                await store.aclose()

    async def aclose(self) -> None:
        """Stop the reads it runs in the background (read-ahead prefetches); ``open`` does this on exit.

        A store built on a runtime it did not open calls this before that runtime closes.
        """
        await self.fetcher.close()

    @property
    def read_policy(self) -> ReadPolicy:
        return self.fetcher.read_policy

    def _hot(self) -> HotReader:
        if self.runtime.hot is None:
            raise ValidationError("this store was opened without its hot store (cold storage only)")
        return self.runtime.hot

    # ---- writes ---------------------------------------------------------------------------------------

    async def put_message(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        *,
        keys: Sequence[str] = (),
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> PutResult:
        """Append one message to the hot store; the archiver moves it to cold storage later."""
        hot = hot_writer(self._hot(), "puts")
        return await asyncio.to_thread(hot.put_message, topic, queue_id, body, keys, tags, properties)

    # ---- hot retention --------------------------------------------------------------------------------

    async def delete_expired_hot(self) -> RetentionReport:
        """Delete hot files older than ``hot_retention_hours`` whose messages the archiver has recorded.

        The archived offsets are read from metadata, so this works whether the archiver runs here or
        as its own process (which only follows the hot store and so cannot delete from it). Topics the
        archiver does not archive (``[archiver] topics_exclude``, system topics) wait for nothing.
        """
        hot = hot_writer(self._hot(), "hot retention deletes")
        config = self.runtime.config
        topics = TopicFilter.of(config.archiver, cluster=config.cluster, broker=config.broker)
        positions = await asyncio.to_thread(self.runtime.metadata.list_queues)
        archived = {(p.topic, p.queue_id): p.max_offset for p in positions}
        archived_offset = topics.for_hot_retention(lambda topic, queue_id: archived.get((topic, queue_id), 0))
        return await asyncio.to_thread(hot.delete_expired, archived_offset)

    async def _hot_retention_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.delete_expired_hot()
            except (TieredStoreError, OSError) as error:
                log.warning("hot retention failed; the next pass retries", error=str(error))

    # ---- reads ----------------------------------------------------------------------------------------

    async def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        filter: MessageFilter | None = None,
    ) -> GetMessageResult:
        """Up to ``max_count`` messages from ``offset`` (see ``tieredstore.fetcher`` for statuses and policy)."""
        return await self.fetcher.get_messages(topic, queue_id, offset, max_count, filter)

    async def get_min_offset(self, topic: str, queue_id: int) -> int:
        """The oldest offset either tier still holds (0 for an unknown queue)."""
        return await self.fetcher.min_offset(topic, queue_id)

    async def get_max_offset(self, topic: str, queue_id: int) -> int:
        """The offset the next message of the queue gets, over both tiers (0 for an unknown queue)."""
        return await self.fetcher.max_offset(topic, queue_id)

    async def offset_for_timestamp(
        self, topic: str, queue_id: int, timestamp: int, boundary: Boundary = "lower"
    ) -> int:
        """``lower``: first offset stored at or after ``timestamp``; ``upper``: last one at or before it."""
        return await self.fetcher.offset_for_timestamp(topic, queue_id, timestamp, boundary)

    async def query_by_key(
        self,
        topic: str,
        key: str,
        max_count: int = 32,
        begin_timestamp: int = 0,
        end_timestamp: int = MAX_TIMESTAMP,
    ) -> list[FetchedMessage]:
        """Messages of ``topic`` whose KEYS or UNIQ_KEY include ``key``, stored in [begin, end], from either tier.

        At most ``max_count``, newest first, each message once (a message archived and still hot too).
        Every index hit is confirmed against the message's real keys, so a hash collision never
        returns another key's message.
        """
        validate_topic(topic)
        if not isinstance(key, str) or not key:
            raise ValidationError(f"key must be a non-empty string, not {key!r}")
        if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
            raise ValidationError(f"max_count must be a positive integer, not {max_count!r}")
        if begin_timestamp > end_timestamp:
            raise ValidationError(f"begin timestamp {begin_timestamp} is after end timestamp {end_timestamp}")
        found: dict[tuple[int, int], FetchedMessage] = {}
        if self.runtime.hot is not None:
            hot = await asyncio.to_thread(
                self.runtime.hot.query_keys, topic, key, max_count, begin_timestamp, end_timestamp
            )
            for record in hot:
                found[(record.queue_id, record.queue_offset)] = FetchedMessage(
                    topic, record.queue_id, record.queue_offset, "hot", record.raw, record.record
                )
        try:
            topic_info = await asyncio.to_thread(self.runtime.metadata.get_topic, topic)
        except NotFoundError:
            return newest_first(found.values(), max_count)  # never archived: only the hot store holds it
        read: dict[tuple[int, int], FetchedMessage] = {}

        async def confirm(topic_id: int, queue_id: int, queue_offset: int) -> Sequence[str]:
            if topic_id != topic_info.id:
                return []
            message = found.get((queue_id, queue_offset))
            if message is None:
                message = await self.fetcher.read_message(topic, queue_id, queue_offset)
            if message is None:
                return []  # removed by retention since it was indexed
            read[(queue_id, queue_offset)] = message
            return real_keys(message)

        hits = await self.runtime.keys.query(
            topic, topic_info.id, key, max_count, begin_timestamp, end_timestamp, confirm
        )
        for hit in hits:
            found.setdefault((hit.queue_id, hit.queue_offset), read[(hit.queue_id, hit.queue_offset)])
        return newest_first(found.values(), max_count)

    async def look_message_by_offset(
        self, offset: int | str, *, topic: str | None = None, queue_id: int | None = None
    ) -> FetchedMessage:
        """The message at a commit-log offset, or named by an offset message id (store host + offset).

        Without ``topic``/``queue_id`` the offset is in the hot store's commit log (what ``put_message``
        returned); with them it is in that queue's cold commit log (what a cold-served record's
        PHYSICALOFFSET and offset message id say). NotFoundError when it is not there.
        """
        commitlog_offset, host_hex = self._parse_offset(offset)
        if (topic is None) != (queue_id is None):
            raise ValidationError("give both topic and queue_id for a cold commit-log offset, or neither")
        if topic is not None and queue_id is not None:
            return await self._look_cold(commitlog_offset, host_hex, topic, queue_id)
        return await asyncio.to_thread(self._look_hot, commitlog_offset, host_hex)

    @staticmethod
    def _parse_offset(offset: int | str) -> tuple[int, str | None]:
        if isinstance(offset, bool):
            raise ValidationError(f"a commit-log offset or message id is needed, not {offset!r}")
        if isinstance(offset, int):
            if offset < 0:
                raise ValidationError(f"commit-log offset {offset} must not be negative")
            return offset, None
        try:
            raw = binascii.unhexlify(offset)
        except (binascii.Error, ValueError) as exc:
            raise ValidationError(f"{offset!r} is not an offset message id (hex)") from exc
        if len(raw) not in (16, 28):
            raise ValidationError(f"an offset message id is 32 or 56 hex digits, not {len(offset)}")
        (commitlog_offset,) = struct.unpack(">q", raw[-8:])
        if commitlog_offset < 0:
            raise ValidationError(f"message id {offset} names a negative offset")
        return int(commitlog_offset), raw[:-8].hex().upper()

    def _look_hot(self, commitlog_offset: int, host_hex: str | None) -> FetchedMessage:
        hot = self._hot()
        if host_hex is not None:
            ours = hot.offset_msg_id(0)[:-16]
            if host_hex != ours:
                raise NotFoundError(f"the message id names store host {host_hex}; this store is {ours}")
        if not hot.commitlog_min_offset <= commitlog_offset < hot.commitlog_max_offset:
            raise NotFoundError(
                f"commit-log offset {commitlog_offset} is outside the hot store "
                f"[{hot.commitlog_min_offset}, {hot.commitlog_max_offset}); an archived message is found by "
                "its key, its queue offset, or its cold commit-log offset with topic and queue_id"
            )
        raw = hot.record_at(commitlog_offset)
        return _checked_at_offset(raw, ConsumeQueueUnit(commitlog_offset, len(raw), 0), "hot")

    async def _look_cold(
        self, commitlog_offset: int, host_hex: str | None, topic: str, queue_id: int
    ) -> FetchedMessage:
        flat_file = await self.fetcher.cold_file(topic, queue_id)
        if flat_file is None:
            raise NotFoundError(f"cold storage has no queue {topic}/{queue_id}")
        commit_log = flat_file.commit_log
        if not commit_log.min_offset <= commitlog_offset < commit_log.commit_offset:
            raise NotFoundError(
                f"commit-log offset {commitlog_offset} is outside the cold commit log of {topic}/{queue_id} "
                f"[{commit_log.min_offset}, {commit_log.commit_offset})"
            )
        head = await commit_log.record_head(commitlog_offset)
        size, _magic = _HEAD.unpack_from(head)
        if size < MIN_RECORD_SIZE or commitlog_offset + size > commit_log.commit_offset:
            raise NotFoundError(f"no record starts at cold commit-log offset {commitlog_offset} of {topic}/{queue_id}")
        raw = await flat_file.read_commit_log(commitlog_offset, size)
        message = _checked_at_offset(raw, ConsumeQueueUnit(commitlog_offset, size, 0), "cold", topic, queue_id)
        if host_hex is not None and message.record.offset_msg_id[: len(host_hex)] != host_hex:
            raise NotFoundError(f"the message id names store host {host_hex}, the record another")
        return message


def real_keys(message: FetchedMessage) -> list[str]:
    """The keys a message is indexed by: KEYS split on spaces, and UNIQ_KEY."""
    return list(record_index_keys(message.record))


def _checked_at_offset(
    raw: bytes,
    unit: ConsumeQueueUnit,
    tier: Literal["hot", "cold"],
    topic: str | None = None,
    queue_id: int | None = None,
) -> FetchedMessage:
    """Check a record found by commit-log offset; it must belong to ``topic``/``queue_id`` when they are given."""
    try:
        header = decode(raw, check_crc=False)
    except CorruptRecordError:
        header = None
    if header is None or len(raw) < MIN_RECORD_SIZE:
        record = check_record(topic or "?", -1 if queue_id is None else queue_id, -1, raw, unit, tier)
    else:
        record = check_record(
            header.topic if topic is None else topic,
            header.queue_id if queue_id is None else queue_id,
            header.queue_offset,
            raw,
            unit,
            tier,
        )
    return FetchedMessage(record.topic, record.queue_id, record.queue_offset, tier, raw, record)


class TieredMessageStore:
    """The synchronous wrapper: one ``asyncio.Runner`` owned by this object, every call run on it.

    Use as a context manager, or call ``close()``. Not for use inside a running event loop.
    """

    def __init__(
        self,
        config: TieredStoreConfig,
        *,
        hot: bool = True,
        metrics: Metrics | None = None,
        read_policy: ReadPolicy | None = None,
        hot_in_memory_bytes: int | None = None,
        cache_clock: Callable[[], float] | None = None,
        owns_cold: bool = False,
    ) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise ValidationError(
                "TieredMessageStore is the synchronous wrapper; in async code use AsyncTieredMessageStore"
            )
        self._runner = asyncio.Runner()
        self._opener: AbstractAsyncContextManager[AsyncTieredMessageStore] = AsyncTieredMessageStore.open(
            config,
            hot=hot,
            metrics=metrics,
            read_policy=read_policy,
            hot_in_memory_bytes=hot_in_memory_bytes,
            cache_clock=cache_clock,
            owns_cold=owns_cold,
        )
        try:
            self.store = self._runner.run(self._opener.__aenter__())
        except BaseException:
            self._runner.close()
            raise
        self._closed = False

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            call.close()
            raise ValidationError("the store is closed")
        return self._runner.run(call)

    @property
    def runtime(self) -> Runtime:
        return self.store.runtime

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        """Run any coroutine on this store's loop (e.g. ``store.runtime.index.maintain()``)."""
        return self._run(call)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._opener.__aexit__(None, None, None))
        finally:
            self._runner.close()

    def __enter__(self) -> TieredMessageStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def put_message(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        *,
        keys: Sequence[str] = (),
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> PutResult:
        return self._run(self.store.put_message(topic, queue_id, body, keys=keys, tags=tags, properties=properties))

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        filter: MessageFilter | None = None,
    ) -> GetMessageResult:
        return self._run(self.store.get_messages(topic, queue_id, offset, max_count, filter))

    def delete_expired_hot(self) -> RetentionReport:
        """Hot retention against the archived offsets in metadata; call it periodically (no loop runs between calls)."""
        return self._run(self.store.delete_expired_hot())

    def get_min_offset(self, topic: str, queue_id: int) -> int:
        return self._run(self.store.get_min_offset(topic, queue_id))

    def get_max_offset(self, topic: str, queue_id: int) -> int:
        return self._run(self.store.get_max_offset(topic, queue_id))

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int, boundary: Boundary = "lower") -> int:
        return self._run(self.store.offset_for_timestamp(topic, queue_id, timestamp, boundary))

    def query_by_key(
        self,
        topic: str,
        key: str,
        max_count: int = 32,
        begin_timestamp: int = 0,
        end_timestamp: int = MAX_TIMESTAMP,
    ) -> list[FetchedMessage]:
        return self._run(self.store.query_by_key(topic, key, max_count, begin_timestamp, end_timestamp))

    def look_message_by_offset(
        self, offset: int | str, *, topic: str | None = None, queue_id: int | None = None
    ) -> FetchedMessage:
        return self._run(self.store.look_message_by_offset(offset, topic=topic, queue_id=queue_id))
