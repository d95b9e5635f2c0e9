"""``tieredstore restore``: stream archived messages back into a hot store or out to files, resumably.

Into a hot store (``--to-store``) every record lands at its original queue offset
(``LocalMessageStore.restore_messages``), so consumers resume where they were; into a directory
(``--to-dir``) each queue becomes ``<topic>/<queue_id>.jsonl`` or ``.raw`` (the records' own bytes)
beside a ``.progress`` file that is replaced atomically after every fsynced batch.

Resuming is positional, never by memory: a hot queue continues at its max offset, a file at the
offset its progress file names (bytes written after it are cut first). Re-running after an
interruption therefore continues and never writes a message twice.

Up to ``--parallel`` queues (4) are restored at once, each read up to ``read_ahead`` batches
(``batch_messages`` / ``batch_bytes``) ahead of its writes; memory is bounded by ``--in-flight-mib``,
the record bytes read from cold storage and not yet written (a batch larger than that goes alone).
One thread writes every batch, each queue's in queue-offset order; the queues interleave in the hot
commit log, which is what a hot store's producers do too. The first failed read or write stops the
restore: every queue keeps what was written before it, and the next run resumes each one.

Offsets the hot store lost before they were archived (a recorded hole in the cold consume queue)
were never archived, and a restore keeps every other record at its original offset. Into a
directory the hole is skipped (its progress moves past it) and reported. A hot store cannot hold a
gap in a queue's offsets, so a restore into one stops at the first hole, having restored everything
before it, reports where and why, and exits 3; the records after the hole go into another (empty)
hot store with ``--from-offset`` at the hole's end, or into a directory.

Programmatic use (benchmarks): ``restore_archive(node, request, sink)`` with a ``ReadNode`` from
``open_read_node`` and a ``HotStoreSink`` or ``DirectorySink``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import math
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import numpy as np
import typer
from rich.progress import (
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from tieredstore.cli.app import app, state
from tieredstore.cli.common import (
    ReadNode,
    archived_queue,
    archived_range,
    checked_queue_id,
    checked_topic,
    decode_message,
    iso,
    message_fields,
    open_read_node,
    parse_time,
    run,
    segment_rows,
    verify_message,
)
from tieredstore.cli.read import QueueReader
from tieredstore.errors import (
    ConfigError,
    CorruptRecordError,
    NotFoundError,
    SegmentNotFoundError,
    StorageError,
    StoreFullError,
    StoreLockedError,
    ValidationError,
)
from tieredstore.flat.consume_queue import BoundaryType
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.formats.arrays import RECORD_HEAD_DTYPE, UNIT_DTYPE, gather
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import MIN_RECORD_SIZE, same_but_physical_offset, split_back_to_back
from tieredstore.local.store import JoinedRecords, LocalMessageStore
from tieredstore.runtime import local_store_config

MIB = 1 << 20
# A batch also ends where the cold storage object holding it does (an S3 chunk, one GET whole), so this
# cap and 16 MiB bound batches read from a file system.
DEFAULT_BATCH_MESSAGES = 16384
ExportFormat = Literal["jsonl", "raw"]
# glibc's mallopt parameter, and the size from which a restore's allocations are their own mappings.
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 1 * MIB


def _return_large_buffers_to_the_system() -> None:
    """Have glibc map every allocation of 1 MiB or more on its own, so freeing it unmaps it.

    By default glibc raises its mmap threshold to the size of the largest buffer freed (up to 32
    MiB): after the first 16 MiB batch is freed, every later one comes from the heaps of the threads
    that read and write batches, which fragment and keep tens of MiB that are free but resident
    (measured: a 1,000,000-message restore peaked at 220 MiB anonymous RSS, 168 MiB with this, at the
    same speed). Setting the threshold fixes it. Only for the restore command's own process.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


@dataclass(frozen=True, slots=True)
class RestoreRequest:
    """What to restore: a topic (or one queue) and an offset range or a store-time range."""

    topic: str
    queue_id: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None  # exclusive
    since: int | None = None  # epoch ms, inclusive
    until: int | None = None  # epoch ms, inclusive
    batch_messages: int = DEFAULT_BATCH_MESSAGES
    batch_bytes: int = 16 * MIB
    parallel: int = 4  # queues restored at once
    read_ahead: int = 4  # batches read per queue ahead of the one being written
    max_bytes_in_flight: int = 32 * MIB  # record bytes read from cold storage and not yet written

    def __post_init__(self) -> None:
        if (self.from_offset is not None or self.to_offset is not None) and (
            self.since is not None or self.until is not None
        ):
            raise ValidationError("give an offset range (--from-offset/--to-offset) or a time range, not both")
        if self.from_offset is not None and self.to_offset is not None and self.from_offset > self.to_offset:
            raise ValidationError(f"--from-offset {self.from_offset} is after --to-offset {self.to_offset}")
        if self.since is not None and self.until is not None and self.since > self.until:
            raise ValidationError(f"--since ({iso(self.since)}) is after --until ({iso(self.until)})")
        if self.batch_messages < 1 or self.batch_bytes < 1:
            raise ValidationError("batch sizes must be positive")
        if self.parallel < 1 or self.read_ahead < 1 or self.max_bytes_in_flight < 1:
            raise ValidationError("parallel queues, read-ahead and bytes in flight must be positive")


@dataclass(slots=True)
class QueueOutcome:
    """One queue: the requested range [first, end), where the run began and what it wrote.

    ``lost`` lists the [start, end) offsets in [resumed_at, end) that were never archived;
    ``stopped_at`` is set when the target cannot hold such a gap and the run stops at the first one.
    """

    topic: str
    queue_id: int
    first: int
    end: int
    resumed_at: int
    restored: int = 0
    bytes: int = 0
    lost: list[tuple[int, int]] = field(default_factory=list)
    stopped_at: int | None = None

    @property
    def already_done(self) -> int:
        return self.resumed_at - self.first

    @property
    def lost_count(self) -> int:
        return sum(end - start for start, end in self.lost)

    @property
    def remaining(self) -> int:
        """Archived messages in [resumed_at, end) that this run has not restored (or will not)."""
        return self.end - self.resumed_at - self.lost_count - self.restored

    @property
    def planned(self) -> int:
        """Archived messages this run restores: up to the end, or to where it stops."""
        stop = self.end if self.stopped_at is None else self.stopped_at
        lost_before_stop = sum(min(end, stop) - start for start, end in self.lost if start < stop)
        return stop - self.resumed_at - lost_before_stop


@dataclass(slots=True)
class RestoreSummary:
    """The outcome of a restore (or, with ``dry_run``, what it would do)."""

    dry_run: bool
    target: str
    queues: list[QueueOutcome] = field(default_factory=list)
    seconds: float = 0.0
    peak_bytes_in_flight: int = 0

    @property
    def messages(self) -> int:
        return sum(q.restored for q in self.queues)

    @property
    def bytes(self) -> int:
        return sum(q.bytes for q in self.queues)

    def as_json(self) -> dict[str, Any]:
        rate = self.messages / self.seconds if self.seconds > 0 else 0.0
        return {
            "dry_run": self.dry_run,
            "target": self.target,
            "messages": self.messages,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "messages_per_second": round(rate, 1),
            "peak_bytes_in_flight": self.peak_bytes_in_flight,
            "queues": [
                {
                    **{k: v for k, v in asdict(q).items() if k != "lost"},
                    "already_done": q.already_done,
                    "remaining": q.remaining,
                    "lost_ranges": [[start, end] for start, end in q.lost],
                }
                for q in self.queues
            ],
        }


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


# ---- the engine -------------------------------------------------------------------------------------


async def _queue_range(node: ReadNode, flat_file: FlatMessageFile, request: RestoreRequest) -> tuple[int, int]:
    low, high = archived_range(flat_file)
    first, end = low, high
    if request.from_offset is not None:
        first = max(low, request.from_offset)
    if request.to_offset is not None:
        end = min(high, request.to_offset)
    if request.since is not None or request.until is not None:
        reader = QueueReader(node, flat_file.topic, flat_file.queue_id, flat_file)
        if request.since is not None:
            first = await reader.offset_for_time(request.since, BoundaryType.LOWER, "cold")
        if request.until is not None:
            end = await reader.offset_for_time(request.until + 1, BoundaryType.LOWER, "cold")
    # A range starting inside a hole starts at the first archived offset after it.
    first = min(flat_file.next_archived_offset(first), max(first, end))
    return first, max(first, end)


class _ByteBudget:
    """Record bytes read from cold storage and not yet written, capped: a read waits until its bytes fit.

    A batch larger than the whole cap still goes, alone (it takes the whole cap), so nothing waits forever.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._changed = asyncio.Condition()

    async def acquire(self, size: int) -> int:
        """Wait until ``size`` bytes fit under the cap and hold them; returns what ``release`` takes back."""
        size = min(size, self.limit)
        async with self._changed:
            await self._changed.wait_for(lambda: self.held + size <= self.limit)
            self.held += size
            self.peak = max(self.peak, self.held)
        return size

    async def release(self, size: int) -> None:
        async with self._changed:
            self.held -= size
            self._changed.notify_all()


class _Abandoned(Exception):
    """A write refused because an earlier one failed (that one's error is what the restore reports)."""


class _Writer:
    """Writes batches into the sink in one thread, in the order they come; none after one has failed.

    One thread: the store takes one write at a time anyway, and one thread's allocations come back
    to one malloc arena instead of growing one per pool thread. Writes queued behind a failed one are
    refused in the thread itself, so the restore stops at the first error, not a few batches later.
    """

    def __init__(self, sink: RestoreSink) -> None:
        self._sink = sink
        self._failed = threading.Event()
        self.error: BaseException | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="restore-writer")

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)

    async def write(self, topic: str, queue_id: int, batch: JoinedRecords) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._write, topic, queue_id, batch)

    def _write(self, topic: str, queue_id: int, batch: JoinedRecords) -> None:
        if self._failed.is_set():
            raise _Abandoned(f"{topic}/{queue_id}: not written, an earlier write failed")
        try:
            self._sink.write(topic, queue_id, batch)
        except BaseException as error:
            self.error = error
            self._failed.set()
            raise


@dataclass(frozen=True, slots=True)
class _Batch:
    """Consecutive records of one queue as read, and the bytes of the budget they hold until written."""

    records: JoinedRecords
    held: int
    commitlog_end: int  # where the record after the last one lies in the cold commit log


@dataclass(frozen=True, slots=True)
class _Skip:
    """The queue goes on at ``offset``: the offsets before it were never archived."""

    offset: int


async def _read_units(flat_file: FlatMessageFile, offset: int, count: int) -> np.ndarray:
    """Up to ``count`` archived units from ``offset`` (fewer where a hole, the end or the storage object
    holding them comes first), one read."""
    name = f"{flat_file.topic}/{flat_file.queue_id}"
    consume_queue = flat_file.consume_queue
    raw = await consume_queue.read_from(offset * UNIT_SIZE, count * UNIT_SIZE)
    whole = len(raw) - len(raw) % UNIT_SIZE
    if whole < len(raw):
        # The object ends inside a unit (a commit split across objects): that unit is read on its own.
        raw = raw[:whole] if whole else await consume_queue.read(offset * UNIT_SIZE, UNIT_SIZE)
    if len(raw) % UNIT_SIZE:
        raise CorruptRecordError(
            f"cold consume queue of {name} returned {len(raw)} bytes, not whole units", offset=offset * UNIT_SIZE
        )
    if not raw:
        raise NotFoundError(f"cold queue {name} has no unit at offset {offset}")
    units = np.frombuffer(raw, dtype=UNIT_DTYPE)
    broken = np.flatnonzero((units["commitlog_offset"] < 0) | (units["size"] < 0))
    if len(broken):
        index = int(broken[0])
        raise CorruptRecordError(
            f"cold consume queue of {name} has a unit with negative offset {int(units['commitlog_offset'][index])} "
            f"or size {int(units['size'][index])} at queue offset {offset + index}",
            offset=(offset + index) * UNIT_SIZE,
        )
    return units


async def _read_batch(
    flat_file: FlatMessageFile, units: np.ndarray, offset: int, request: RestoreRequest, budget: _ByteBudget
) -> _Batch:
    """The records of ``units`` (from queue offset ``offset``) cut at ``batch_bytes`` (at least one record).

    One commit-log read, once its bytes fit in the budget, to the end of the storage object holding them
    at most (the records that object holds whole are the batch).
    """
    positions = units["commitlog_offset"].astype(np.int64)
    start = int(positions[0])
    ends = positions + units["size"].astype(np.int64) - start
    over = np.flatnonzero(ends > request.batch_bytes)
    taken = max(1, int(over[0])) if len(over) else len(units)
    positions, ends = positions[:taken] - start, ends[:taken]
    length = int(ends.max())
    held = await budget.acquire(length)
    try:
        raw = await flat_file.commit_log.read_from(start, length)
        if len(raw) < length:
            cut = int(np.argmin(ends <= len(raw)))  # the first record the read does not hold whole
            if cut:
                positions, ends = positions[:cut], ends[:cut]
                if int(ends.max()) < len(raw):
                    raw = raw[: int(ends.max())]
            else:
                raw = await flat_file.read_commit_log(start, length)
    except BaseException:
        await budget.release(held)
        raise
    short = np.flatnonzero((positions < 0) | (ends > len(raw)))
    if len(short):
        await budget.release(held)
        raise NotFoundError(
            f"cold commit log of {flat_file.topic}/{flat_file.queue_id} ends before the record at queue offset "
            f"{offset + int(short[0])}"
        )
    sizes = ends - positions
    if positions[0] != 0 or (positions[1:] != ends[:-1]).any() or len(raw) != ends[-1]:
        # Not back to back (never so in a commit log the archiver wrote): each record is cut out.
        view = memoryview(raw)
        raw = b"".join(view[begin:stop] for begin, stop in zip(positions.tolist(), ends.tolist(), strict=True))
    return _Batch(JoinedRecords(raw, sizes.tolist()), held, start + int(ends[-1]))


async def _read_following(
    flat_file: FlatMessageFile,
    offset: int,
    count: int,
    commitlog_offset: int,
    record_bytes: float,
    request: RestoreRequest,
    budget: _ByteBudget,
) -> _Batch | None:
    """Up to ``count`` records from ``offset``, split out of the commit log from ``commitlog_offset``,
    where the batch before ended: one read, and no consume-queue read.

    A queue's cold commit log holds its records back to back in queue-offset order; each record split
    out by its TOTALSIZE must carry this queue's id and the next queue offset. None when they do not (a
    segment gone, damage): the consume queue then says where the records are.
    """
    wanted = min(request.batch_bytes, max(MIN_RECORD_SIZE, math.ceil(record_bytes * count)))
    held = await budget.acquire(wanted)
    try:
        raw = await flat_file.commit_log.read_from(commitlog_offset, wanted)
    except (NotFoundError, SegmentNotFoundError):
        raw = b""
    except BaseException:
        await budget.release(held)
        raise
    ends = np.asarray(split_back_to_back(raw, count), dtype=np.int64)
    found = len(ends) - 1
    if found:
        heads = gather(np.frombuffer(raw, dtype=np.uint8), ends[:-1], RECORD_HEAD_DTYPE)
        expected = np.arange(offset, offset + found, dtype=np.int64)
        if (heads["queue_offset"] != expected).any() or (heads["queue_id"] != flat_file.queue_id).any():
            found = 0
    if not found:
        await budget.release(held)
        return None
    if ends[-1] < len(raw):
        raw = raw[: int(ends[-1])]
    return _Batch(JoinedRecords(raw, np.diff(ends).tolist()), held, commitlog_offset + int(ends[-1]))


async def _check_resume(flat_file: FlatMessageFile, sink: RestoreSink, queue_offset: int) -> None:
    """Refuse to resume into a target whose last record held is not the archive's message at that offset.

    A target that already holds offsets is taken for an earlier, interrupted restore of this archive. A
    hot store producers wrote into after it was replaced holds other messages at those offsets: going
    on would mix them with the archive's, and its own would never be archived.
    """
    topic, queue_id = flat_file.topic, flat_file.queue_id
    held = await asyncio.to_thread(sink.held_record, topic, queue_id, queue_offset)
    if held is None:
        return
    try:
        archived = await flat_file.read_messages(queue_offset, 1)
    except NotFoundError:
        return  # not archived (expired or lost): nothing to compare with
    if archived and not same_but_physical_offset(held, archived[0]):
        raise ValidationError(
            f"{sink.description} holds a different message at {topic}/{queue_id} offset {queue_offset} than the "
            f"archive: it is not an earlier restore of it (producers wrote into it?); restore into an empty "
            f"directory instead"
        )


async def restore_archive(
    node: ReadNode,
    request: RestoreRequest,
    sink: RestoreSink,
    *,
    dry_run: bool = False,
    on_plan: Callable[[list[QueueOutcome]], None] | None = None,
    on_progress: Callable[[QueueOutcome, int], None] | None = None,
) -> RestoreSummary:
    """Restore every chosen queue into ``sink``; ``on_progress(queue, messages)`` after each batch."""
    checked_topic(request.topic)
    started = time.perf_counter()
    positions = await asyncio.to_thread(node.metadata.list_queues, request.topic)
    if request.queue_id is not None:
        positions = [p for p in positions if p.queue_id == request.queue_id]
    if not positions:
        what = request.topic if request.queue_id is None else f"{request.topic}/{request.queue_id}"
        raise NotFoundError(f"nothing of {what} is archived (not in the metadata store)")
    summary = RestoreSummary(dry_run=dry_run, target=sink.description)
    work: list[tuple[FlatMessageFile, QueueOutcome]] = []
    for position in positions:
        rows = await asyncio.to_thread(
            segment_rows, node.metadata, node.flat.queue_path(position.topic, position.queue_id)
        )
        flat_file = archived_queue(node.flat, position, rows)
        first, end = await _queue_range(node, flat_file, request)
        resumed = await asyncio.to_thread(sink.resume_offset, position.topic, position.queue_id, first, end)
        if resumed > first:
            await _check_resume(flat_file, sink, resumed - 1)
        outcome = QueueOutcome(position.topic, position.queue_id, first, end, resumed)
        outcome.lost = [
            (max(start, resumed), min(stop, end))
            for start, stop in flat_file.lost_ranges
            if start < end and stop > resumed
        ]
        if outcome.lost and not sink.holds_gaps:
            outcome.stopped_at = outcome.lost[0][0]
        summary.queues.append(outcome)
        work.append((flat_file, outcome))
    if on_plan is not None:
        on_plan(summary.queues)
    if not dry_run:
        budget = _ByteBudget(request.max_bytes_in_flight)
        pending = iter(work)
        with _Writer(sink) as writer:

            async def worker() -> None:
                for flat_file, outcome in pending:
                    await _restore_queue(flat_file, outcome, request, sink, on_progress, budget, writer)

            workers = [asyncio.create_task(worker()) for _ in range(min(request.parallel, len(work)))]
            try:
                await asyncio.gather(*workers)
            except BaseException as error:
                for task in workers:
                    task.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
                if isinstance(error, _Abandoned) and writer.error is not None:
                    # Another queue's write failed first: its error is the restore's.
                    raise writer.error from None
                raise
        summary.peak_bytes_in_flight = budget.peak
    summary.seconds = time.perf_counter() - started
    return summary


async def _restore_queue(
    flat_file: FlatMessageFile,
    outcome: QueueOutcome,
    request: RestoreRequest,
    sink: RestoreSink,
    on_progress: Callable[[QueueOutcome, int], None] | None,
    budget: _ByteBudget,
    writer: _Writer,
) -> None:
    """Read ahead of the writes (``read_ahead`` batches, within the budget) and write in queue-offset order.

    The writes of all queues take turns in ``writer``'s one thread, so one batch is written at a time.
    """
    end = outcome.end if outcome.stopped_at is None else outcome.stopped_at
    ahead: asyncio.Queue[_Batch | _Skip | None] = asyncio.Queue(maxsize=request.read_ahead)

    async def read_all() -> None:
        offset = outcome.resumed_at
        # Units are read only where a batch does not follow the one before (the first, after a hole).
        units, units_at = np.empty(0, dtype=UNIT_DTYPE), offset
        # (queue offset, commit-log offset, mean record size): where the next batch probably starts; from
        # the oldest record, most likely the commit log's start (a batch checks its records either way).
        guess = flat_file.first_record_guess() if offset == flat_file.min_offset else None
        follows = None if guess is None else (offset, guess[0], guess[1])
        while offset < end:
            if flat_file.next_archived_offset(offset) != offset:
                # Never archived: the sink goes on after the hole (only a sink that holds gaps gets here).
                offset = min(flat_file.next_archived_offset(offset), end)
                await ahead.put(_Skip(offset))
                continue
            count = min(request.batch_messages, end - offset, flat_file.archived_run_end(offset) - offset)
            batch = None
            if follows is not None and follows[0] == offset:
                batch = await _read_following(flat_file, offset, count, follows[1], follows[2], request, budget)
            if batch is None:
                if not 0 <= offset - units_at < len(units):
                    units, units_at = await _read_units(flat_file, offset, count), offset
                within = offset - units_at
                batch = await _read_batch(flat_file, units[within : within + count], offset, request, budget)
            try:
                await ahead.put(batch)
            except BaseException:
                await budget.release(batch.held)
                raise
            offset += len(batch.records)
            follows = (offset, batch.commitlog_end, len(batch.records.data) / len(batch.records))
        await ahead.put(None)

    reader = asyncio.create_task(read_all())
    try:
        while True:
            taking = asyncio.ensure_future(ahead.get())
            await asyncio.wait((taking, reader), return_when=asyncio.FIRST_COMPLETED)
            if not taking.done():
                taking.cancel()
                reader.result()  # the reader failed: its error is the queue's
                item = await ahead.get()  # (it cannot end without its sentinel)
            else:
                item = taking.result()
            if item is None:
                break
            if isinstance(item, _Skip):
                await asyncio.to_thread(sink.skip_to, outcome.topic, outcome.queue_id, item.offset)
                continue
            try:
                await writer.write(outcome.topic, outcome.queue_id, item.records)
            finally:
                await budget.release(item.held)
            outcome.restored += len(item.records)
            outcome.bytes += len(item.records.data)
            if on_progress is not None:
                on_progress(outcome, len(item.records))
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        while not ahead.empty():
            left = ahead.get_nowait()
            if isinstance(left, _Batch):
                await budget.release(left.held)
    await asyncio.to_thread(sink.finish_queue, outcome.topic, outcome.queue_id)


def _lost_notes(summary: RestoreSummary) -> list[str]:
    """One line per hole met and per queue stopped at one, for people."""
    notes = []
    for queue in summary.queues:
        name = f"{queue.topic}/{queue.queue_id}"
        for start, end in queue.lost:
            if queue.stopped_at is not None and start > queue.stopped_at:
                continue
            if summary.dry_run:
                verb = "would be skipped" if queue.stopped_at is None else "would not be restored"
            else:
                verb = "skipped" if queue.stopped_at is None else "not restored"
            notes.append(f"{name}: offsets [{start}, {end}) were lost before they were archived; {verb}")
        if queue.stopped_at is not None:
            after = queue.lost[0][1]
            notes.append(
                f"{name}: stopped at offset {queue.stopped_at}: a hot store cannot hold a gap in a queue's offsets; "
                f"{queue.remaining} archived messages after it were not restored (restore them with "
                f"--from-offset {after} into an empty hot store, or with --to-dir)"
            )
    return notes


# ---- the command ------------------------------------------------------------------------------------


class _RateColumn(ProgressColumn):
    """Messages per second over the task so far."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} msg/s" if speed else "- msg/s", style="progress.data.speed")


@app.command("restore")
def restore(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="The topic to restore.")],
    queue_id: Annotated[int | None, typer.Option("--queue", "-q", help="Only this queue.")] = None,
    from_offset: Annotated[int | None, typer.Option(min=0, help="First queue offset (inclusive).")] = None,
    to_offset: Annotated[int | None, typer.Option(min=0, help="Last queue offset (exclusive).")] = None,
    since: Annotated[str | None, typer.Option(help="Stored at or after (epoch ms, ISO-8601, 2d ...).")] = None,
    until: Annotated[str | None, typer.Option(help="Stored at or before (epoch ms, ISO-8601, now ...).")] = None,
    to_store: Annotated[Path | None, typer.Option(help="A hot store directory: offsets are kept.")] = None,
    to_dir: Annotated[Path | None, typer.Option(help="Export into this directory, one file per queue.")] = None,
    fmt: Annotated[
        ExportFormat | None, typer.Option("--format", help="With --to-dir: jsonl (default) or raw records.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be restored; write nothing.")] = False,
    batch: Annotated[
        int, typer.Option(min=1, help="Messages per read from cold storage (at most 16 MiB of them).")
    ] = DEFAULT_BATCH_MESSAGES,
    parallel: Annotated[int, typer.Option(min=1, help="Queues restored at once.")] = 4,
    in_flight_mib: Annotated[
        int, typer.Option(min=1, help="Cap on record MiB read from cold storage and not yet written.")
    ] = 32,
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: on a terminal).")
    ] = None,
) -> None:
    """Rehydrate archived messages into a hot store (offsets preserved) or export them to files.

    Re-running after an interruption continues where the last run stopped and never duplicates.

    Examples: tieredstore restore Orders --to-store /var/lib/tieredstore/hot ·
    tieredstore restore Orders --queue 2 --since 2024-05-01T00:00:00Z --to-dir ./export --format raw
    """
    cli = state(ctx)
    checked_topic(topic)
    if queue_id is not None:
        checked_queue_id(queue_id)
    if (to_store is None) == (to_dir is None):
        raise ValidationError("give exactly one target: --to-store DIR or --to-dir DIR")
    if to_store is not None and fmt is not None:
        raise ValidationError("--format applies to --to-dir only (a hot store holds records as they are)")
    request = RestoreRequest(
        topic,
        queue_id,
        from_offset,
        to_offset,
        parse_time(since) if since is not None else None,
        parse_time(until) if until is not None else None,
        batch_messages=batch,
        parallel=parallel,
        max_bytes_in_flight=in_flight_mib * MIB,
    )
    show = progress if progress is not None else cli.output.err.is_terminal
    if not dry_run:
        _return_large_buffers_to_the_system()

    async def go() -> RestoreSummary:
        async with open_read_node(cli.config) as node:
            sink: RestoreSink
            if to_store is not None:
                if to_store.resolve() == cli.config.hot_dir.resolve() and not dry_run:
                    cli.output.note(f"restoring into this node's own hot store {to_store}")
                try:
                    sink = HotStoreSink(to_store, node, dry_run=dry_run)
                except StoreLockedError as error:
                    raise ConfigError(f"{error} (stop `tieredstore run` on it first)") from error
            else:
                assert to_dir is not None
                sink = DirectorySink(to_dir, fmt or "jsonl", dry_run=dry_run)
            try:
                rate = (_RateColumn(), TextColumn("ETA"), TimeRemainingColumn())
                with cli.output.progress(show and not dry_run, *rate) as bar:
                    tasks: list[TaskID] = []

                    def planned(queues: list[QueueOutcome]) -> None:
                        total = sum(q.planned for q in queues)
                        tasks.append(bar.add_task(f"restore {topic}", total=total))

                    def advanced(_queue: QueueOutcome, count: int) -> None:
                        bar.advance(tasks[0], count)

                    return await restore_archive(
                        node, request, sink, dry_run=dry_run, on_plan=planned, on_progress=advanced
                    )
            finally:
                await asyncio.to_thread(sink.close)

    summary = run(go())
    if cli.output.is_json:
        cli.output.json(summary.as_json())
    else:
        rows = summary.as_json()["queues"]
        cli.output.table(
            "restore plan" if dry_run else "restored",
            ("topic", "queue_id", "first", "end", "already_done", "restored", "remaining", "bytes"),
            rows,
        )
        totals = summary.as_json()
        cli.output.record(
            "dry run: nothing was written" if dry_run else "summary",
            {k: totals[k] for k in ("target", "messages", "bytes", "seconds", "messages_per_second")},
        )
    for note in _lost_notes(summary):
        cli.output.note(note)
    stopped = [q for q in summary.queues if q.stopped_at is not None]
    if stopped:
        where = ", ".join(f"{q.topic}/{q.queue_id} at {q.stopped_at}" for q in stopped)
        raise NotFoundError(
            f"{'the restore would stop' if dry_run else 'restore stopped'} where offsets were lost before they "
            f"were archived ({where}); everything before was {'to be ' if dry_run else ''}restored, see above"
        )
