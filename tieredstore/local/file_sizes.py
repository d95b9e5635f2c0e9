"""Store file sizes as the files on disk give them, not as configuration assumes.

A RocketMQ broker's ``mappedFileSizeCommitLog`` (1 GiB by default) and ``mappedFileSizeConsumeQueue``
(300,000 units of 20 bytes) are whatever its operator set, and nothing in its store directory says
which but the files themselves: each is named by its 20-digit start offset and preallocated whole, so
the gap between the first two names, or the first file's length, is the size. A directory with no
file yet falls back to configuration. When configuration says otherwise, disk wins, and a log line
says so: a reader or a writer that went by configuration would look for records in the wrong file.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import structlog

from tieredstore.local.config import LocalStoreConfig
from tieredstore.local.queue import list_offset_files

log = structlog.get_logger(__name__)


def file_size_on_disk(directory: Path, *, single_file: bool = True) -> int | None:
    """The size of the 20-digit store files in ``directory``: the largest gap between consecutive names, or
    the last file's length if larger; None when there is no file (or only one still empty).

    Each file is preallocated whole, so gaps and lengths agree, except where a crash cut a file short:
    shorter, never longer. With one file only, its length counts unless ``single_file`` is false, for a
    writer whose recovery must not take a file cut short for the size it regrows.
    """
    files = list_offset_files(directory)
    if not files or (len(files) == 1 and not single_file):
        return None
    starts = [start for start, _path in files]
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    try:
        last_length = files[-1][1].stat().st_size
    except FileNotFoundError:  # deleted by its writer's retention since the listing
        last_length = 0
    return max([*gaps, last_length]) or None


def consume_queue_file_size_on_disk(consume_queue_root: Path, *, single_file: bool = True) -> int | None:
    """The consume-queue file size of the first queue under ``consume_queue_root`` that has a file (a broker
    sizes every queue's files alike); None when no queue has one yet."""
    if not consume_queue_root.is_dir():
        return None
    for topic_dir in sorted(consume_queue_root.iterdir()):
        if not topic_dir.is_dir():
            continue
        for queue_dir in sorted(topic_dir.iterdir()):
            size = file_size_on_disk(queue_dir, single_file=single_file) if queue_dir.name.isdigit() else None
            if size is not None:
                return size
    return None


@dataclass(frozen=True, slots=True)
class StoreFileSizes:
    """The commit-log and consume-queue file sizes of one store directory, in bytes."""

    commit_log: int
    consume_queue: int

    @classmethod
    def learn(cls, root: Path, config: LocalStoreConfig, *, writer: bool = False) -> StoreFileSizes:
        """The sizes of the files under ``root``, each falling back to ``config`` where there is no file yet.

        A ``writer`` goes by the names of two files only (see ``file_size_on_disk``)."""
        on_disk = file_size_on_disk(root / "commitlog", single_file=not writer)
        on_disk_queues = consume_queue_file_size_on_disk(root / "consumequeue", single_file=not writer)
        return cls(
            _prefer_disk(root, "commit_log_file_size", config.commit_log_file_size, on_disk),
            _prefer_disk(root, "consume_queue_units_per_file", config.consume_queue_file_size, on_disk_queues),
        )


def _prefer_disk(root: Path, setting: str, configured: int, on_disk: int | None) -> int:
    if on_disk is None or on_disk == configured:
        return configured
    log.warning(
        "the hot store's files are not the size configuration says; going by the files",
        data_dir=str(root),
        setting=setting,
        configured_bytes=configured,
        on_disk_bytes=on_disk,
    )
    return on_disk
