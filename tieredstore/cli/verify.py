"""``tieredstore verify``: check cold storage against metadata and the archive invariant, changing nothing.

Per queue: every live segment row has its object with the recorded size (MISSING_OBJECT,
SIZE_MISMATCH), segments of a file follow on without gap or overlap (SEGMENT_GAP), the consume
queue spans the recorded offsets (OFFSET_RANGE), and no object exists that metadata does not
account for (ORPHAN_OBJECT, also whole topic or queue folders). Then the exactly-once invariant:
consume-queue units tile the commit log contiguously up to its end (COMMIT_LOG_GAP,
COMMIT_LOG_OVERLAP, ORPHAN_BYTES ...). ``deep`` reads every record as well, checking its CRC, size,
queue offset, PHYSICALOFFSET and tag hash (``tieredstore.flat.checker``); a compressed or encrypted frame
that does not authenticate or decode is CORRUPT_FRAME, where the queue's walk stops; one whose key the keyring
lacks (or holds other material under its id) is READ_FAILED. Every kind named here is a
``ProblemKind``, the one vocabulary this command, the checker and the JSON output share.

Offsets the hot store lost before they were archived are a recorded hole in the consume queue
(``FlatMessageFile.skip_to``): a SEALED segment ending before the next one's base. That is not a
SEGMENT_GAP; the walk steps over it (``archived_runs``) and the commit log must run on unbroken
across it, or the hole lost archived messages (UNRECORDED_GAP). A gap after a segment that was never
sealed, and any gap in the commit log, is still a SEGMENT_GAP.

The last segment of a file may hold bytes beyond its row while the archiver is between a commit
and its metadata update; that is a note (recovery settles it), not a problem. So are bytes past the
recorded size of a SEALED segment that the next segment follows on from (or that is the last one):
recovery under leases cuts orphan bytes by sealing the segment there instead of deleting them
(``FlatAppendFile.abandon_tail``), and no read goes past a recorded size.

Checking everything (no TOPIC) also checks the key index of every namespace: each uploaded index
file has its object with the recorded size (MISSING_OBJECT, SIZE_MISMATCH), and no INDEX object
exists that the catalogue does not know (ORPHAN_OBJECT); ``deep`` reads each one through, so a frame of
it that does not authenticate or decode is CORRUPT_FRAME. An object of a file still SEALED is an
upload in progress: a note.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Protocol

import typer

from tieredstore.basics import check_queue_id
from tieredstore.cli.app import IntegrityFailure, app, state
from tieredstore.cli.common import checked_topic, run
from tieredstore.errors import (
    CorruptRecordError,
    IntegrityError,
    MetadataCorruptError,
    MissingKeyError,
    NotFoundError,
    SegmentNotFoundError,
    ValidationError,
    WrongKeyError,
)
from tieredstore.flat.checker import ProblemKind, check_queue_invariant
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import MIN_RECORD_SIZE
from tieredstore.formats.naming import FileType, segment_key
from tieredstore.index.service import IndexFileStatus
from tieredstore.metadata import QueuePosition, SegmentRecord, SegmentStatus
from tieredstore.orphans import (
    NO_CATALOGUE_ROW,
    NO_LIVE_ROW,
    abandoned_tail,
    broker_folder,
    index_namespaces,
    orphan_folders,
    uncatalogued_index_files,
    unrecorded_segments,
)
from tieredstore.providers.base import FileSegment
from tieredstore.read.archived import LIVE_STATUSES, archived_queue, archived_range, segment_rows
from tieredstore.read.node import ReadNode, open_read_node

UNIT_BATCH = 8192
# How much of an index file deep verify reads at once: memory stays bounded whatever the file's size.
INDEX_READ_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong, with where it is: an object key or a queue and its offsets."""

    kind: ProblemKind
    location: str
    detail: str
    topic: str | None = None
    queue_id: int | None = None
    file_type: str | None = None
    base_offset: int | None = None
    queue_offset: int | None = None
    commitlog_offset: int | None = None

    def __str__(self) -> str:
        where = self.location
        if self.queue_offset is not None:
            where += f" queue offset {self.queue_offset}"
        if self.commitlog_offset is not None:
            where += f" commit-log offset {self.commitlog_offset}"
        return f"{self.kind} at {where}: {self.detail}"


class ReportProblem(Protocol):
    """Records one problem of the queue being verified; ``where`` holds Problem's location fields."""

    def __call__(self, kind: ProblemKind, detail: str, **where: Any) -> None: ...


@dataclass(slots=True)
class VerifyReport:
    """What ``verify_archive`` checked and found; ``ok`` only without problems."""

    deep: bool
    queues: int = 0
    segments: int = 0
    units: int = 0
    records: int = 0
    index_files: int = 0  # uploaded key-index files checked
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "deep": self.deep,
            "queues": self.queues,
            "segments": self.segments,
            "units": self.units,
            "records": self.records,
            "index_files": self.index_files,
            "problems": [asdict(p) for p in self.problems],
            "notes": list(self.notes),
        }


async def verify_archive(
    node: ReadNode, *, topic: str | None = None, queue_id: int | None = None, deep: bool = False
) -> VerifyReport:
    """Check the archive (all of it, one topic, or one queue) without changing anything."""
    report = VerifyReport(deep=deep)
    positions = await asyncio.to_thread(node.metadata.list_queues, topic)
    if topic is not None:
        if not positions:
            await asyncio.to_thread(node.metadata.get_topic, topic)  # NotFoundError for an unknown topic
        if queue_id is not None:
            positions = [p for p in positions if p.queue_id == queue_id]
            if not positions:
                raise NotFoundError(f"queue {topic}/{queue_id} is not in the metadata store")
    for position in positions:
        await _verify_queue(node, position, report)
        report.queues += 1
    if queue_id is None:
        await _find_orphan_folders(node, topic, {(p.topic, p.queue_id) for p in positions}, report)
    if topic is None:
        await _verify_key_index(node, report)
    return report


async def _verify_key_index(node: ReadNode, report: VerifyReport) -> None:
    """Uploaded index files of every namespace against their objects, and INDEX objects nobody catalogued."""
    config = node.config
    for folder, files in await index_namespaces(node.metadata, node.provider, config.cluster, config.broker):
        for file_id, record in sorted(files.items()):
            if record.status is not IndexFileStatus.UPLOAD:
                continue
            report.index_files += 1
            key = segment_key(folder, FileType.INDEX, file_id)
            segment = node.provider.segment(FileType.INDEX, folder, file_id, commit_position=record.size)
            real = await segment.real_size()
            if real == record.size:
                if report.deep:
                    await _read_index_file(segment, record.size, key, file_id, report)
                continue
            recorded = f"the key index records {record.size} bytes"
            if real == 0 and record.size > 0:
                kind, detail = ProblemKind.MISSING_OBJECT, f"{recorded} (UPLOAD), the object is gone"
            else:
                kind, detail = ProblemKind.SIZE_MISMATCH, f"{recorded}, the provider holds {real}"
            report.problems.append(Problem(kind, key, detail, file_type=FileType.INDEX.value, base_offset=file_id))
        stored = await node.provider.list_segments(folder, FileType.INDEX)
        for file_id in uncatalogued_index_files(stored, files):
            key = segment_key(folder, FileType.INDEX, file_id)
            report.problems.append(
                Problem(
                    ProblemKind.ORPHAN_OBJECT,
                    key,
                    NO_CATALOGUE_ROW,
                    file_type=FileType.INDEX.value,
                    base_offset=file_id,
                )
            )
        for file_id in stored:
            known = files.get(file_id)
            if known is not None and known.status is not IndexFileStatus.UPLOAD:
                key = segment_key(folder, FileType.INDEX, file_id)
                report.notes.append(f"{key}: index file {known.status.value}, its upload is in progress")


async def _read_index_file(segment: FileSegment, size: int, key: str, file_id: int, report: VerifyReport) -> None:
    """Read an uploaded index file through, so that each of its frames is authenticated and decoded."""
    try:
        for position in range(0, size, INDEX_READ_BYTES):
            await segment.read(position, min(INDEX_READ_BYTES, size - position))
    except MetadataCorruptError:
        raise
    except (MissingKeyError, WrongKeyError) as error:
        report.problems.append(
            Problem(ProblemKind.READ_FAILED, key, str(error), file_type=FileType.INDEX.value, base_offset=file_id)
        )
    except IntegrityError as error:
        report.problems.append(
            Problem(ProblemKind.CORRUPT_FRAME, key, str(error), file_type=FileType.INDEX.value, base_offset=file_id)
        )


async def _verify_queue(node: ReadNode, position: QueuePosition, report: VerifyReport) -> None:
    topic, queue_id = position.topic, position.queue_id
    path = node.flat.queue_path(topic, queue_id)
    rows = await asyncio.to_thread(segment_rows, node.metadata, path, list(SegmentStatus))
    live = {kind: [r for r in records if r.status in LIVE_STATUSES] for kind, records in rows.items()}
    before = len(report.problems)

    def problem(kind: ProblemKind, detail: str, **where: Any) -> None:
        report.problems.append(Problem(kind, where.pop("location", path), detail, topic, queue_id, **where))

    for kind, records in live.items():
        await _check_objects(node, path, kind, records, report, problem)
        _check_segment_chain(kind, records, problem)
    _check_offset_range(position, live[FileType.CONSUME_QUEUE], problem)
    unreadable = len(report.problems) > before
    flat_file = archived_queue(node.flat, position, live)
    if unreadable:
        report.notes.append(f"{topic}/{queue_id}: the message walk was skipped, its objects are not as recorded")
        return
    try:
        if report.deep:
            held = sum(end - start for start, end in _runs_to_walk(flat_file))
            for found in await check_queue_invariant(flat_file):
                problem(
                    found.kind,
                    found.detail,
                    queue_offset=found.queue_offset,
                    commitlog_offset=found.commitlog_offset,
                )
            report.records += held
            report.units += held
        else:
            await _walk_units(flat_file, report, problem)
    except (SegmentNotFoundError, CorruptRecordError, NotFoundError, MissingKeyError, WrongKeyError) as error:
        problem(ProblemKind.READ_FAILED, str(error))
    except MetadataCorruptError:
        raise
    except IntegrityError as error:
        # A frame that fails authentication, its checksum or its header: the message names segment and frame.
        problem(ProblemKind.CORRUPT_FRAME, str(error))


async def _check_objects(
    node: ReadNode,
    path: str,
    kind: FileType,
    records: list[SegmentRecord],
    report: VerifyReport,
    problem: ReportProblem,
) -> None:
    for index, row in enumerate(records):
        report.segments += 1
        key = segment_key(path, kind, row.base_offset)
        segment = node.provider.segment(kind, path, row.base_offset, commit_position=row.size)
        real = await segment.real_size()
        where = {"location": key, "file_type": kind.value, "base_offset": row.base_offset}
        if real == row.size:
            continue
        if real == 0 and row.size > 0 and not await segment.exists():
            problem(
                ProblemKind.MISSING_OBJECT,
                f"metadata records {row.size} bytes ({row.status.value}), the object is gone",
                **where,
            )
        elif real < row.size:
            problem(ProblemKind.SIZE_MISMATCH, f"metadata records {row.size} bytes, the provider holds {real}", **where)
        elif index == len(records) - 1 and row.status is SegmentStatus.NEW:
            report.notes.append(f"{key}: {real - row.size} bytes past the recorded size (a commit not yet recorded)")
        elif abandoned_tail(records, index, real):
            # An orphan (scrub removes it) that no read reaches: a note, not a problem.
            report.notes.append(
                f"{key}: {real - row.size} bytes past the recorded size of this sealed segment, left in place "
                "by a recovery under leases (never read)"
            )
        else:
            problem(ProblemKind.SIZE_MISMATCH, f"metadata records {row.size} bytes, the provider holds {real}", **where)
    for base_offset in unrecorded_segments(await node.provider.list_segments(path, kind), records):
        problem(
            ProblemKind.ORPHAN_OBJECT,
            NO_LIVE_ROW,
            location=segment_key(path, kind, base_offset),
            file_type=kind.value,
            base_offset=base_offset,
        )


def _check_segment_chain(kind: FileType, records: list[SegmentRecord], problem: ReportProblem) -> None:
    for previous, current in itertools.pairwise(records):
        end = previous.base_offset + previous.size
        recorded_hole = (
            kind is FileType.CONSUME_QUEUE and previous.status is SegmentStatus.SEALED and current.base_offset > end
        )
        if current.base_offset != end and not recorded_hole:
            what = "gap" if current.base_offset > end else "overlap"
            problem(
                ProblemKind.SEGMENT_GAP,
                f"{kind.value} segment starts at {current.base_offset}, the previous one ends at {end} ({what})",
                file_type=kind.value,
                base_offset=current.base_offset,
            )
    if kind is FileType.CONSUME_QUEUE:
        for row in records:
            if row.base_offset % UNIT_SIZE or (row.status is SegmentStatus.SEALED and row.size % UNIT_SIZE):
                problem(
                    ProblemKind.UNIT_UNREADABLE,
                    f"consume-queue segment at {row.base_offset} ({row.size} bytes) is not whole units",
                    file_type=kind.value,
                    base_offset=row.base_offset,
                )


def _check_offset_range(position: QueuePosition, units: list[SegmentRecord], problem: ReportProblem) -> None:
    if units:
        first = units[0].base_offset // UNIT_SIZE
        end = (units[-1].base_offset + units[-1].size) // UNIT_SIZE
    else:
        first = end = position.max_offset
    if position.max_offset != end or (position.min_offset != first and position.max_offset > position.min_offset):
        problem(
            ProblemKind.OFFSET_RANGE,
            f"metadata records offsets [{position.min_offset}, {position.max_offset}), "
            f"the consume-queue segments hold [{first}, {end})",
        )


def _runs_to_walk(flat_file: FlatMessageFile) -> list[tuple[int, int]]:
    """The archived runs of queue offsets, clipped to what is readable as recorded."""
    low, high = archived_range(flat_file)
    clipped = [(max(start, low), min(end, high)) for start, end in flat_file.archived_runs]
    return [(start, end) for start, end in clipped if start < end]


async def _walk_units(flat_file: FlatMessageFile, report: VerifyReport, problem: ReportProblem) -> None:
    """Units tile the commit log: each starts where the previous record ended, the last ends at its end.

    Recorded holes are stepped over; the first unit after one must still follow the last before it.
    """
    commit_log = flat_file.commit_log
    expected: int | None = None
    previous_end: int | None = None
    for run_start, run_end in _runs_to_walk(flat_file):
        offset = run_start
        while offset < run_end:
            wanted = min(UNIT_BATCH, run_end - offset)
            units = await flat_file.read_units(offset, wanted)
            report.units += len(units)
            for index, unit in enumerate(units):
                queue_offset = offset + index
                if expected is None and unit.commitlog_offset < commit_log.min_offset:
                    problem(
                        ProblemKind.COMMIT_LOG_MISSING,
                        f"the first unit points below the commit log's min offset {commit_log.min_offset}",
                        queue_offset=queue_offset,
                        commitlog_offset=unit.commitlog_offset,
                    )
                elif expected is not None and queue_offset == run_start and unit.commitlog_offset > expected:
                    problem(
                        ProblemKind.UNRECORDED_GAP,
                        f"queue offsets [{previous_end}, {run_start}) are missing from the consume queue but "
                        f"{unit.commitlog_offset - expected} commit-log bytes were archived for them",
                        queue_offset=queue_offset,
                        commitlog_offset=expected,
                    )
                elif expected is not None and unit.commitlog_offset != expected:
                    kind = (
                        ProblemKind.COMMIT_LOG_GAP
                        if unit.commitlog_offset > expected
                        else ProblemKind.COMMIT_LOG_OVERLAP
                    )
                    problem(
                        kind,
                        f"the unit starts at {unit.commitlog_offset}, the previous record ends at {expected}",
                        queue_offset=queue_offset,
                        commitlog_offset=unit.commitlog_offset,
                    )
                if unit.size < MIN_RECORD_SIZE:
                    problem(
                        ProblemKind.SIZE_MISMATCH,
                        f"a unit of {unit.size} bytes is shorter than any record",
                        queue_offset=queue_offset,
                        commitlog_offset=unit.commitlog_offset,
                    )
                expected = unit.commitlog_offset + unit.size
            if len(units) < wanted:
                problem(
                    ProblemKind.UNIT_UNREADABLE,
                    f"{wanted - len(units)} archived units are not readable",
                    queue_offset=offset,
                )
                return
            offset += wanted
        previous_end = run_end
    if expected is None:
        if commit_log.commit_offset > commit_log.min_offset:
            problem(
                ProblemKind.ORPHAN_BYTES,
                f"{commit_log.commit_offset - commit_log.min_offset} commit-log bytes but no archived message",
            )
        return
    if expected > commit_log.commit_offset:
        problem(
            ProblemKind.COMMIT_LOG_MISSING,
            f"the last unit ends at {expected}, the commit log at {commit_log.commit_offset}",
            commitlog_offset=commit_log.commit_offset,
        )
    elif expected < commit_log.commit_offset:
        problem(
            ProblemKind.ORPHAN_BYTES,
            f"{commit_log.commit_offset - expected} commit-log bytes after the last archived record",
            commitlog_offset=expected,
        )


async def _find_orphan_folders(
    node: ReadNode, topic: str | None, known: set[tuple[str, int]], report: VerifyReport
) -> None:
    """Topic and queue folders in storage that metadata knows nothing of."""
    broker_path = broker_folder(node.config.cluster, node.config.broker)
    for folder in await orphan_folders(node.provider, broker_path, topic, known):
        report.problems.append(
            Problem(ProblemKind.ORPHAN_OBJECT, folder.location, folder.describe(), folder.topic, folder.queue_id)
        )


@app.command("verify")
def verify(
    ctx: typer.Context,
    topic: Annotated[str | None, typer.Argument(metavar="[TOPIC]", help="Only this topic (default: all).")] = None,
    queue_id: Annotated[int | None, typer.Option("--queue", "-q", help="Only this queue of TOPIC.")] = None,
    deep: Annotated[bool, typer.Option("--deep", help="Also read every record: CRC, size, offsets, tags.")] = False,
) -> None:
    """Check cold storage against metadata and the exactly-once, contiguous-offsets invariant.

    Exit 0 only when everything holds; otherwise each problem is printed with its location and the
    exit code is 5. Nothing is changed.

    Example: tieredstore verify Orders --queue 3 --deep
    """
    cli = state(ctx)
    if topic is not None:
        checked_topic(topic)
    if queue_id is not None:
        if topic is None:
            raise ValidationError("--queue needs a TOPIC")
        check_queue_id(queue_id)

    async def go() -> VerifyReport:
        async with open_read_node(cli.config) as node:
            return await verify_archive(node, topic=topic, queue_id=queue_id, deep=deep)

    report = run(go())
    if cli.output.is_json:
        cli.output.json(report.as_json())
    else:
        for found in report.problems:
            cli.output.line(str(found))
        for note in report.notes:
            cli.output.note(f"note: {note}")
        checked = f"{report.queues} queues, {report.segments} segments, {report.units} units"
        if deep:
            checked += f", {report.records} records"
        if report.index_files:
            checked += f", {report.index_files} index files"
        verdict = "ok" if report.ok else f"{len(report.problems)} problems"
        cli.output.line(f"verify: {verdict} ({checked})")
    if not report.ok:
        raise IntegrityFailure(f"verify found {len(report.problems)} problems")
