"""The archive invariant checker: every archived message appears exactly once at contiguous offsets.

``check_queue_invariant`` walks a queue's archived consume queue and commit log in batches and
returns every violation as a typed ``InvariantProblem`` naming where it is: units must tile the
commit log with no gap or overlap, each record must decode with a good CRC, sit at the offset its
unit says with the size it says, carry the queue offset of its slot and its own PHYSICALOFFSET, and
no commit-log byte may follow the last referenced record. Given the hot copy, each record must be
byte-identical to it except for PHYSICALOFFSET.

Queue offsets recorded as lost (``FlatMessageFile.skip_to``: a hole between consume-queue segments)
are not a violation; the commit log runs on unbroken across them, since nothing there was ever
archived. A hole with commit-log bytes in it is one that lost archived messages: UNRECORDED_GAP.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tieredstore.errors import CorruptRecordError
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import same_but_physical_offset
from tieredstore.formats.records import Expected, Fault, Finding, PackedRun, explain, problem_indexes

ReferenceLookup = Callable[[int], bytes | None] | Mapping[int, bytes]
DEFAULT_BATCH = 1024


class ProblemKind(enum.StrEnum):
    """What is wrong at one place of the archive: the one vocabulary of ``verify``, its checker and its JSON.

    A record's own faults (``formats.records.Fault``) are reported as the kind ``kind_of`` maps them to.
    """

    MISSING_OBJECT = "MISSING_OBJECT"  # metadata records bytes of an object the provider does not hold
    ORPHAN_OBJECT = "ORPHAN_OBJECT"  # an object (or a folder of them) that metadata does not account for
    SEGMENT_GAP = "SEGMENT_GAP"  # a file's segments do not follow on from each other
    READ_FAILED = "READ_FAILED"  # the queue could not be read to be checked
    OFFSET_RANGE = "OFFSET_RANGE"  # recorded positions disagree with the files
    UNIT_UNREADABLE = "UNIT_UNREADABLE"  # consume-queue bytes missing or not whole units
    COMMIT_LOG_GAP = "COMMIT_LOG_GAP"  # bytes between two records that no unit references
    UNRECORDED_GAP = "UNRECORDED_GAP"  # queue offsets missing although their messages were archived
    COMMIT_LOG_OVERLAP = "COMMIT_LOG_OVERLAP"  # two units share bytes: a message archived twice
    COMMIT_LOG_MISSING = "COMMIT_LOG_MISSING"  # a unit points past the durable commit log
    CORRUPT_RECORD = "CORRUPT_RECORD"  # bad magic, length or CRC
    CORRUPT_FRAME = "CORRUPT_FRAME"  # a compressed or encrypted frame that does not authenticate or decode
    SIZE_MISMATCH = "SIZE_MISMATCH"  # the unit's size is not the record's TOTALSIZE
    QUEUE_OFFSET_MISMATCH = "QUEUE_OFFSET_MISMATCH"  # the record says another queue offset
    PHYSICAL_OFFSET_MISMATCH = "PHYSICAL_OFFSET_MISMATCH"  # PHYSICALOFFSET is not where the record is
    WRONG_QUEUE = "WRONG_QUEUE"  # the record belongs to another topic or queue
    TAG_HASH_MISMATCH = "TAG_HASH_MISMATCH"  # the unit's tag hash is not the record's
    ORPHAN_BYTES = "ORPHAN_BYTES"  # commit-log bytes after the last referenced record
    REFERENCE_MISSING = "REFERENCE_MISSING"  # the hot copy has no message at this offset
    REFERENCE_MISMATCH = "REFERENCE_MISMATCH"  # bytes differ from the hot copy


@dataclass(frozen=True, slots=True)
class InvariantProblem:
    """One violation: its kind, the queue offset and commit-log offset where it is, and the detail."""

    kind: ProblemKind
    topic: str
    queue_id: int
    queue_offset: int | None
    commitlog_offset: int | None
    detail: str

    def __str__(self) -> str:
        where = f"{self.topic}/{self.queue_id}"
        if self.queue_offset is not None:
            where += f" queue offset {self.queue_offset}"
        if self.commitlog_offset is not None:
            where += f" commit-log offset {self.commitlog_offset}"
        return f"{self.kind.value} at {where}: {self.detail}"


def _reference_getter(reference: ReferenceLookup | None) -> Callable[[int], bytes | None] | None:
    if reference is None:
        return None
    if isinstance(reference, Mapping):
        return reference.get
    return reference


async def check_queue_invariant(
    flat_file: FlatMessageFile,
    *,
    reference: ReferenceLookup | None = None,
    batch: int = DEFAULT_BATCH,
    max_problems: int = 1000,
) -> list[InvariantProblem]:
    """Every violation of the archive invariant in ``flat_file`` (empty when it holds), up to ``max_problems``.

    ``reference`` maps a queue offset to the hot copy of that message (None or absent when the hot
    store no longer has it, which is reported only for offsets the caller claims to hold).
    """
    problems: list[InvariantProblem] = []
    topic, queue_id = flat_file.topic, flat_file.queue_id
    reference_of = _reference_getter(reference)

    def report(kind: ProblemKind, queue_offset: int | None, cl_offset: int | None, detail: str) -> None:
        if len(problems) < max_problems:
            problems.append(InvariantProblem(kind, topic, queue_id, queue_offset, cl_offset, detail))

    archived = flat_file.archived_offset
    if flat_file.position.max_offset != archived:
        report(
            ProblemKind.OFFSET_RANGE,
            None,
            None,
            f"metadata records archived offset {flat_file.position.max_offset}, the consume queue ends at {archived}",
        )
    expected_cl = flat_file.commit_log.min_offset
    first = True
    runs = [(start, min(end, archived)) for start, end in flat_file.archived_runs if start < archived]
    walked_end = flat_file.min_offset
    unreadable = False
    for run_index, (run_start, run_end) in enumerate(runs):
        queue_offset = run_start
        while queue_offset < run_end and len(problems) < max_problems:
            count = min(batch, run_end - queue_offset)
            try:
                units = await flat_file.read_units(queue_offset, count)
            except CorruptRecordError as error:
                report(ProblemKind.UNIT_UNREADABLE, queue_offset, None, str(error))
                return problems
            if len(units) < count:
                report(
                    ProblemKind.UNIT_UNREADABLE,
                    queue_offset + len(units),
                    None,
                    f"{count - len(units)} archived units are not readable",
                )
                count = len(units)
                unreadable = True
            if not units:
                break
            start = units[0].commitlog_offset
            end = max(u.commitlog_offset + u.size for u in units)
            raw = await flat_file.read_commit_log(start, end - start) if end > start else b""
            expected = _expected(flat_file, queue_offset, units)
            suspects = set(problem_indexes(_run(units, raw, start), expected).tolist())
            for index, unit in enumerate(units):
                offset = queue_offset + index
                if first:
                    # The head of the commit log may hold bytes of expired messages; only later gaps count.
                    expected_cl = unit.commitlog_offset
                    first = False
                elif offset == run_start and unit.commitlog_offset > expected_cl:
                    report(
                        ProblemKind.UNRECORDED_GAP,
                        offset,
                        expected_cl,
                        f"queue offsets {runs[run_index - 1][1]}..{run_start - 1} are missing from the consume queue "
                        f"but {unit.commitlog_offset - expected_cl} commit-log bytes were archived for them",
                    )
                    expected_cl = unit.commitlog_offset
                rule = (expected, index) if index in suspects else None
                _check_unit(unit, offset, expected_cl, raw, start, flat_file, reference_of, report, rule)
                expected_cl = max(expected_cl, unit.commitlog_offset + unit.size)
            queue_offset += count
            walked_end = queue_offset
            if unreadable:
                break
        if unreadable or queue_offset < run_end or len(problems) >= max_problems:
            break
    archived = walked_end if runs else archived
    committed = flat_file.commit_log.commit_offset
    if archived > flat_file.min_offset and committed > expected_cl:
        report(
            ProblemKind.ORPHAN_BYTES,
            None,
            expected_cl,
            f"{committed - expected_cl} commit-log bytes after the last archived record",
        )
    elif archived == flat_file.min_offset and committed > flat_file.commit_log.min_offset and first:
        report(
            ProblemKind.ORPHAN_BYTES,
            None,
            flat_file.commit_log.min_offset,
            f"{committed - flat_file.commit_log.min_offset} commit-log bytes but no archived message",
        )
    return problems


def _expected(flat_file: FlatMessageFile, queue_offset: int, units: Sequence[ConsumeQueueUnit]) -> Expected:
    """What the records of ``units`` (from ``queue_offset``) must be: this queue's, where and as their units say."""
    return Expected(
        topic=flat_file.topic.encode("utf-8"),
        queue_id=flat_file.queue_id,
        queue_offsets=queue_offset,
        physical_offsets=np.array([unit.commitlog_offset for unit in units], dtype=np.int64),
        tag_hashes=np.array([unit.tag_hash for unit in units], dtype=np.int64),
    )


def _run(units: Sequence[ConsumeQueueUnit], raw: bytes, raw_start: int) -> PackedRun:
    """The records ``units`` point at, in ``raw`` (read from commit-log offset ``raw_start``)."""
    begins = [unit.commitlog_offset - raw_start for unit in units]
    return PackedRun.at(raw, begins, [unit.size for unit in units])


def _check_unit(
    unit: ConsumeQueueUnit,
    queue_offset: int,
    expected_cl: int,
    raw: bytes,
    raw_start: int,
    flat_file: FlatMessageFile,
    reference_of: Callable[[int], bytes | None] | None,
    report: Callable[[ProblemKind, int | None, int | None, str], None],
    rule: tuple[Expected, int] | None,
) -> None:
    """The problems of one unit; its record is judged (``explain``) only when ``rule`` says the batch check
    flagged it, with what it was expected to be and its index in the batch."""
    cl_offset = unit.commitlog_offset
    if cl_offset > expected_cl:
        report(ProblemKind.COMMIT_LOG_GAP, queue_offset, expected_cl, f"{cl_offset - expected_cl} unreferenced bytes")
    elif cl_offset < expected_cl:
        report(
            ProblemKind.COMMIT_LOG_OVERLAP,
            queue_offset,
            cl_offset,
            f"the unit starts {expected_cl - cl_offset} bytes inside the previous record",
        )
    begin = cl_offset - raw_start
    record_bytes = raw[begin : begin + unit.size]
    if len(record_bytes) < unit.size:
        report(
            ProblemKind.COMMIT_LOG_MISSING,
            queue_offset,
            cl_offset,
            f"the unit needs {unit.size} bytes, {len(record_bytes)} are durable",
        )
        return
    total = int.from_bytes(record_bytes[:4], "big", signed=True)
    if total != unit.size:
        report(ProblemKind.SIZE_MISMATCH, queue_offset, cl_offset, f"unit size {unit.size}, record size {total}")
        return
    if rule is not None and not _report_findings(
        explain(record_bytes, *rule), unit, queue_offset, f"{flat_file.path}/COMMIT_LOG", flat_file, report
    ):
        return
    if reference_of is None:
        return
    hot = reference_of(queue_offset)
    if hot is None:
        report(ProblemKind.REFERENCE_MISSING, queue_offset, cl_offset, "the hot store has no such message")
        return
    if not same_but_physical_offset(hot, record_bytes):
        report(
            ProblemKind.REFERENCE_MISMATCH,
            queue_offset,
            cl_offset,
            f"cold bytes ({len(record_bytes)}) differ from the hot copy ({len(hot)}) beyond PHYSICALOFFSET",
        )


# The faults of a record that decodes but is not where or what its unit says; every other fault is corruption.
_IDENTITY_KINDS = {
    Fault.QUEUE_OFFSET: ProblemKind.QUEUE_OFFSET_MISMATCH,
    Fault.PHYSICAL_OFFSET: ProblemKind.PHYSICAL_OFFSET_MISMATCH,
    Fault.TOPIC: ProblemKind.WRONG_QUEUE,
    Fault.QUEUE_ID: ProblemKind.WRONG_QUEUE,
    Fault.TAG_HASH: ProblemKind.TAG_HASH_MISMATCH,
}


def kind_of(fault: Fault) -> ProblemKind:
    """The kind of archive problem a record's fault is reported as."""
    return _IDENTITY_KINDS.get(fault, ProblemKind.CORRUPT_RECORD)


def _report_findings(
    findings: list[Finding],
    unit: ConsumeQueueUnit,
    queue_offset: int,
    location: str,
    flat_file: FlatMessageFile,
    report: Callable[[ProblemKind, int | None, int | None, str], None],
) -> bool:
    """Report a flagged record's findings as the checker words them; whether the record is whole enough to
    compare with its hot copy (it is not corrupt)."""
    cl_offset = unit.commitlog_offset
    found = {finding.fault: finding for finding in findings}
    topic = found[Fault.TOPIC].owner if Fault.TOPIC in found else flat_file.topic.encode("utf-8")
    try:
        topic_name = topic.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A topic that is not text is a record the decoder refuses, not another queue's.
        findings = [Finding(Fault.LAYOUT, 0, 0, f"undecodable record: {exc}")]
    corrupt = [f for f in findings if kind_of(f.fault) is ProblemKind.CORRUPT_RECORD]
    if corrupt:
        report(
            ProblemKind.CORRUPT_RECORD,
            queue_offset,
            cl_offset,
            str(CorruptRecordError(corrupt[0].reason, location=location, offset=0)),
        )
        return False
    wrong_queue = False
    for finding in findings:
        kind = kind_of(finding.fault)
        if kind is ProblemKind.WRONG_QUEUE:
            if not wrong_queue:
                queue_id = found[Fault.QUEUE_ID].found if Fault.QUEUE_ID in found else flat_file.queue_id
                report(kind, queue_offset, cl_offset, f"record is of {topic_name}/{queue_id}")
            wrong_queue = True
        elif kind is ProblemKind.TAG_HASH_MISMATCH:
            report(kind, queue_offset, cl_offset, f"unit {unit.tag_hash}, record tags give {finding.found}")
        else:
            report(kind, queue_offset, cl_offset, f"record says {finding.found}")
    return True
