"""The archiver's side of queue leases: a lease round every ``renew_interval``, and surplus queues handed back.

``tieredstore.archiver.leases`` says how the archivers sharing one PostgreSQL split the queues; this is
what one archiver does with the answer: drop the queues it lost, give every hot queue a metadata row
so that it can be leased, and release surplus queues once their in-flight batch is done.
"""

from __future__ import annotations

import asyncio

import structlog

from tieredstore.archiver.core import ArchiverCore
from tieredstore.archiver.views import QueueKey
from tieredstore.errors import LeaseLostError, TieredStoreError

log = structlog.get_logger(__name__)


class LeaseRounds(ArchiverCore):
    """Renews the leases, drops lost queues and releases surplus ones."""

    async def _lease_loop(self) -> None:
        leases = self.leases
        assert leases is not None
        while not self._stopping:
            await asyncio.sleep(leases.renew_interval)
            await self._lease_round()

    async def _lease_round(self) -> None:
        """Renew, drop lost queues, start releasing surplus ones; acquired ones are opened by the next scan."""
        leases = self.leases
        assert leases is not None
        try:
            await self._create_queue_rows()
            changes = await asyncio.to_thread(leases.round)
        except (TieredStoreError, OSError) as error:
            log.warning(
                "lease renewal failed; this archiver stops writing its queues when their leases run out",
                owner=leases.owner,
                error=f"{type(error).__name__}: {error}",
            )
            return
        for key in changes.lost:
            worker = self._queues.get(key)
            if worker is not None:
                self.lose_queue(worker, LeaseLostError(f"the lease of {key[0]}/{key[1]} was taken over"), phase="renew")
        # A commit whose epoch was refused drops its lease before the round can see it: count it here too.
        lost = self._leases_lost | set(changes.lost)
        self._leases_lost = set()
        if changes.acquired or lost or changes.surplus:
            # Losing a lease (a takeover while this process was cut off or paused) is worth a warning.
            (log.warning if lost else log.info)(
                "leases changed",
                owner=leases.owner,
                acquired=len(changes.acquired),
                lost=len(lost),
                releasing=len(changes.surplus),
                held=len(leases.held()),
                fair_share=changes.fair_share,
                archivers=changes.live_archivers,
            )
        if changes.surplus:
            task = asyncio.create_task(self._release(changes.surplus))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    async def _create_queue_rows(self) -> None:
        """Give every hot queue a metadata row (at its ``start_from`` offset) so that it can be leased."""
        hot_queues = await asyncio.to_thread(self.hot.queues)
        missing = [key for key in hot_queues if key not in self._queues_with_rows and self.topics.archives(key[0])]
        if not missing:
            return
        self._queues_with_rows.update((p.topic, p.queue_id) for p in await asyncio.to_thread(self.metadata.list_queues))
        for topic, queue_id in missing:
            if (topic, queue_id) in self._queues_with_rows:
                continue
            start = await asyncio.to_thread(self.start_offset, topic, queue_id)
            await asyncio.to_thread(self.metadata.get_or_create_queue, topic, queue_id, start_offset=start)
            self._queues_with_rows.add((topic, queue_id))

    async def _release(self, keys: list[QueueKey]) -> None:
        """Hand surplus queues back once their in-flight batch is done (the lease is renewed meanwhile)."""
        leases = self.leases
        assert leases is not None
        for key in keys:
            worker = self._queues.get(key)
            if worker is not None:
                async with worker.lock:
                    self._unload(worker)
            try:
                await asyncio.to_thread(leases.release, [key])
            except TieredStoreError as error:
                log.warning("lease release failed; it expires on its own", queue=f"{key[0]}/{key[1]}", error=str(error))
