"""Known messages archived through the flat layer, and the rows Spark must return for them."""

from __future__ import annotations

import dataclasses
import datetime
import random
from dataclasses import dataclass, field
from typing import Any

from tieredstore.flat import FlatFileSettings, FlatFileStore, FlatMessageFile
from tieredstore.flat.message_file import RecordRun
from tieredstore.formats.message import (
    MAGIC_V2,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    HostAddress,
    MessageRecord,
    tag_hash,
)
from tieredstore.leases import LeaseManager
from tieredstore.metadata import MetadataStore
from tieredstore.providers.registry import open_provider

CLUSTER = "DefaultCluster"
BROKER = "broker-a"
BASE_TIMESTAMP = 1_780_000_000_000
STEP_MS = 10
# Small segments so one queue spans several commit-log and consume-queue segments.
SETTINGS = FlatFileSettings(commit_log_max_size=48 * 1024, consume_queue_max_size=400)

Row = dict[str, Any]


def store_timestamp(queue_id: int, queue_offset: int) -> int:
    return BASE_TIMESTAMP + queue_offset * STEP_MS + queue_id


def make_message(topic: str, queue_id: int, queue_offset: int, *, body_size: int | None = None) -> MessageRecord:
    """A message varied by offset: body size, tags or none, keys or none, UNIQ_KEY or none, hosts, layout."""
    rng = random.Random(f"{topic}/{queue_id}/{queue_offset}")
    properties: dict[str, str] = {"ORDER": str(queue_offset)}
    if queue_offset % 3:
        properties["KEYS"] = f"key-{queue_offset} shared-{queue_offset % 5}"
    if queue_offset % 4:
        properties["TAGS"] = f"tag{queue_offset % 2}"
    if queue_offset % 7:
        properties["UNIQ_KEY"] = f"{queue_id:04X}{queue_offset:028X}"
    return MessageRecord(
        topic=topic,
        queue_id=queue_id,
        body=rng.randbytes(body_size if body_size is not None else rng.randint(0, 900)),
        properties=properties,
        queue_offset=queue_offset,
        flag=queue_offset % 2,
        sysflag=0x4 if queue_offset % 11 == 0 else 0,
        born_timestamp=store_timestamp(queue_id, queue_offset) - 250,
        born_host=HostAddress("::1", 4000) if queue_offset % 13 == 5 else HostAddress("10.0.0.7", 4000),
        store_timestamp=store_timestamp(queue_id, queue_offset),
        store_host=HostAddress("fe80::2", 10911) if queue_offset % 17 == 3 else HostAddress("10.0.0.1", 10911),
        reconsume_times=queue_offset % 3,
        magic=MAGIC_V2 if queue_offset % 19 == 7 else None,
    )


def expected_row(message: MessageRecord, commitlog_offset: int) -> Row:
    stored = message.with_physical_offset(commitlog_offset)
    sysflag = message.sysflag
    if message.born_host.is_ipv6:
        sysflag |= SYSFLAG_BORNHOST_V6
    if message.store_host.is_ipv6:
        sysflag |= SYSFLAG_STOREHOST_V6
    return {
        "topic": message.topic,
        "queue_id": message.queue_id,
        "queue_offset": message.queue_offset,
        "commitlog_offset": commitlog_offset,
        "store_timestamp": message.store_timestamp,
        "born_timestamp": message.born_timestamp,
        "keys": message.keys,
        "tags": message.tags,
        "properties": dict(message.properties),
        "msg_id": message.unique_key or stored.offset_msg_id,
        "body": message.body,
        "body_crc": message.stored_crc,
        "reconsume_times": message.reconsume_times,
        "sysflag": sysflag,
    }


def _epoch_ms(value: datetime.datetime) -> int:
    # PySpark hands timestamps back as naive local times; .timestamp() reads them the same way.
    return round(value.timestamp() * 1000)


def spark_row(row: Any) -> Row:
    """A collected Spark Row in the shape of ``expected_row``."""
    values = row.asDict()
    values["store_timestamp"] = _epoch_ms(values["store_timestamp"])
    values["born_timestamp"] = _epoch_ms(values["born_timestamp"])
    values["body"] = bytes(values["body"])
    values["keys"] = list(values["keys"])
    values["properties"] = dict(values["properties"])
    return values


def sort_key(row: Row) -> tuple[str, int, int]:
    return (row["topic"], row["queue_id"], row["queue_offset"])


@dataclass
class Archive:
    """One archived data set: where it is and every row it holds, by topic."""

    name: str
    cold_url: str
    metadata_url: str
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)
    rows: dict[str, list[Row]] = field(default_factory=dict)

    def options(self, *, metadata: bool = True, **extra: str) -> dict[str, str]:
        """Spark reader options for this archive (metadata mode, or listing the cold URL)."""
        chosen = {"cold_url": self.cold_url, **self.storage_options, **extra}
        if metadata:
            chosen["metadata_url"] = self.metadata_url
        else:
            chosen["metadata"] = "none"
        return chosen

    def expected(self, *topics: str) -> list[Row]:
        return sorted((row for topic in topics for row in self.rows.get(topic, [])), key=sort_key)


async def archive_messages(
    archive: Archive,
    provider_options: dict[str, Any],
    messages: dict[tuple[str, int], list[MessageRecord]],
    *,
    abandon_after: dict[tuple[str, int], int] | None = None,
) -> None:
    """Archive ``messages`` per (topic, queue) through FlatFileStore, committing every 25 messages.

    A gap in a queue's offsets is archived as a consume-queue hole (``skip_to``). ``abandon_after``
    names queues where, after that many messages, a commit is cut short (commit-log bytes no unit
    references: other versions of the next messages) and recovered under a lease, which leaves those
    bytes in storage past a sealed segment; archiving then goes on.
    """
    metadata = MetadataStore.open(archive.metadata_url)
    try:
        async with open_provider(archive.cold_url, **provider_options) as provider:
            store = FlatFileStore(provider, metadata, cluster=CLUSTER, broker=BROKER, settings=SETTINGS)
            for (topic, queue_id), queue_messages in messages.items():
                flat_file = await store.get_or_create(topic, queue_id)
                for index, message in enumerate(queue_messages):
                    if index and message.queue_offset != flat_file.append_offset:
                        # Offsets the hot store lost: the consume queue keeps a hole, the commit log does not.
                        await flat_file.commit()
                        await flat_file.skip_to(message.queue_offset)
                    one = (message.encode(), message.queue_offset, message.store_timestamp, tag_hash(message.tags))
                    commitlog_offset = await flat_file.append_records(RecordRun.of([one]))
                    archive.rows.setdefault(topic, []).append(expected_row(message, commitlog_offset))
                    if index % 25 == 24:
                        await flat_file.commit()
                    if (abandon_after or {}).get((topic, queue_id)) == index + 1:
                        await flat_file.commit()
                        await _cut_short_and_recover_under_a_lease(metadata, flat_file, queue_messages[index + 1 :])
                await flat_file.commit()
    finally:
        metadata.close()


async def _cut_short_and_recover_under_a_lease(
    metadata: MetadataStore, flat_file: FlatMessageFile, following: list[MessageRecord]
) -> None:
    """Commit-log bytes of a commit that never reached the consume queue, then the queue's recovery
    under a lease: it seals the segment where the archive ends and leaves those bytes in place."""
    for message in following[:10]:
        other = dataclasses.replace(message, body=b"abandoned " + message.body[:20])
        await flat_file.commit_log.append(other.encode(), message.store_timestamp)
    await flat_file.commit_log.commit()
    lease = LeaseManager(metadata, owner="spark-fixture", lease_duration=30, renew_interval=10)
    lease.round()
    flat_file.lease = lease.hold((flat_file.topic, flat_file.queue_id))
    try:
        assert (await flat_file.recover()).orphan_bytes_abandoned > 0
    finally:
        flat_file.lease = None
        lease.close()
