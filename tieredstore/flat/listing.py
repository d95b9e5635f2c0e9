"""What the cold tier holds, found by listing it: queue folders, and each file's segments with their sizes.

For readers without metadata (Spark's ``metadata=none``) and for rebuilding lost metadata. Sizes come
from the provider (on S3 the end of a segment's contiguous run of chunks), bounded by the next
segment's start: a segment followed by another one that starts inside it was cut there by a recovery
under leases, which leaves the cut bytes in place rather than delete them
(``FlatAppendFile.abandon_tail``); metadata records the cut, a listing sees only the bytes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tieredstore.errors import InvalidTopicError
from tieredstore.formats.naming import INDEX_TOPIC, FileType, cluster_folder, validate_topic
from tieredstore.providers.base import Provider


@dataclass(frozen=True, slots=True)
class ListedSegment:
    """One segment found in storage: where it starts in its logical file and how many bytes it holds."""

    base_offset: int
    size: int

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size


@dataclass(frozen=True, slots=True)
class QueueFolder:
    """One queue's folder in the cold layout."""

    topic: str
    queue_id: int
    path: str


async def listed_segments(provider: Provider, path: str, file_type: FileType) -> list[ListedSegment]:
    """Each segment of one file in storage with its size, ending where the next one starts if it holds more."""
    bases = sorted(await provider.list_segments(path, file_type))
    sizes = await asyncio.gather(*(provider.segment(file_type, path, base).real_size() for base in bases))
    ends = [*bases[1:], None]
    return [
        ListedSegment(base, size if end is None else min(size, end - base))
        for base, size, end in zip(bases, sizes, ends, strict=True)
    ]


async def queue_folders(provider: Provider, cluster: str, broker: str) -> tuple[list[QueueFolder], list[str]]:
    """Every queue folder of one broker, by topic and queue id, and the folders that are not one (skipped).

    The key index's folder is not a topic; a folder whose name RocketMQ's topic rule refuses, or a
    queue folder whose name is not a number, is listed as skipped rather than guessed at.
    """
    broker_path = f"{cluster_folder(cluster)}/{broker}"
    folders: list[QueueFolder] = []
    skipped: list[str] = []
    for topic in await provider.list_children(broker_path):
        if topic == INDEX_TOPIC:
            continue
        try:
            validate_topic(topic)
        except InvalidTopicError:
            skipped.append(f"{broker_path}/{topic}")
            continue
        for child in await provider.list_children(f"{broker_path}/{topic}"):
            path = f"{broker_path}/{topic}/{child}"
            if child.isascii() and child.isdigit():
                folders.append(QueueFolder(topic, int(child), path))
            else:
                skipped.append(path)
    return sorted(folders, key=lambda f: (f.topic, f.queue_id)), skipped
