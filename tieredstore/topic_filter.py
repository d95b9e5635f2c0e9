"""Which hot topics the archiver archives: ``topics_include`` / ``topics_exclude`` globs and RocketMQ's system topics.

A topic is archived when it matches an include pattern, matches no exclude pattern, and is not one of
RocketMQ's own system topics (unless ``archive_system_topics``). Patterns are shell globs matched
against the whole name, case-sensitively as RocketMQ compares topics: ``*``, ``?``, ``[...]``.

System topics are the ones RocketMQ's broker treats as such: ``TopicValidator.isSystemTopic`` (its
``SYSTEM_TOPIC_SET`` and the ``rmq_sys_`` prefix, which covers the POP revive, timer wheel and
broker-member topics) and the topics ``TopicConfigManager`` registers for the broker's cluster and
its name (``<cluster>``, ``<broker>``, ``<cluster>_REPLY_TOPIC``). They carry the broker's internal
traffic: delayed messages waiting for their time, transaction halves, traces. Retry and dead-letter
topics (``%RETRY%<group>``, ``%DLQ%<group>``) hold user messages and are archived like any other.
``rmq_sys_INDEX`` names the key index in the cold layout, so a hot topic of that name is never archived.

Excluding a topic stops its archiving only: what was archived before stays readable, it is not
counted as lag, and hot retention does not wait for it to be archived.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tieredstore.formats.naming import INDEX_TOPIC

if TYPE_CHECKING:
    from tieredstore.config import ArchiverSettings

SYSTEM_TOPIC_PREFIX = "rmq_sys_"
# TopicValidator.SYSTEM_TOPIC_SET (rocketmq common/topic/TopicValidator.java).
SYSTEM_TOPICS = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "BenchmarkTest",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "CHECKPOINT_TOPIC",
    }
)
REPLY_TOPIC_SUFFIX = "_REPLY_TOPIC"
# The archived offset hot retention is given for a queue of a topic not archived: nothing of it waits.
_NOTHING_TO_ARCHIVE = (1 << 63) - 1
# A glob over topic-name characters: a pattern with any other character could never match a topic.
_PATTERN = re.compile(r"(?:[%|a-zA-Z0-9_*?-]|\[!?[%|a-zA-Z0-9_-]+\])+")


class Exclusion(enum.StrEnum):
    """Why a topic is not archived (what ``status`` shows)."""

    SYSTEM = "system topic"
    EXCLUDED = "topics_exclude"
    NOT_INCLUDED = "not in topics_include"
    RESERVED = "reserved name"


def check_topic_pattern(pattern: str) -> str:
    """``pattern`` if it can match a topic name; ValueError saying why not otherwise."""
    if not pattern:
        raise ValueError("a topic pattern must not be empty")
    if not _PATTERN.fullmatch(pattern):
        raise ValueError(
            f"topic pattern {pattern!r} can never match a topic: names use only letters, digits, '%', '|', "
            "'_' and '-', and patterns are globs (* ? [...])"
        )
    return pattern


def broker_system_topics(cluster: str, broker: str) -> frozenset[str]:
    """RocketMQ's system topics of one broker: the fixed set and those named after its cluster and itself."""
    return SYSTEM_TOPICS | {cluster, broker, cluster + REPLY_TOPIC_SUFFIX}


def _matcher(patterns: Iterable[str]) -> re.Pattern[str] | None:
    translated = [fnmatch.translate(check_topic_pattern(p)) for p in patterns]
    return re.compile("|".join(translated)) if translated else None


@dataclass(frozen=True)
class TopicFilter:
    """Decides, per topic name, whether it is archived; ``TopicFilter()`` archives every non-system topic."""

    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    system_topics: frozenset[str] = SYSTEM_TOPICS
    archive_system_topics: bool = False
    _included: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _excluded: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    # The scan asks about every hot queue each pass; names are few, so each is decided once.
    _decided: dict[str, Exclusion | None] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_included", _matcher(self.include))
        object.__setattr__(self, "_excluded", _matcher(self.exclude))

    @classmethod
    def of(cls, settings: ArchiverSettings, *, cluster: str, broker: str) -> TopicFilter:
        """The filter ``[archiver]`` settings describe for one broker's store."""
        return cls(
            settings.topics_include,
            settings.topics_exclude,
            broker_system_topics(cluster, broker),
            settings.archive_system_topics,
        )

    def is_system_topic(self, topic: str) -> bool:
        """RocketMQ's ``TopicValidator.isSystemTopic`` for this broker."""
        return topic in self.system_topics or topic.startswith(SYSTEM_TOPIC_PREFIX)

    def exclusion(self, topic: str) -> Exclusion | None:
        """Why ``topic`` is not archived, or None when it is."""
        if topic in self._decided:
            return self._decided[topic]
        reason: Exclusion | None = None
        if topic == INDEX_TOPIC:
            reason = Exclusion.RESERVED
        elif not self.archive_system_topics and self.is_system_topic(topic):
            reason = Exclusion.SYSTEM
        elif self._excluded is not None and self._excluded.match(topic):
            reason = Exclusion.EXCLUDED
        elif self._included is None or not self._included.match(topic):
            reason = Exclusion.NOT_INCLUDED
        self._decided[topic] = reason
        return reason

    def archives(self, topic: str) -> bool:
        return self.exclusion(topic) is None

    def for_hot_retention(self, archived_offset: Callable[[str, int], int]) -> Callable[[str, int], int]:
        """``archived_offset`` for hot retention, which waits for nothing of a topic that is not archived."""

        def offset(topic: str, queue_id: int) -> int:
            return archived_offset(topic, queue_id) if self.archives(topic) else _NOTHING_TO_ARCHIVE

        return offset
