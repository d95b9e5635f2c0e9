"""A producer process for the crash test: puts messages with keys and tags into the configured hot store, then exits.

Usage: python -m tests.archiver.producer COUNT SEED  (config from TIEREDSTORE_* like the archiver's)
"""

from __future__ import annotations

import random
import sys

from tieredstore.config import load_config
from tieredstore.local import PutRequest
from tieredstore.runtime import open_hot_store

TOPICS = (("CrashOrders", 2), ("CrashPayments", 2), ("CrashAudit", 1))
LARGE = 96 << 10  # above the crash test's group_commit_size: such a message must go alone


def main(count: int, seed: int) -> None:
    rng = random.Random(seed)
    queues = [(topic, queue_id) for topic, n in TOPICS for queue_id in range(n)]
    with open_hot_store(load_config()) as hot:
        requests = []
        for n in range(count):
            topic, queue_id = rng.choice(queues)
            size = LARGE if rng.random() < 0.01 else rng.randint(10, 3000)
            body = rng.randbytes(size)
            requests.append(PutRequest(topic, queue_id, body, keys=(f"k{seed}-{n}",), tags=f"t{n % 5}"))
            if len(requests) == 50:
                hot.put_messages(requests)
                requests = []
        hot.put_messages(requests)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
