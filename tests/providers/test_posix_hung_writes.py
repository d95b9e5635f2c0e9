"""POSIX writes whose caller gave up (the watchdog): one thread per hung file, and nothing lands after a newer write.

The hang is real: the test holds the segment file's ``flock`` as another process would, so the write's
worker thread blocks in the kernel.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

import pytest

from tests.reliability.archiver_run import wait_for
from tieredstore.errors import StorageUnavailableError
from tieredstore.formats.naming import FileType
from tieredstore.providers.posix import PosixProvider


async def test_no_second_write_starts_while_a_hung_one_runs_and_the_hung_one_lands_once(tmp_path: Path) -> None:
    provider = PosixProvider(str(tmp_path))
    segment = provider.segment(FileType.COMMIT_LOG, "topic/0", 0)
    await segment.create()
    holder = os.open(provider.resolve(segment.key), os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        hung = asyncio.create_task(segment._commit(0, b"abc"))
        await wait_for(lambda: provider._writes_running[segment.key] > 0, 30, "the write's thread blocking in flock")
        hung.cancel()  # the caller gives up, as the watchdog does; the thread goes on
        with pytest.raises(StorageUnavailableError, match="an earlier write to it has not returned yet"):
            await segment._commit(0, b"abc")
        fcntl.flock(holder, fcntl.LOCK_UN)
        await wait_for(lambda: not provider._writes_running[segment.key], 30, "the hung write returning")
    finally:
        os.close(holder)
    await segment._commit(0, b"abc")  # the retry finds its bytes there and adds none
    assert await segment.real_size() == 3


async def test_a_write_given_up_before_its_thread_started_writes_nothing(tmp_path: Path) -> None:
    provider = PosixProvider(str(tmp_path))
    key = provider.segment(FileType.COMMIT_LOG, "topic/0", 0).key
    stale = provider.ask_to_write(key)
    newer = provider.ask_to_write(key)  # allowed: the stale one's thread never ran
    with provider.writing(key, stale) as newest:
        assert not newest
    with provider.writing(key, newer) as newest:
        assert newest
