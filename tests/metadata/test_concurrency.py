"""Two processes moving the same queue's positions never lose an update (optimistic version check)."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier

from tieredstore.errors import ConcurrentUpdateError
from tieredstore.metadata import MetadataStore, upgrade

INCREMENTS_PER_PROCESS = 150


def _advance_archived_offset(url: str, barrier: Barrier, results: multiprocessing.Queue[list[int]]) -> None:
    """Read-modify-write of max_offset, retrying whenever the other process got there first."""
    won: list[int] = []
    with MetadataStore(url) as store:
        barrier.wait()
        while len(won) < INCREMENTS_PER_PROCESS:
            queue = store.get_queue("TopicA", 0)
            try:
                store.update_queue("TopicA", 0, expected_version=queue.version, max_offset=queue.max_offset + 1)
            except ConcurrentUpdateError:
                continue
            won.append(queue.max_offset + 1)
    results.put(won)


def test_two_processes_never_lose_an_update(metadata_url: str) -> None:
    upgrade(metadata_url)
    with MetadataStore(metadata_url) as store:
        store.get_or_create_queue("TopicA", 0)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results: multiprocessing.Queue[list[int]] = context.Queue()
    workers = [context.Process(target=_advance_archived_offset, args=(metadata_url, barrier, results)) for _ in "ab"]
    for worker in workers:
        worker.start()
    won = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    total = 2 * INCREMENTS_PER_PROCESS
    # Every value from 1 to total was written by exactly one process: no two writers both "won" a value.
    assert sorted(won[0] + won[1]) == list(range(1, total + 1))
    with MetadataStore(metadata_url) as store:
        queue = store.get_queue("TopicA", 0)
    assert (queue.max_offset, queue.version) == (total, total)
