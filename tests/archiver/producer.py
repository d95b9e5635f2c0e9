"""A producer process for archiver tests: puts messages with keys and tags into the configured hot store.

Usage: python -m tests.archiver.producer COUNT SEED [RATE]  (config from TIEREDSTORE_* like the archiver's)

COUNT messages, then a clean close; COUNT -1 puts until killed, at about RATE messages a second,
printing ``ACK topic queue_id queue_offset body_crc32`` for every message once its put returned.
"""

from __future__ import annotations

import random
import sys
import time
import zlib

from tieredstore.config import load_config
from tieredstore.local import PutRequest
from tieredstore.runtime import open_hot_store

TOPICS = (("CrashOrders", 2), ("CrashPayments", 2), ("CrashAudit", 1))
LARGE = 96 << 10  # above the crash test's group_commit_size: such a message must go alone
BATCH = 50


def _requests(rng: random.Random, seed: int, first: int, count: int) -> list[PutRequest]:
    queues = [(topic, queue_id) for topic, n in TOPICS for queue_id in range(n)]
    requests = []
    for n in range(first, first + count):
        topic, queue_id = rng.choice(queues)
        size = LARGE if rng.random() < 0.01 else rng.randint(10, 3000)
        requests.append(PutRequest(topic, queue_id, rng.randbytes(size), keys=(f"k{seed}-{n}",), tags=f"t{n % 5}"))
    return requests


def main(count: int, seed: int, rate: float) -> None:
    rng = random.Random(seed)
    with open_hot_store(load_config()) as hot:
        if count >= 0:
            for first in range(0, count, BATCH):
                hot.put_messages(_requests(rng, seed, first, min(BATCH, count - first)))
            return
        started = time.monotonic()
        produced = 0
        while True:
            batch = _requests(rng, seed, produced, rng.randint(1, 8))
            results = hot.put_messages(batch)
            sys.stdout.write(
                "".join(
                    f"ACK {r.topic} {r.queue_id} {r.queue_offset} {zlib.crc32(request.body)}\n"
                    for r, request in zip(results, batch, strict=True)
                )
            )
            sys.stdout.flush()
            produced += len(batch)
            ahead = produced / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 100.0)
