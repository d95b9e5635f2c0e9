"""Handing the GIL to worker threads: the event loop's other tasks keep running meanwhile."""

from __future__ import annotations

import asyncio
import threading

from tieredstore.flat.gil_handoff import GilHandoff


async def test_a_handoff_leaves_the_event_loop_free_for_other_tasks() -> None:
    # a long pause makes the difference plain: a loop blocked for it would run the ticker once at most
    handoff = GilHandoff(pause=0.1)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    try:
        await handoff()
    finally:
        task.cancel()
        handoff.close()
    assert ticks >= 5, f"the ticker ran {ticks} times during a 0.1 s hand-off"


async def test_the_helper_thread_starts_at_the_first_handoff_and_ends_at_close() -> None:
    def helpers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("tieredstore-gil-handoff")}

    before = helpers()
    handoff = GilHandoff()
    assert helpers() == before
    await handoff()
    await handoff()
    (thread,) = helpers() - before  # one thread serves every hand-off
    handoff.close()
    handoff.close()  # a second close is harmless
    thread.join(timeout=5)
    assert not thread.is_alive()
