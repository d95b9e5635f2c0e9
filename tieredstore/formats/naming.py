"""Names and paths of files in both tiers; pure functions.

Cold layout: ``<md5(cluster)[:8]>_<cluster>/<broker>/<topic>/<queueId>/<TYPE>/<name>`` with
``name = md5(str(baseOffset))[:8] + "%020d" % baseOffset``; the hash prefix spreads keys across
S3 partitions. Hot files are named by their 20-digit zero-padded start offset, as RocketMQ does.
"""

from __future__ import annotations

import enum
import hashlib
import re

from tieredstore.errors import InvalidTopicError, ValidationError

# Both patterns are matched whole (fullmatch): "$" would also match before a trailing newline, and the
# segment digits are ASCII only, since "\d" takes any Unicode digit; either would let two names alias.
TOPIC_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")
TOPIC_MAX_LENGTH = 127
INDEX_TOPIC = "rmq_sys_INDEX"
_SEGMENT_NAME = re.compile(r"([0-9a-f]{8})([0-9]{20})")


class FileType(enum.StrEnum):
    """What a cold segment holds; the value is the folder name in the cold layout."""

    COMMIT_LOG = "COMMIT_LOG"
    CONSUME_QUEUE = "CONSUME_QUEUE"
    INDEX = "INDEX"


def validate_topic(topic: str) -> str:
    """Return ``topic`` if RocketMQ's rule allows it; raise InvalidTopicError naming the rule otherwise."""
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicError("topic name is empty; it must match ^[%|a-zA-Z0-9_-]+$")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise InvalidTopicError(f"topic name is {len(topic)} characters; at most {TOPIC_MAX_LENGTH} are allowed")
    if not TOPIC_PATTERN.fullmatch(topic):
        raise InvalidTopicError(
            f"topic name {topic!r} may only contain letters, digits, '%', '|', '_' and '-' (^[%|a-zA-Z0-9_-]+$)"
        )
    return topic


def _md5_prefix(text: str) -> str:
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()[:8]


def segment_name(base_offset: int) -> str:
    """``md5(str(base))[:8] + %020d`` — offset 0 gives ``cfcd208400000000000000000000``."""
    if base_offset < 0:
        raise ValidationError(f"base offset {base_offset} is negative")
    return f"{_md5_prefix(str(base_offset))}{base_offset:020d}"


def parse_segment_name(name: str) -> int:
    """The base offset in a segment name; ValidationError if the name or its hash prefix is wrong."""
    match = _SEGMENT_NAME.fullmatch(name)
    if match is None:
        raise ValidationError(f"{name!r} is not a segment name (8 hex digits then 20 digits)")
    base = int(match.group(2))
    if match.group(1) != _md5_prefix(str(base)):
        raise ValidationError(f"segment name {name!r} has a hash prefix that does not match its offset")
    return base


def cluster_folder(cluster: str) -> str:
    return f"{_md5_prefix(cluster)}_{cluster}"


def queue_path(cluster: str, broker: str, topic: str, queue_id: int) -> str:
    """The logical path of one queue's folder: ``<hash>_<cluster>/<broker>/<topic>/<queueId>``."""
    return f"{cluster_folder(cluster)}/{broker}/{topic}/{queue_id}"


def topic_of_path(path: str) -> str | None:
    """The topic of a queue's logical path (``queue_path``'s third part), None for a shorter path."""
    parts = path.split("/")
    return parts[2] if len(parts) >= 4 else None


def index_path(cluster: str, broker: str) -> str:
    """Where the key index lives: ``<hash>_<cluster>/<broker>/rmq_sys_INDEX/0``."""
    return queue_path(cluster, broker, INDEX_TOPIC, 0)


def segment_key(path: str, file_type: FileType, base_offset: int) -> str:
    """The full key of a segment under the provider root: ``<path>/<TYPE>/<name>``."""
    return f"{path}/{file_type.value}/{segment_name(base_offset)}"


def hot_file_name(start_offset: int) -> str:
    """A hot commit-log or consume-queue file name: the 20-digit zero-padded start offset."""
    return f"{start_offset:020d}"
