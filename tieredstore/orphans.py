"""What cold storage holds that metadata does not account for: the one orphan rule of verify and scrub.

Under this broker's folder an orphan is

- a segment (commit log or consume queue) of a queue metadata knows, with no live row (NEW or SEALED):
  never recorded, or recorded DELETING or DELETED by a retention pass cut short;
- a topic or queue folder metadata knows nothing of, with the segments it holds;
- a key-index file, in any namespace, that no catalogue row names;
- the bytes past the recorded size of a SEALED segment that the next segment follows on from (or that is
  the last one): recovery under leases seals a segment there instead of deleting them
  (``FlatAppendFile.abandon_tail``), and no read goes past a recorded size.

Bytes past the recorded size of the last NEW segment are not an orphan: a commit whose metadata update
is still in flight, which recovery settles. Other brokers' and clusters' folders are not looked at.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from tieredstore.formats.naming import INDEX_TOPIC, FileType, cluster_folder, index_path
from tieredstore.index.catalogue import MetadataIndexCatalogue
from tieredstore.index.service import IndexFileRecord, namespace_path, stored_namespaces
from tieredstore.metadata import MetadataStore, SegmentRecord, SegmentStatus
from tieredstore.providers.base import Provider

QUEUE_FILE_TYPES = (FileType.COMMIT_LOG, FileType.CONSUME_QUEUE)
NO_LIVE_ROW = "the provider holds this segment but metadata has no live row for it"
NO_CATALOGUE_ROW = "the provider holds this index file but the key-index catalogue has no row for it"
UNKNOWN_TOPIC = "the topic is not in the metadata store"
UNKNOWN_QUEUE = "the queue is not in metadata"


@dataclass(frozen=True, slots=True)
class OrphanFolder:
    """A topic's queue folder that metadata does not know; ``segments`` are what it holds, by file type.

    ``queue_id`` is None for a folder whose name is not a queue id (not tieredstore's layout).
    """

    location: str
    topic: str
    queue_id: int | None
    topic_known: bool
    segments: dict[FileType, list[int]] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        return UNKNOWN_QUEUE if self.topic_known else UNKNOWN_TOPIC

    def describe(self) -> str:
        holds = [kind.value for kind, offsets in self.segments.items() if offsets]
        return f"{self.reason}; it holds {', '.join(holds) or 'files'}"


def broker_folder(cluster: str, broker: str) -> str:
    """The folder holding every topic of one broker's archive."""
    return f"{cluster_folder(cluster)}/{broker}"


def unrecorded_segments(stored: Sequence[int], live: Sequence[SegmentRecord]) -> list[int]:
    """Base offsets of stored segments that no live row records."""
    known = {row.base_offset for row in live}
    return [base for base in stored if base not in known]


def abandoned_tail(live: Sequence[SegmentRecord], index: int, stored_size: int) -> bool:
    """Whether the bytes ``live[index]`` holds past its recorded size were left by a recovery under leases.

    So they are when the segment is SEALED and the next one follows on from its recorded end (or it is
    the last one); past any other segment's size they are a commit in flight (the last NEW one) or a
    size mismatch, never an orphan.
    """
    row = live[index]
    if stored_size <= row.size or row.status is not SegmentStatus.SEALED:
        return False
    return index == len(live) - 1 or live[index + 1].base_offset == row.base_offset + row.size


async def orphan_folders(
    provider: Provider, broker_path: str, topic: str | None, known: set[tuple[str, int]]
) -> list[OrphanFolder]:
    """Topic and queue folders under ``broker_path`` (of ``topic`` only, when given) that metadata does not
    know. An empty queue folder (a file system keeps it after its segments went) is none."""
    known_topics = {name for name, _ in known}
    found: list[OrphanFolder] = []
    for name in sorted(await provider.list_children(broker_path)):
        if name == INDEX_TOPIC or (topic is not None and name != topic):
            continue
        for queue_name in sorted(await provider.list_children(f"{broker_path}/{name}")):
            queue_id = int(queue_name) if queue_name.isdigit() else None
            if queue_id is not None and (name, queue_id) in known:
                continue
            location = f"{broker_path}/{name}/{queue_name}"
            segments = (
                {kind: await provider.list_segments(location, kind) for kind in QUEUE_FILE_TYPES}
                if queue_id is not None
                else {}
            )
            if queue_id is not None and not any(segments.values()):
                continue
            found.append(OrphanFolder(location, name, queue_id, name in known_topics, segments))
    return found


async def index_namespaces(
    metadata: MetadataStore, provider: Provider, cluster: str, broker: str
) -> list[tuple[str, dict[int, IndexFileRecord]]]:
    """Every key-index folder (the root's and each namespace's) with its catalogue rows by file id.

    The catalogue's own naming says which rows are whose; a namespace's folder whose rows are all gone
    still sits in storage beside the root's INDEX folder, so storage is asked too.
    """
    root = index_path(cluster, broker)
    namespaces = await asyncio.to_thread(MetadataIndexCatalogue(metadata, root).namespaces)
    namespaces |= await stored_namespaces(provider, root)
    folders = []
    for namespace in sorted({"", *namespaces}):
        folder = namespace_path(root, namespace)
        catalogue = MetadataIndexCatalogue(metadata, folder)
        files = {record.file_id: record for record in await asyncio.to_thread(catalogue.list_files)}
        folders.append((folder, files))
    return folders


def uncatalogued_index_files(stored: Sequence[int], files: dict[int, IndexFileRecord]) -> list[int]:
    """File ids of the stored INDEX objects that no catalogue row names (whatever the row's state)."""
    return [file_id for file_id in stored if file_id not in files]
