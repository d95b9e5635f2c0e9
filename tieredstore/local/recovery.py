"""Opening a LocalMessageStore: its consume queues loaded and checked against the commit log, a torn tail repaired."""

from __future__ import annotations

import time

import structlog

from tieredstore.errors import CorruptRecordError, ValidationError
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import MessageRecord, decode, tag_hash
from tieredstore.formats.naming import validate_topic
from tieredstore.formats.records import Expected, Fault, explain
from tieredstore.local.checkpoint import Checkpoint
from tieredstore.local.commit_log import ScanStop
from tieredstore.local.index_file import record_index_keys
from tieredstore.local.queue import ConsumeQueue
from tieredstore.local.reading import RECORD_HEAD
from tieredstore.local.results import RecoveryReport
from tieredstore.local.store_state import StoreState

log = structlog.get_logger(__name__)

# A record the scan decoded must still end its properties in 0x02, as our writer leaves them.
_TERMINATED = Expected(check_crc=False, terminated=True)


class StoreRecovery(StoreState):
    """The steps of open that find where the valid data ends and bring the consume queues in line with it."""

    def _load_queues(self) -> None:
        base = self.root / "consumequeue"
        if not base.is_dir():
            return
        for topic_dir in sorted(base.iterdir()):
            try:
                validate_topic(topic_dir.name)
            except ValidationError:
                log.warning("ignoring a consume-queue folder that is not a topic", path=str(topic_dir))
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if not queue_dir.name.isdigit():
                    continue
                queue = ConsumeQueue.load(
                    topic_dir.name,
                    int(queue_dir.name),
                    queue_dir,
                    file_size=self.file_sizes.consume_queue,
                    writable=not self.read_only,
                )
                self._queues[(queue.topic, queue.queue_id)] = queue

    def _recover(self) -> RecoveryReport:
        started = time.monotonic()
        log_ = self._commit_log
        data_end = log_.files[-1].end_offset if log_.files else log_.write_offset
        checkpoint = Checkpoint.read(self.root / "checkpoint")
        if not self.read_only and checkpoint is not None and not (self.root / "abort").exists():
            end = checkpoint.confirmed_offset
            if self._clean_end_is_consistent(end, data_end):
                log_.write_offset = log_.flushed_offset = end
                if not self._key_index.existed:
                    self._key_index.reindex(log_.scan(log_.min_offset), end)
                return RecoveryReport(clean=True, scanned_from=end, valid_end=end, seconds=time.monotonic() - started)
        if not log_.files and not self._queues:
            return RecoveryReport(clean=True, scanned_from=0, valid_end=0, seconds=time.monotonic() - started)
        start = self._recovery_start(checkpoint, data_end)
        if not self.read_only:
            # Items of records from ``start`` on are re-added by the scan below; a torn index file is
            # rebuilt from the commit log up to there first.
            rescan = log_.min_offset if not self._key_index.existed else self._key_index.recover(start)
            self._key_index.reindex(log_.scan(max(rescan, log_.min_offset)), start)
        # Rewound, not cleared: the units rebuilt below overwrite the old ones in place, and only what lies
        # past the rebuilt end is zeroed at the end, so a follower never sees a sound unit vanish.
        dropped = sum(q.rewind_to(q.lower_bound(start)) for q in self._queues.values())
        scanned = 0
        stop = ScanStop(start, None)
        for item in log_.scan(start):
            if isinstance(item, ScanStop):
                stop = item
                break
            offset, size, record = item
            problem = self._unacceptable(record, allow_rebase=self.read_only or start == log_.min_offset)
            if problem is None and not self.read_only:
                problem = self._torn_properties(offset, size)
            if problem is not None:
                stop = ScanStop(offset, problem)
                break
            queue = self._queue(record.topic, record.queue_id)
            try:
                queue.append(ConsumeQueueUnit(offset, size, tag_hash(record.tags)), record.queue_offset)
            except CorruptRecordError as exc:
                stop = ScanStop(offset, str(exc))
                break
            self._last_store_timestamp = max(self._last_store_timestamp, record.store_timestamp)
            if not self.read_only:
                self._key_index.add(record.topic, record_index_keys(record), offset, record.store_timestamp)
            scanned += 1
        cleared, removed = 0, list[str]()
        if self.read_only:
            log_.write_offset = log_.flushed_offset = stop.offset
        else:
            for queue in self._queues.values():
                queue.clear_past_end()  # units past the rebuilt end point at bytes truncated next
            cleared, removed = log_.truncate(stop.offset)
            for queue in self._queues.values():
                queue.flush()
            self._write_checkpoint(stop.offset)
        report = RecoveryReport(
            clean=False,
            scanned_from=start,
            valid_end=stop.offset,
            records_scanned=scanned,
            stop_reason=stop.reason,
            bytes_cleared=cleared,
            files_removed=removed,
            queue_units_dropped=dropped,
            queue_units_rebuilt=scanned,
            seconds=time.monotonic() - started,
        )
        if report.repaired:
            log.warning("hot store repaired", **{k: getattr(report, k) for k in report.__slots__})
        return report

    def _unacceptable(self, record: MessageRecord, *, allow_rebase: bool) -> str | None:
        """Why a record that decoded cleanly still cannot be ours (header bits the CRC does not cover)."""
        try:
            validate_topic(record.topic)
        except ValidationError as exc:
            return f"record names an invalid topic: {exc}"
        if record.queue_id < 0 or (not self.read_only and record.queue_id >= self.config.max_queues_per_topic):
            return f"record names queue id {record.queue_id}, outside 0..{self.config.max_queues_per_topic - 1}"
        queue = self._queues.get((record.topic, record.queue_id))
        expected = queue.max_offset if queue is not None else 0
        if record.queue_offset != expected and not (allow_rebase and (queue is None or queue.max_offset == 0)):
            return f"record has queue offset {record.queue_offset}, its queue expects {expected}"
        return None

    def _torn_properties(self, offset: int, size: int) -> str | None:
        """Our writer ends every property block in 0x02; a zeroed tail (a torn page) would not.

        Properties are outside the body CRC, so without this a record whose last page never reached
        the disk would be served with its KEYS and TAGS silently gone.
        """
        file = self._commit_log.file_for(offset)
        assert file is not None
        local = offset - file.start_offset
        findings = explain(file.buffer[local : local + size], _TERMINATED)
        if any(finding.fault is Fault.UNTERMINATED for finding in findings):
            return "record's properties do not end in the 0x02 separator (a torn tail)"
        return None

    def _clean_end_is_consistent(self, end: int, data_end: int) -> bool:
        """After a clean close the checkpoint holds the exact end; check it against the files cheaply."""
        log_ = self._commit_log
        if not log_.files:
            return end == log_.write_offset == 0 or not (self.root / "commitlog").exists()
        if not log_.min_offset <= end <= data_end:
            return False
        file = log_.file_for(end)
        if file is not None and file.size - (end - file.start_offset) >= RECORD_HEAD.size:
            size, magic = RECORD_HEAD.unpack_from(file.buffer, end - file.start_offset)
            if size or magic:
                return False
        for queue in self._queues.values():
            if queue.max_offset > queue.min_offset:
                offset, size = queue.commitlog_position_at(queue.max_offset - 1)
                if offset + size > end:
                    return False
        return True

    def _recovery_start(self, checkpoint: Checkpoint | None, data_end: int) -> int:
        log_ = self._commit_log
        if not self.read_only:
            if checkpoint is not None and log_.min_offset <= checkpoint.confirmed_offset <= data_end:
                return checkpoint.confirmed_offset
            return log_.min_offset
        # A broker's consume queues are trusted up to the last unit that points at a valid record.
        best_end = log_.min_offset
        for queue in self._queues.values():
            if queue.max_offset > queue.min_offset:
                offset, size = queue.commitlog_position_at(queue.max_offset - 1)
                if offset + size > best_end and self._valid_record_at(offset, size):
                    best_end = offset + size
        return best_end

    def _valid_record_at(self, offset: int, size: int) -> bool:
        file = self._commit_log.file_for(offset)
        if file is None or offset + size > file.end_offset:
            return False
        try:
            with memoryview(file.buffer) as view:
                record = decode(view[: offset - file.start_offset + size], offset - file.start_offset)
        except CorruptRecordError:
            return False
        return record.physical_offset == offset
