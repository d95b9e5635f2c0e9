"""What a read answers: RocketMQ's statuses, the messages served, a queue's offsets over both tiers."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from tieredstore.basics import Boundary
from tieredstore.errors import ValidationError
from tieredstore.flat.served import ReadAheadBatch, Tier
from tieredstore.formats.message import MessageRecord, decode, java_string_hash, verify_record

__all__ = [
    "Boundary",
    "FetchedMessage",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageFilter",
    "QueueOffsets",
    "ReadBatch",
    "Tier",
    "window_messages",
]


class GetMessageStatus(enum.StrEnum):
    """RocketMQ's GetMessageStatus values that this store produces."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # every scanned message was filtered out
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"  # inside [min, max) but no tier holds it (a gap)
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # offset > max
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # offset == max: nothing new yet
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # offset < min
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"  # neither tier knows the queue
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"  # the queue is known but holds nothing


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """Which messages a consumer wants: any of ``tags`` (None: any tag) and ``predicate`` (None: all)."""

    tags: frozenset[str] | None = None
    predicate: Callable[[MessageRecord], bool] | None = None
    tag_hashes: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.tags is not None:
            if isinstance(self.tags, str):
                raise ValidationError("tags must be a set of tag strings, not one string")
            object.__setattr__(self, "tags", frozenset(self.tags))
        object.__setattr__(self, "tag_hashes", frozenset(java_string_hash(tag) for tag in self.tags or ()))

    @classmethod
    def by_tags(cls, *tags: str) -> MessageFilter:
        return cls(tags=frozenset(tags))

    def may_match(self, tag_hash: int) -> bool:
        """The cheap check on the consume-queue tag hash, before the record is read."""
        return self.tags is None or tag_hash in self.tag_hashes

    def matches(self, record: MessageRecord) -> bool:
        if self.tags is not None and record.tags not in self.tags:
            return False
        return self.predicate is None or self.predicate(record)


@dataclass(slots=True, unsafe_hash=True)
class FetchedMessage:
    """One message as served: where it is, which tier served it, its raw record bytes and decoded view.

    The bytes were checked when the message was served; ``decoded`` is the decoded record when the
    server already had it, otherwise ``record`` decodes it on first access. A value: treat it as
    immutable (it hashes by its fields). It is not a frozen dataclass only because building one costs
    twice as much, once per message served.
    """

    topic: str
    queue_id: int
    queue_offset: int
    tier: Tier
    raw: bytes = field(repr=False)
    decoded: MessageRecord | None = field(default=None, repr=False, compare=False)

    @property
    def record(self) -> MessageRecord:
        record = self.decoded
        if record is None:
            record = self.decoded = decode(self.raw, check_crc=False)
        return record

    @property
    def body(self) -> bytes:
        if self.decoded is not None:
            return self.decoded.body
        fields = verify_record(self.raw, check_crc=False)
        return self.raw[fields.body_at : fields.body_at + fields.body_len]

    @property
    def keys(self) -> list[str]:
        return self.record.keys

    @property
    def tags(self) -> str | None:
        return self.record.tags

    @property
    def unique_key(self) -> str | None:
        return self.record.unique_key

    @property
    def properties(self) -> dict[str, str]:
        return self.record.properties

    @property
    def store_timestamp(self) -> int:
        return self.record.store_timestamp


@dataclass(frozen=True, slots=True)
class GetMessageResult:
    """The answer to ``get_messages``: ask for ``next_begin_offset`` next."""

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[FetchedMessage] = field(default_factory=list)


def window_messages(batch: ReadAheadBatch, begin: int, end: int) -> list[FetchedMessage]:
    """The records at [begin, end) of a cold window as messages (checked when it was read; nothing decoded)."""
    batch.raise_if_corrupt(begin, end)
    data, topic, queue_id, starts, ends = batch.data, batch.topic, batch.queue_id, batch.starts, batch.ends
    low, high = begin - batch.first_offset, end - batch.first_offset
    return [
        FetchedMessage(topic, queue_id, offset, "cold", data[start:stop])
        for offset, start, stop in zip(range(begin, end), starts[low:high], ends[low:high], strict=True)
    ]


@dataclass(frozen=True, slots=True)
class QueueOffsets:
    """A queue's offsets in each tier ([min, max) each; empty when min == max) and over both."""

    known: bool
    hot_min: int
    hot_max: int
    cold_min: int
    cold_max: int
    min_offset: int
    max_offset: int
    # [start, end) offsets inside [cold_min, cold_max) that cold storage recorded as lost (never archived).
    cold_lost: tuple[tuple[int, int], ...] = ()

    def hot_has(self, offset: int) -> bool:
        return self.hot_min <= offset < self.hot_max

    def cold_has(self, offset: int) -> bool:
        return self.cold_min <= offset < self.cold_max and not any(s <= offset < e for s, e in self.cold_lost)

    def next_held_after(self, offset: int) -> int:
        """The first offset above ``offset`` that some tier holds (``max_offset`` if none)."""
        spans = [(self.hot_min, self.hot_max), (self.cold_min, self.cold_max)]
        spans += [(end, self.cold_max) for _start, end in self.cold_lost]
        later = [start for start, end in spans if start < end and start > offset]
        return min(later) if later else self.max_offset


@dataclass(slots=True)
class ReadBatch:
    """Messages one tier served for a call, and where the queue's next call begins."""

    messages: list[FetchedMessage]
    next_offset: int
    # The cached cold window the messages ended in, when unfiltered: where the queue's next call may continue.
    window: ReadAheadBatch | None = None
