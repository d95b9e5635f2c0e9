"""Messages and crash injection for the container-layer tests."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from tieredstore.flat import FlatMessageFile
from tieredstore.flat.message_file import RecordRun
from tieredstore.formats.message import MessageRecord, tag_hash
from tieredstore.formats.naming import FileType
from tieredstore.providers.base import FileSegment, Provider
from tieredstore.providers.wrapper import WrappedProvider, WrappedSegment

TOPIC = "TopicA"
BASE_TIMESTAMP = 1_700_000_000_000


def make_record(
    queue_offset: int,
    *,
    topic: str = TOPIC,
    queue_id: int = 0,
    store_timestamp: int | None = None,
    size: int | None = None,
    tags: str | None = "TagA",
) -> bytes:
    """A hot-store record (PHYSICALOFFSET as the hot commit log had it), varied in size by offset."""
    rng = random.Random(queue_offset * 7919 + queue_id)
    body = rng.randbytes(size if size is not None else rng.randint(10, 120))
    properties = {"KEYS": f"key-{queue_offset}", "UNIQ_KEY": f"U{queue_offset:08d}"}
    if tags:
        properties["TAGS"] = tags
    return MessageRecord(
        topic=topic,
        queue_id=queue_id,
        body=body,
        properties=properties,
        queue_offset=queue_offset,
        physical_offset=10_000_000 + queue_offset * 512,
        born_timestamp=BASE_TIMESTAMP,
        store_timestamp=store_timestamp if store_timestamp is not None else BASE_TIMESTAMP + queue_offset,
    ).encode()


def tags_hash(tags: str | None = "TagA") -> int:
    return tag_hash(tags)


async def append_range(
    flat_file: FlatMessageFile, start: int, end: int, *, timestamp_of: Callable[[int], int] | None = None
) -> dict[int, bytes]:
    """Append records ``start``..``end - 1``; returns them by queue offset (the hot reference)."""
    records = {}
    for offset in range(start, end):
        timestamp = timestamp_of(offset) if timestamp_of else BASE_TIMESTAMP + offset
        record = make_record(offset, topic=flat_file.topic, queue_id=flat_file.queue_id, store_timestamp=timestamp)
        await flat_file.append_records(RecordRun.of([(record, offset, timestamp, tags_hash())]))
        records[offset] = record
    return records


class SimulatedCrash(BaseException):
    """The process dies here: nothing in the code under test may catch it and react."""


@dataclass
class CrashPlan:
    """Which commit dies, and how many of its bytes reach storage first.

    ``crash_on``: the first commit of this file type crashes, after ``land_bytes`` of its bytes
    landed (None: all of them). ``lose_on``: the first commit of this file type reports success but
    stores nothing (storage lost an acknowledged write). ``armed`` turns the plan on.
    """

    crash_on: FileType | None = None
    land_bytes: int | None = 0
    lose_on: FileType | None = None
    armed: bool = False
    fired: bool = False


class CrashingSegment(WrappedSegment):
    """Runs another segment's storage core and obeys a CrashPlan on commit."""

    def __init__(self, inner: FileSegment, plan: CrashPlan) -> None:
        super().__init__(inner)
        self.plan = plan

    async def _commit(self, position: int, data: bytes | bytearray) -> None:
        plan = self.plan
        if plan.armed and not plan.fired and plan.lose_on is self.file_type:
            plan.fired = True
            return
        if plan.armed and not plan.fired and plan.crash_on is self.file_type:
            plan.fired = True
            landed = len(data) if plan.land_bytes is None else plan.land_bytes
            if landed > 0:
                await self.inner._commit(position, data[:landed])
            raise SimulatedCrash(f"crash while committing {self.key}")
        await self.inner._commit(position, data)


class CrashingProvider(WrappedProvider):
    """A provider whose segments crash at the points a CrashPlan names."""

    scheme: ClassVar[str] = "crashing"

    def __init__(self, inner: Provider, plan: CrashPlan) -> None:
        super().__init__(inner)
        self.crash_plan = plan

    def wrap(self, segment: FileSegment) -> CrashingSegment:
        return CrashingSegment(segment, self.crash_plan)
