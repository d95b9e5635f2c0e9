"""The restore engine: every chosen queue of a topic read ahead of its writes, several queues at once.

Up to ``parallel`` queues are restored at once, each read up to ``read_ahead`` batches ahead of its
writes; memory is bounded by ``max_bytes_in_flight``, the record bytes read from cold storage and not
yet written (a batch larger than that goes alone). One thread writes every batch, each queue's in
queue-offset order; the queues interleave in the hot commit log, which is what a hot store's
producers do too. The first failed read or write stops the restore: every queue keeps what was
written before it, and the next run resumes each one.

Offsets lost before they were archived are never restored, and every other record keeps its
original offset: a sink that holds gaps skips the hole, one that does not (a hot store) stops at it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tieredstore.errors import CorruptRecordError, NotFoundError
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.formats.naming import validate_topic
from tieredstore.local.store import JoinedRecords
from tieredstore.read.archived import archived_queue, segment_rows
from tieredstore.read.node import ReadNode
from tieredstore.restore.budget import ByteBudget
from tieredstore.restore.reading import Batch, Skip, check_resume, queue_range, read_queue
from tieredstore.restore.request import QueueOutcome, RestoreRequest, RestoreSummary
from tieredstore.restore.sinks import RestoreSink


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
    validate_topic(request.topic)
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
        first, end = await queue_range(node, flat_file, request)
        resumed = await asyncio.to_thread(sink.resume_offset, position.topic, position.queue_id, first, end)
        if resumed > first:
            await check_resume(flat_file, sink, resumed - 1)
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
        budget = ByteBudget(request.max_bytes_in_flight)
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
    budget: ByteBudget,
    writer: _Writer,
) -> None:
    """Read ahead of the writes (``read_ahead`` batches, within the budget) and write in queue-offset order.

    The writes of all queues take turns in ``writer``'s one thread, so one batch is written at a time.
    """
    end = outcome.end if outcome.stopped_at is None else outcome.stopped_at
    ahead: asyncio.Queue[Batch | Skip | CorruptRecordError | None] = asyncio.Queue(maxsize=request.read_ahead)
    reader = asyncio.create_task(read_queue(flat_file, outcome.resumed_at, end, request, budget, ahead))
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
            if isinstance(item, CorruptRecordError):
                raise item
            if isinstance(item, Skip):
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
            if isinstance(left, Batch):
                await budget.release(left.held)
    await asyncio.to_thread(sink.finish_queue, outcome.topic, outcome.queue_id)
