"""PositionCommits: the position records of queues that commit together, in one metadata transaction.

Group commit without a timer: a record that finds no transaction in flight starts one at once; the
records that arrive while it is in flight go together in the next one, which starts as soon as it ends.
Each caller's await returns once the transaction holding its record is durable, with its own result:
the queue's new position, or the error ``MetadataStore.record_commit`` would have raised for that
record alone (``MetadataStore.record_commits``). A failure of the database fails every record of that
transaction with the same error. One is shared by every queue of a ``FlatFileStore``.
"""

from __future__ import annotations

import asyncio

from tieredstore.metadata import CommitRecord, MetadataStore, QueuePosition


class PositionCommits:
    """Batches ``record_commit`` calls that overlap in time into ``record_commits``; used on one event loop."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata
        self._waiting: list[tuple[CommitRecord, asyncio.Future[QueuePosition]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(self, commit: CommitRecord) -> QueuePosition:
        """Record ``commit`` with whatever else is waiting; its position once that transaction is durable.

        A caller cancelled before its transaction starts records nothing; once it has started the
        record goes in regardless, as a cancelled ``asyncio.to_thread`` call would.
        """
        future: asyncio.Future[QueuePosition] = asyncio.get_running_loop().create_future()
        self._waiting.append((commit, future))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_waiting())
        return await future

    async def _write_waiting(self) -> None:
        batch: list[tuple[CommitRecord, asyncio.Future[QueuePosition]]] = []
        try:
            while self._waiting:
                batch = [(commit, future) for commit, future in self._waiting if not future.done()]
                self._waiting = []
                if batch:
                    await self._write(batch)
                batch = []
        except BaseException as exc:
            # This task cancelled, or a BaseException (``_write`` hands every Exception to its callers):
            # no record may be left waiting for a writer that is gone.
            for _commit, future in batch + self._waiting:
                if future.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
            self._waiting = []
            raise
        finally:
            self._writer = None

    async def _write(self, batch: list[tuple[CommitRecord, asyncio.Future[QueuePosition]]]) -> None:
        try:
            results = await asyncio.to_thread(self.metadata.record_commits, [commit for commit, _future in batch])
        except Exception as exc:  # noqa: BLE001 -- whatever it is, it is each caller's error, raised by its await
            for _commit, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_commit, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, QueuePosition):
                future.set_result(result)
            else:
                future.set_exception(result)
