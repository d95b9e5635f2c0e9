"""Which key a segment records when the archiver restarts with another active key before its first byte."""

from __future__ import annotations

import os
from pathlib import Path

from tieredstore.flat import FlatFileSettings, FlatFileStore
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore
from tieredstore.providers.codec import Codecs, Compression, Keyring, WriteCodec
from tieredstore.providers.posix import PosixProvider

from .helpers import TOPIC, append_range

SMALL = FlatFileSettings(commit_log_max_size=1000, consume_queue_max_size=5 * UNIT_SIZE)
KEYS = {"a": os.urandom(32), "b": os.urandom(32)}


def provider(root: Path, active: str) -> PosixProvider:
    opened = PosixProvider(f"file://{root}")
    opened.codecs = Codecs(Keyring(KEYS, active=active), lambda _segment: WriteCodec(Compression.ZSTD, 3, encrypt=True))
    return opened


def recorded_key(metadata: MetadataStore, path: str, file_type: FileType) -> str | None:
    (row,) = [row for row in metadata.list_segments(path, file_type) if row.size == 0]
    return row.key_id


async def test_a_segment_started_but_never_written_records_the_key_its_first_commit_uses(
    tmp_path: Path, metadata: MetadataStore
) -> None:
    store = FlatFileStore(provider(tmp_path, "a"), metadata, cluster="c", broker="b", settings=SMALL)
    queue = await store.get_or_create(TOPIC, 0)
    await append_range(queue, 0, 3)
    # Crashed before the first commit: the rows name key a, storage holds nothing.
    assert recorded_key(metadata, queue.path, FileType.COMMIT_LOG) == "a"

    restarted = FlatFileStore(provider(tmp_path, "b"), metadata, cluster="c", broker="b", settings=SMALL)
    await restarted.recover()
    assert recorded_key(metadata, queue.path, FileType.COMMIT_LOG) == "b"
    recovered = restarted.get(TOPIC, 0)
    await append_range(recovered, 0, 3)
    await recovered.commit()
    (segment,) = recovered.commit_log.segments
    (row,) = metadata.list_segments(queue.path, FileType.COMMIT_LOG)
    assert await segment.stored_key_id() == row.key_id == "b"
