"""SIGKILL a writer process mid-stream: every put it saw return under sync flush survives recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tieredstore.local import LocalMessageStore

from .conftest import small_config

WRITER = """
import sys, threading
import structlog
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
from tieredstore.local import LocalMessageStore, LocalStoreConfig

config = LocalStoreConfig(commit_log_file_size=64 << 10, max_message_size=16 << 10,
                          consume_queue_units_per_file=50, flush_mode="sync")
store = LocalMessageStore(sys.argv[1], config=config)
round_ = sys.argv[2]
lock = threading.Lock()

def produce(queue_id):
    i = 0
    while True:
        body = f"{round_}:{queue_id}:{i}|".encode() * (1 + i % 40)
        result = store.put_message("crash", queue_id, body, tags="t", keys=[f"k{i}"])
        with lock:
            sys.stdout.write(f"ACK {queue_id} {result.queue_offset} {i}\\n")
            sys.stdout.flush()
        i += 1

for queue_id in range(3):
    threading.Thread(target=produce, args=(queue_id,), daemon=True).start()
threading.Event().wait()
"""


def expected_body(round_: int, queue_id: int, i: int) -> bytes:
    return f"{round_}:{queue_id}:{i}|".encode() * (1 + i % 40)


def run_and_kill(directory: Path, round_: int, acks_wanted: int) -> dict[tuple[int, int], bytes]:
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(round_)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    acknowledged: dict[tuple[int, int], bytes] = {}
    try:
        assert writer.stdout is not None
        while len(acknowledged) < acks_wanted:
            line = writer.stdout.readline()
            assert line, f"writer exited early with {writer.poll()}"
            _, queue_id, queue_offset, i = line.split()
            acknowledged[(int(queue_id), int(queue_offset))] = expected_body(round_, int(queue_id), int(i))
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    assert writer.returncode == -signal.SIGKILL
    return acknowledged


@pytest.mark.reliability
def test_sigkilled_sync_writer_loses_no_acknowledged_put(tmp_path: Path) -> None:
    acknowledged: dict[tuple[int, int], bytes] = {}
    for round_ in range(3):
        acknowledged |= run_and_kill(tmp_path, round_, 400)
        assert (tmp_path / "abort").exists()
        with LocalMessageStore(tmp_path, config=small_config(consume_queue_units_per_file=50)) as store:
            assert not store.recovery.clean
            for (queue_id, queue_offset), body in acknowledged.items():
                assert store.get_message("crash", queue_id, queue_offset).body == body
            for queue_id in range(3):
                top = max(offset for q, offset in acknowledged if q == queue_id)
                assert store.max_offset("crash", queue_id) >= top + 1
                for offset in range(store.max_offset("crash", queue_id)):
                    message = store.get_message("crash", queue_id, offset)  # nothing invalid is served
                    assert message.queue_offset == offset and message.tags == "t"
    assert len(os.listdir(tmp_path / "commitlog")) > 3
