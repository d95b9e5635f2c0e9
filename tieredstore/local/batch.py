"""Batch reads of one hot queue: the archiver's read path, without Python work per message.

``read_batch`` of the hot store (writer or follower) returns a :class:`HotBatch`: the queue's records
from one offset copied back to back into one buffer, their consume-queue units as one numpy array and
their store timestamps. The units of the whole range come from the consume-queue files in one slice
per file; the records of one queue are scattered over the shared commit log, so each is one slice of
its mapped file, joined once. Every check (TOTALSIZE and magic against the unit; for a follower also
PHYSICALOFFSET, queue id and offset, topic, lengths, tag hash) runs on all records at once over a
gather of their headers (the batch record engine, formats.records); only a follower's body CRC is
computed per record. A record that fails is reported as the per-record readers report it: a
CorruptRecordError naming topic, queue, queue offset and commit-log offset.

Nothing here keeps a buffer of a mapped file: retention unmaps files while reads run in other
threads, and an mmap with exported buffers cannot be closed. Slices of an mmap are copies.
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tieredstore.errors import CorruptRecordError, NotFoundError
from tieredstore.formats.arrays import UNIT_DTYPE
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import MIN_RECORD_SIZE
from tieredstore.formats.records import (
    HEAD_DTYPE,
    BoolArray,
    Expected,
    Int64Array,
    Layout,
    first_problem,
    gather_heads,
    records_holding,
    store_timestamps_of,
    tag_hashes_of,
)
from tieredstore.local.mapped_file import release_files_below, release_mapped_pages

# How much of a file a batch read unmapping as it goes (``copy_records``) holds mapped at most.
UNMAP_STEP = 4 << 20


class MappedRegion(Protocol):
    """A mapped store file: where it starts in its address space, where it ends, and the mapping."""

    released_upto: int  # bytes from the file start whose pages ``release_files_below`` unmapped already

    @property
    def start_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    @property
    def buffer(self) -> mmap.mmap: ...


class SharedWindow:
    """The commit-log pages that the batch reads of several queues share (the archiver's, one per queue).

    Records of many queues lie interleaved in the commit log, so the pages one queue's batch maps hold
    the next queues' records too. A read through the window (``read_batch(..., window=...)``) leaves the
    pages it copied mapped for them, except what lies below its file's release mark (released already:
    nothing would release it again) or more than ``span`` bytes behind the furthest any read reached (a
    queue far behind must not keep the log mapped): those it unmaps as it goes, as an unmapping read
    does, and what other reads left behind the window with them. The window's owner releases the rest
    (``release_pages``) once every queue has read past it.
    """

    def __init__(self, span: int) -> None:
        self.span = span
        self.furthest = 0  # the furthest commit-log offset any read through the window copied up to
        self.released_below = 0  # where the reads last released the log behind the window

    def reached(self, position: int) -> None:
        if position > self.furthest:
            self.furthest = position

    @property
    def floor(self) -> int:
        """Pages below this commit-log offset are out of the window."""
        return self.furthest - self.span


@dataclass(frozen=True, slots=True, eq=False)
class HotBatch:
    """Consecutive records of one hot queue from ``first_offset``, back to back in ``data``.

    ``units`` are their hot consume-queue units (UNIT_DTYPE), ``starts`` where each record begins in
    ``data``, ``heads`` their fixed headers (HEAD_DTYPE) and ``store_timestamps`` their STORETIMESTAMPs.
    ``data`` is the caller's to keep or hand on (the cold commit log takes it over, see
    ``FlatMessageFile.append_records``).
    """

    topic: str
    queue_id: int
    first_offset: int
    data: bytearray
    units: np.ndarray
    starts: Int64Array
    heads: np.ndarray
    store_timestamps: Int64Array

    @classmethod
    def empty(cls, topic: str, queue_id: int, first_offset: int) -> HotBatch:
        nothing = np.zeros(0, dtype=np.int64)
        return cls(
            topic,
            queue_id,
            first_offset,
            bytearray(),
            np.zeros(0, UNIT_DTYPE),
            nothing,
            np.zeros(0, HEAD_DTYPE),
            nothing,
        )

    def __len__(self) -> int:
        return len(self.units)

    @property
    def next_offset(self) -> int:
        return self.first_offset + len(self.units)

    @property
    def sizes(self) -> Int64Array:
        return self.units["size"].astype(np.int64)

    @property
    def tag_hashes(self) -> Int64Array:
        return self.units["tag_hash"].astype(np.int64)

    @property
    def record_bytes(self) -> int:
        return len(self.data)

    def record(self, index: int) -> bytes:
        """The bytes of the ``index``-th record."""
        start = int(self.starts[index])
        return bytes(self.data[start : start + int(self.units["size"][index])])

    def records_holding(self, markers: Sequence[bytes]) -> list[int]:
        """Indexes of the records whose properties contain one of ``markers`` (``formats.records.records_holding``)."""
        return records_holding(self, Layout.of(self), markers)


def units_from(files: Sequence[MappedRegion], queue_offset: int, count: int) -> bytes:
    """The raw units of ``count`` slots from ``queue_offset``, from consume-queue ``files`` (sorted by start).

    Stops early where no mapped file holds the next slot (so the result may be shorter). A file
    unmapped meanwhile (retention in another thread) is NotFoundError.
    """
    pieces: list[bytes] = []
    position = queue_offset * UNIT_SIZE
    end = (queue_offset + count) * UNIT_SIZE
    starts = [file.start_offset for file in files]
    index = int(np.searchsorted(starts, position, side="right")) - 1
    while position < end and 0 <= index < len(files):
        file = files[index]
        if not file.start_offset <= position < file.end_offset:
            break
        local = position - file.start_offset
        usable = (file.end_offset - file.start_offset) - local
        take = min(end - position, usable - usable % UNIT_SIZE)
        if take <= 0:
            break
        try:
            pieces.append(file.buffer[local : local + take])
        except ValueError as exc:
            raise NotFoundError(f"consume-queue offset {position // UNIT_SIZE} was just deleted") from exc
        position += take
        index += 1
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def parse_units(raw: bytes, max_bytes: int) -> np.ndarray:
    """``raw`` units as a UNIT_DTYPE array, cut before ``max_bytes`` of records (the first always stays)."""
    units = np.frombuffer(raw, dtype=UNIT_DTYPE, count=len(raw) // UNIT_SIZE)
    if len(units) > 1:
        total = np.cumsum(units["size"], dtype=np.int64)
        units = units[: max(1, int(np.searchsorted(total, max_bytes, side="right")))]
    return units


def located_prefix(files: Sequence[MappedRegion], units: np.ndarray) -> tuple[int, Int64Array, Int64Array]:
    """How many leading units have their record wholly in one of the commit-log ``files``, with each
    unit's file index and position in it."""
    offsets = units["commitlog_offset"].astype(np.int64)
    sizes = units["size"].astype(np.int64)
    file_starts = np.array([file.start_offset for file in files], dtype=np.int64)
    file_ends = np.array([file.end_offset for file in files], dtype=np.int64)
    which = np.searchsorted(file_starts, offsets, side="right") - 1
    held = which >= 0
    safe = np.where(held, which, 0)
    if len(files):
        held &= (offsets + sizes <= file_ends[safe]) & (sizes > 0)
    else:
        held[:] = False
    count = len(units) if bool(held.all()) else int(np.argmin(held))
    local = offsets - (file_starts[safe] if len(files) else 0)
    return count, safe[:count], local[:count]


def copy_records(
    files: Sequence[MappedRegion],
    which: Int64Array,
    local: Int64Array,
    sizes: Int64Array,
    *,
    unmap_below: int | None = None,
    window: SharedWindow | None = None,
) -> bytearray:
    """The records at ``local`` in file ``which`` (sizes ``sizes``) joined into one buffer.

    Records that lie back to back in one file (a producer's batch to one queue) are copied as one slice.
    With ``unmap_below`` (a commit-log offset), the pages copied from below it are unmapped from this
    process every UNMAP_STEP bytes of file, as the copy goes: a reader that reads each record once (the
    archiver) then holds at most a step of the commit log mapped per batch being read, where one batch
    of a queue among many spans far more (4 MiB of one of 16 queues: 64 MiB). The pages stay in the page
    cache; another queue's batch that needs one of them maps it again. With ``window`` instead, only the
    pages out of the shared window are unmapped as the copy goes (see SharedWindow).
    """
    if not len(which):
        return bytearray()
    ends = local + sizes
    breaks = np.flatnonzero((local[1:] != ends[:-1]) | (which[1:] != which[:-1])) + 1
    firsts = np.concatenate(([0], breaks))
    lasts = np.concatenate((breaks - 1, [len(which) - 1]))
    buffers = [file.buffer for file in files]
    begins = local[firsts]
    finishes = ends[lasts]
    run_files = which[firsts]
    try:
        if unmap_below is not None or window is not None:
            return _copy_unmapping(files, run_files, begins, finishes, unmap_below, window)
        if int(which[0]) == int(which[-1]):
            buffer = buffers[int(which[0])]
            return bytearray().join(
                [buffer[begin:end] for begin, end in zip(begins.tolist(), finishes.tolist(), strict=True)]
            )
        return bytearray().join(
            [
                buffers[w][begin:end]
                for w, begin, end in zip(run_files.tolist(), begins.tolist(), finishes.tolist(), strict=True)
            ]
        )
    except ValueError as exc:
        raise NotFoundError("a commit-log file was just deleted by retention") from exc


def _copy_unmapping(
    files: Sequence[MappedRegion],
    run_files: Int64Array,
    begins: Int64Array,
    finishes: Int64Array,
    unmap_below: int | None,
    window: SharedWindow | None,
) -> bytearray:
    """``copy_records``' copy of the runs, unmapping each UNMAP_STEP of file once its runs are copied
    (below ``unmap_below``, or out of ``window``)."""
    # Runs in the same file and the same UNMAP_STEP of it are copied together, then their pages released.
    steps = run_files * (1 << 48) + begins // UNMAP_STEP
    cuts = np.concatenate(([0], np.flatnonzero(steps[1:] != steps[:-1]) + 1, [len(steps)])).tolist()
    run_files_list, begins_list, finishes_list = run_files.tolist(), begins.tolist(), finishes.tolist()
    copies: list[bytes] = []
    released: dict[int, int] = {}  # per file, where the pages released so far end
    for low, high in itertools.pairwise(cuts):
        which = run_files_list[low]
        file = files[which]
        buffer = file.buffer
        # Slices of an mmap are copies: once taken, their pages may go.
        copies += [buffer[begin:end] for begin, end in zip(begins_list[low:high], finishes_list[low:high], strict=True)]
        finish = finishes_list[high - 1]
        if window is None:
            assert unmap_below is not None
            below = unmap_below - file.start_offset
        else:
            window.reached(file.start_offset + finish)
            if window.floor >= window.released_below + UNMAP_STEP:
                # What the other queues' reads left mapped behind the window goes too, a step at a time.
                window.released_below = window.floor
                release_files_below(files, window.floor)
            # The mark is read after the copy and raised before its release unmaps: a page copied here
            # is either below the mark read now, or unmapped by that release.
            below = max(file.released_upto, window.floor - file.start_offset)
        # From where the last step ended: a fault maps the pages around it too, gaps between records included.
        begin = released.setdefault(which, begins_list[low])
        end = min(finish, below)
        if end > begin:
            release_mapped_pages(buffer, begin, end)
            released[which] = end
    return bytearray().join(copies)


def build(topic: str, queue_id: int, first_offset: int, units: np.ndarray, data: bytearray) -> HotBatch:
    """A HotBatch of ``units`` whose records are ``data``; headers and store timestamps gathered at once.

    Headers of records shorter than HEAD_BYTES read into the next record: check sizes before trusting them.
    """
    sizes = units["size"].astype(np.int64)
    starts = np.zeros(len(units), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    heads = gather_heads(data, starts)
    return HotBatch(topic, queue_id, first_offset, data, units.copy(), starts, heads, store_timestamps_of(heads))


def _first(bad: BoolArray) -> int | None:
    return int(np.argmax(bad)) if bool(bad.any()) else None


def check_written(batch: HotBatch) -> None:
    """The writer's own records: each a whole message whose TOTALSIZE and magic agree with its unit.

    CorruptRecordError for the first that is not (the same check ``check_unit_record`` makes one by one).
    """
    index = first_problem(batch, _WRITTEN)
    if index is None:
        return
    size = int(batch.sizes[index])
    heads = batch.heads
    total, found = (int(heads["total_size"][index]), int(heads["magic"][index])) if size >= 8 else (0, 0)
    raise CorruptRecordError(
        f"hot record of {batch.topic}/{batch.queue_id} offset {batch.first_offset + index}: the consume-queue "
        f"unit says {size} bytes but the record header says {total} (magic 0x{found:08x}; a message is at "
        f"least {MIN_RECORD_SIZE} bytes)",
        location="commitlog",
        offset=int(batch.units["commitlog_offset"][index]),
    )


# The writer's records are checked for what its own writes could get wrong only: size and magic.
_WRITTEN = Expected(check_crc=False, head_only=True)


def followed_expected(batch: HotBatch, topic_raw: bytes) -> Expected:
    """What each record of a followed store's batch must be: ``record_problem``'s rule for every record."""
    return Expected(
        topic=topic_raw,
        queue_id=batch.queue_id,
        queue_offsets=batch.first_offset,
        physical_offsets=batch.units["commitlog_offset"].astype(np.int64),
        tag_hashes=batch.tag_hashes,
        terminated=True,
    )


def followed_problems(batch: HotBatch, topic_raw: bytes) -> int | None:
    """Index of the first record of a followed store that ``record_problem`` would refuse, or None.

    The same checks, all records at once (``formats.records.first_problem``): magic, TOTALSIZE,
    PHYSICALOFFSET, queue id and offset, the body, topic and properties lengths ending at the record's
    end, the topic, a final 0x02, the tag hash and the body CRC.
    """
    if not len(batch):
        return None
    return first_problem(batch, followed_expected(batch, topic_raw))


def record_tag_hashes(batch: HotBatch, properties_at: Int64Array, count: int) -> Int64Array:
    """The tag hash a writer gives each of the first ``count`` records (``tag_hash_of`` their properties),
    computed only for the records whose properties hold TAGS: the rest are 0."""
    return tag_hashes_of(batch, Layout.of(batch), np.arange(count, dtype=np.int64))


class WrittenLog(Protocol):
    """The writer's commit log as ``read_written`` needs it."""

    @property
    def files(self) -> Sequence[MappedRegion]: ...

    @property
    def min_offset(self) -> int: ...

    @property
    def write_offset(self) -> int: ...

    @property
    def flushed_offset(self) -> int: ...


def read_written(
    log: WrittenLog,
    topic: str,
    queue_id: int,
    first_offset: int,
    units: np.ndarray,
    *,
    unmap: bool = False,
    window: SharedWindow | None = None,
) -> HotBatch:
    """The writer's records of ``units`` (from ``first_offset``) as a checked HotBatch.

    ``unmap``: unmap the flushed pages copied from as the copy goes; ``window``: only those out of the
    shared window (``copy_records``).

    NotFoundError when a record is no longer (or not) in the hot store: retention deleted its file.
    """
    if not len(units):
        return HotBatch.empty(topic, queue_id, first_offset)
    sizes = units["size"].astype(np.int64)
    short = _first(sizes < MIN_RECORD_SIZE)
    if short is not None:
        raise CorruptRecordError(
            f"hot record of {topic}/{queue_id} offset {first_offset + short}: the consume-queue unit says "
            f"{int(sizes[short])} bytes, less than any message ({MIN_RECORD_SIZE})",
            location="commitlog",
            offset=int(units["commitlog_offset"][short]),
        )
    offsets = units["commitlog_offset"].astype(np.int64)
    ends = offsets + sizes
    files = list(log.files)
    if int(offsets[0]) < log.min_offset or int(ends.max()) > log.write_offset:
        raise NotFoundError(
            f"records of {topic}/{queue_id} from offset {first_offset} are no longer (or not yet) in the hot store"
        )
    count, which, local = located_prefix(files, units)
    if count < len(units):
        raise NotFoundError(
            f"the record of {topic}/{queue_id} offset {first_offset + count} is not in one commit-log file"
        )
    data = copy_records(files, which, local, sizes, unmap_below=log.flushed_offset if unmap else None, window=window)
    batch = build(topic, queue_id, first_offset, units, data)
    check_written(batch)
    return batch
