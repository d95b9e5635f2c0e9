"""Where a restore writes: a hot store at the records' own offsets, or one file per queue with its progress.

Resuming is positional, never by memory: a hot queue continues at its max offset, a file at the
offset its progress file names (bytes written after it are cut first), so re-running after an
interruption continues and never writes a message twice.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

from tieredstore.errors import StorageError, StoreFullError, ValidationError
from tieredstore.local.store import JoinedRecords, LocalMessageStore
from tieredstore.read.node import ReadNode
from tieredstore.read.records import decode_message, message_fields, verify_message
from tieredstore.runtime import local_store_config

ExportFormat = Literal["jsonl", "raw"]


class RestoreSink(Protocol):
    """Where restored records go; ``resume_offset`` must come from durable state, not memory.

    ``holds_gaps``: whether a queue there may skip offsets (``skip_to``) and go on after them.
    """

    description: str
    holds_gaps: bool

    def resume_offset(self, topic: str, queue_id: int, first: int, end: int) -> int: ...

    def held_record(self, topic: str, queue_id: int, queue_offset: int) -> bytes | None:
        """The record the target holds at ``queue_offset`` (to check a resume against), None if it cannot say."""
        ...

    def write(self, topic: str, queue_id: int, batch: JoinedRecords) -> None: ...

    def skip_to(self, topic: str, queue_id: int, queue_offset: int) -> None: ...

    def finish_queue(self, topic: str, queue_id: int) -> None: ...

    def close(self) -> None: ...


class HotStoreSink:
    """Restores into a hot store directory at the records' own queue offsets; a queue there has no gaps."""

    holds_gaps = False

    def __init__(self, directory: Path, node: ReadNode, *, dry_run: bool = False) -> None:
        self.description = f"hot store {directory}"
        self.store: LocalMessageStore | None = None
        config = local_store_config(node.config)
        if not dry_run:
            self.store = LocalMessageStore(directory, config=config)
        elif (directory / "commitlog").is_dir():
            self.store = LocalMessageStore(directory, config=config, read_only=True)

    def resume_offset(self, topic: str, queue_id: int, first: int, end: int) -> int:
        held = self.store.max_offset(topic, queue_id) if self.store is not None else 0
        if held == 0:
            return first
        if held < first:
            raise ValidationError(
                f"hot queue {topic}/{queue_id} ends at offset {held}, below the restore start {first}: "
                f"restoring would leave a gap (restore from --from-offset {held}, or into an empty store)"
            )
        return min(held, end)

    def held_record(self, topic: str, queue_id: int, queue_offset: int) -> bytes | None:
        if self.store is None:
            return None
        held = self.store.read_messages(topic, queue_id, queue_offset, 1, 1 << 40)
        return held[0].raw if held and held[0].queue_offset == queue_offset else None

    def write(self, topic: str, queue_id: int, batch: JoinedRecords) -> None:
        assert self.store is not None
        self.store.restore_messages(topic, queue_id, batch)

    def skip_to(self, topic: str, queue_id: int, queue_offset: int) -> None:
        raise ValidationError(
            f"hot queue {topic}/{queue_id} cannot skip to offset {queue_offset}: a hot store holds no gaps"
        )

    def finish_queue(self, topic: str, queue_id: int) -> None:
        if self.store is not None and not self.store.read_only:
            self.store.flush()

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


class DirectorySink:
    """Exports each queue to ``<dir>/<topic>/<queue_id>.<format>`` with a ``.progress`` file beside it.

    Each record carries its own queue offset, so a file may skip offsets that were never archived.
    """

    holds_gaps = True

    def __init__(self, directory: Path, fmt: ExportFormat, *, dry_run: bool = False) -> None:
        self.description = f"{fmt} files in {directory}"
        self.directory = directory
        self.format = fmt
        self.dry_run = dry_run
        self._handles: dict[tuple[str, int], Any] = {}
        self._next: dict[tuple[str, int], int] = {}
        self._first: dict[tuple[str, int], int] = {}
        if directory.exists() and not directory.is_dir():
            raise ValidationError(f"--to-dir {directory} is not a directory")
        if not dry_run:
            with _writing(directory):
                directory.mkdir(parents=True, exist_ok=True)

    def data_path(self, topic: str, queue_id: int) -> Path:
        return self.directory / topic / f"{queue_id}.{self.format}"

    def _progress_path(self, topic: str, queue_id: int) -> Path:
        return self.directory / topic / f"{queue_id}.{self.format}.progress"

    def held_record(self, topic: str, queue_id: int, queue_offset: int) -> bytes | None:
        return None  # an export's own progress file says where it stopped; its records are not re-read

    def resume_offset(self, topic: str, queue_id: int, first: int, end: int) -> int:
        progress_path = self._progress_path(topic, queue_id)
        data_path = self.data_path(topic, queue_id)
        saved: dict[str, int] | None = None
        if progress_path.exists():
            saved = json.loads(progress_path.read_text())
        if saved is not None:
            if saved["first_offset"] > first or saved["next_offset"] < first:
                raise ValidationError(
                    f"{data_path} holds offsets [{saved['first_offset']}, {saved['next_offset']}), which the "
                    f"requested range from {first} does not continue; export into another directory"
                )
            resume, length, origin = min(saved["next_offset"], end), saved["length"], saved["first_offset"]
        else:
            resume, length, origin = first, 0, first
        if self.dry_run:
            return resume
        with _writing(data_path):
            data_path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(data_path, "ab")  # noqa: SIM115 - held open across batches, closed in finish_queue
            # Bytes after the last recorded batch are from an interrupted run: cut them, they are written again.
            handle.truncate(length)
        self._handles[(topic, queue_id)] = handle
        self._next[(topic, queue_id)] = resume
        self._first[(topic, queue_id)] = origin
        if saved is None:
            self._save_progress(topic, queue_id)
        return resume

    def write(self, topic: str, queue_id: int, batch: JoinedRecords) -> None:
        handle = self._handles[(topic, queue_id)]
        first = self._next[(topic, queue_id)]
        wheres = (f"cold {topic}/{queue_id} at queue offset {first + index}" for index in range(len(batch)))
        # Every record of the batch is checked before any of it is written: a corrupt record stops the
        # export with an error naming it, and the file ends at the last whole batch before it.
        if self.format == "raw":
            for raw, where in zip(batch, wheres, strict=True):
                verify_message(raw, where=where)
            with _writing(self.data_path(topic, queue_id)):
                handle.write(batch.data)
        else:
            lines = []
            for raw, where in zip(batch, wheres, strict=True):
                record = decode_message(bytes(raw), where=where)
                fields = message_fields(record, tier="cold", size=len(raw))
                lines.append(json.dumps(fields, sort_keys=True).encode() + b"\n")
            with _writing(self.data_path(topic, queue_id)):
                handle.write(b"".join(lines))
        self._next[(topic, queue_id)] += len(batch)
        self._save_progress(topic, queue_id)

    def skip_to(self, topic: str, queue_id: int, queue_offset: int) -> None:
        """Record that the file goes on at ``queue_offset`` (the offsets before it were never archived)."""
        self._next[(topic, queue_id)] = queue_offset
        self._save_progress(topic, queue_id)

    def _save_progress(self, topic: str, queue_id: int) -> None:
        handle = self._handles[(topic, queue_id)]
        path = self._progress_path(topic, queue_id)
        with _writing(path):
            handle.flush()
            os.fsync(handle.fileno())
            progress = {
                "first_offset": self._first[(topic, queue_id)],
                "next_offset": self._next[(topic, queue_id)],
                "length": handle.tell(),
            }
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(progress, sort_keys=True))
            os.replace(temporary, path)

    def finish_queue(self, topic: str, queue_id: int) -> None:
        handle = self._handles.pop((topic, queue_id), None)
        if handle is not None:
            handle.close()

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """The export's own file errors, typed: a full disk is StoreFullError, any other failure StorageError.

    The progress file is replaced only after the bytes it counts were fsynced, so a re-run after the
    problem is fixed resumes at the last whole batch.
    """
    try:
        yield
    except OSError as error:
        reason = error.strerror or str(error)
        if error.errno == errno.ENOSPC:
            raise StoreFullError(f"no disk space left for {path}: {reason}") from error
        raise StorageError(f"cannot write {path}: {reason}") from error
