"""Three ``tieredstore run`` processes on one PostgreSQL archive 64 live queues; one paused past its lease, one killed.

A producer in the test process owns the hot store and puts for the whole run; the archivers follow it
(``--hot-mode follower``) and split the queues by lease (3 s leases, renewed every second). Archiver A
is SIGSTOPped for longer than a lease, so B and C take its queues over (bumping their epochs), then
SIGCONTed: it must find every lease it had lost and write none of those queues again (the pause often
lands inside one of A's metadata transactions: PostgreSQL must end it, or the queue rows it locked stay
A's until it resumes, see ``MetadataStore.limit_idle_transactions``). Archiver B is
then SIGKILLed; its leases expire and A and C share its queues. Once the producer stops and the
survivors catch up, the checker must hold for all 64 queues against the hot copy: every message
exactly once, byte-identical but for PHYSICALOFFSET, at contiguous offsets.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.archiver.processes import child_env, start_tieredstore
from tests.archiver.test_run import archive_problems
from tieredstore.config import load_config
from tieredstore.formats.message import index_keys_of
from tieredstore.local import PutRequest
from tieredstore.metadata import MetadataStore, upgrade
from tieredstore.runtime import open_hot_store, open_runtime

pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.postgres]

TOPICS = tuple(f"ScaleOut{n}" for n in range(4))
QUEUES_PER_TOPIC = 16
LEASE = 3.0
RATE = 800  # messages a second over all 64 queues


class Producer:
    """Puts small keyed messages round-robin into every queue at about RATE a second until stopped."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.produced = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        queues = [(topic, queue_id) for topic in TOPICS for queue_id in range(QUEUES_PER_TOPIC)]
        started = time.monotonic()
        try:
            with _env(self.env):
                hot = open_hot_store(load_config())
            with hot:
                while not self._stop.is_set():
                    batch = [
                        PutRequest(*queues[(self.produced + n) % len(queues)], os.urandom(200), keys=(f"k{n}",))
                        for n in range(40)
                    ]
                    hot.put_messages(batch)
                    self.produced += len(batch)
                    ahead = self.produced / RATE - (time.monotonic() - started)
                    if ahead > 0:
                        self._stop.wait(ahead)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread, which fails with it
            self.error = error

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        assert self.error is None, self.error


class _env:
    """Temporarily the children's environment in this process, so load_config reads the same settings."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = {k: v for k, v in values.items() if k.startswith("TIEREDSTORE_")}
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for key, value in self.values.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _log_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def _owners(store: MetadataStore) -> dict[tuple[str, int], tuple[str | None, int]]:
    return {(q.topic, q.queue_id): (q.owner, q.epoch) for q in store.list_queues()}


def _open_transactions(store: MetadataStore) -> list[tuple[str, float, str]]:
    """Transactions on the test database open for over a second (state, age, last statement): who holds locks."""
    with store.engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT state, extract(epoch FROM now() - xact_start)::float, left(query, 120) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND xact_start < now() - interval '1 second'"
        ).all()
    return [(state, round(age, 1), query) for state, age, query in rows]


def _wait_until(condition: Any, timeout: float, what: str, metadata: MetadataStore | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    if metadata is None:
        raise AssertionError(f"not within {timeout}s: {what}")
    owners = Counter(owner for owner, _epoch in _owners(metadata).values())
    raise AssertionError(
        f"not within {timeout}s: {what} (queues per owner: {owners}; open transactions: {_open_transactions(metadata)})"
    )


async def _key_hits(config: Any, key: str) -> tuple[set[tuple[str, int, int]], set[tuple[str, int, int]]]:
    """Every archived message with ``key`` (read from the hot store) and every one the key index returns."""
    expected: set[tuple[str, int, int]] = set()
    found: set[tuple[str, int, int]] = set()
    async with open_runtime(config, hot_mode="follower", cold_owner=False) as runtime:
        hot = runtime.hot
        assert hot is not None
        for topic in TOPICS:
            for queue_id in range(QUEUES_PER_TOPIC):
                offset, end = hot.min_offset(topic, queue_id), hot.max_offset(topic, queue_id)
                while offset < end:
                    batch = hot.read_messages(topic, queue_id, offset, 4096, 64 << 20)
                    expected.update((topic, queue_id, m.queue_offset) for m in batch if key in index_keys_of(m.raw))
                    offset = batch[-1].queue_offset + 1

            def confirm(_topic_id: int, queue_id: int, offset: int, topic: str = topic) -> Any:
                return asyncio.to_thread(lambda: hot.get_message(topic, queue_id, offset).keys)

            topic_id = runtime.metadata.get_topic(topic).id
            hits = await runtime.keys.query(topic, topic_id, key, 1 << 20, 0, 1 << 62, confirm)
            assert len(hits) == len({(h.queue_id, h.queue_offset) for h in hits}), "a message returned twice"
            found.update((topic, h.queue_id, h.queue_offset) for h in hits)
    return expected, found


def test_three_archivers_pause_and_kill_every_message_archived_exactly_once(tmp_path: Path, postgres_url: str) -> None:
    upgrade(postgres_url)
    env = child_env(
        {
            "TIEREDSTORE_DATA_DIR": tmp_path / "data",
            "TIEREDSTORE_METADATA_URL": postgres_url,
            "TIEREDSTORE_COLD_URL": tmp_path / "cold",
            "TIEREDSTORE_ARCHIVER__LEASE_DURATION": LEASE,
            "TIEREDSTORE_ARCHIVER__LEASE_RENEW_INTERVAL": LEASE / 3,
            "TIEREDSTORE_ARCHIVER__GROUP_COMMIT_TIMEOUT": 0.5,
            "TIEREDSTORE_ARCHIVER__GROUP_COMMIT_COUNT": 64,
            "TIEREDSTORE_ARCHIVER__SCAN_INTERVAL": 0.2,
            "TIEREDSTORE_ARCHIVER__SHUTDOWN_TIMEOUT": 10,
            "TIEREDSTORE_HOT__MAX_QUEUES_PER_TOPIC": QUEUES_PER_TOPIC,
            # Maintenance (key-index upload, and the sweep of a killed archiver's namespace) every 2 s.
            "TIEREDSTORE_ARCHIVER__MAINTAIN_INTERVAL": 2,
        }
    )
    producer = Producer(env)
    producer.start()
    _wait_until(lambda: producer.produced >= 64, 10, "the producer created every queue")
    names = ("a", "b", "c")
    logs = {name: tmp_path / f"archiver-{name}.log" for name in names}
    archivers: dict[str, subprocess.Popen[bytes]] = {
        name: start_tieredstore(
            [
                "--log-json",
                "--debug",
                "--output",
                "json",
                "run",
                "--no-demo",
                "--hot-mode",
                "follower",
                "--owner-id",
                name,
            ],
            env,
            logs[name],
        )
        for name in names
    }
    metadata = MetadataStore(postgres_url)
    try:
        # Fair shares: ceil(64 / 3) = 22 at most each, all 64 queues leased.
        def balanced() -> bool:
            owners = [owner for owner, _epoch in _owners(metadata).values()]
            return len(owners) == 64 and all(0 < owners.count(n) <= 22 for n in names)

        _wait_until(balanced, 30, "three archivers sharing the 64 queues fairly", metadata)
        before_pause = {key: epoch for key, (owner, epoch) in _owners(metadata).items() if owner == "a"}

        archivers["a"].send_signal(signal.SIGSTOP)
        _wait_until(
            lambda: (
                not any(owner == "a" for owner, _ in _owners(metadata).values())
                and all(owner in ("b", "c") for owner, _ in _owners(metadata).values())
            ),
            LEASE * 5,
            "b and c taking over the paused archiver's queues",
            metadata,
        )
        time.sleep(1.0)
        paused_at = len(_log_events(logs["a"]))
        archivers["a"].send_signal(signal.SIGCONT)
        _wait_until(
            lambda: any(e.get("event") == "leases changed" for e in _log_events(logs["a"])[paused_at:]),
            LEASE * 3,
            "the resumed archiver noticing its lost leases",
        )
        after_resume = _log_events(logs["a"])[paused_at:]
        first_round = next(e for e in after_resume if e.get("event") == "leases changed")
        assert first_round["lost"] == len(before_pause), first_round
        now = _owners(metadata)
        assert all(now[key][1] > epoch for key, epoch in before_pause.items()), "every takeover bumped the epoch"
        _wait_until(balanced, 30, "the resumed archiver taking its fair share back", metadata)

        archivers["b"].send_signal(signal.SIGKILL)
        archivers["b"].wait(timeout=10)
        _wait_until(
            lambda: {owner for owner, _ in _owners(metadata).values()} == {"a", "c"},
            LEASE * 6,
            "a and c sharing the killed archiver's queues",
            metadata,
        )
        time.sleep(2.0)
        producer.stop()

        def caught_up() -> bool:
            return sum(q.max_offset for q in metadata.list_queues()) == producer.produced

        _wait_until(caught_up, 60, f"the survivors archiving all {producer.produced} messages")
        for name in ("a", "c"):
            archivers[name].send_signal(signal.SIGTERM)
        summaries = {}
        for name in ("a", "c"):
            stdout, _ = archivers[name].communicate(timeout=30)
            assert archivers[name].returncode == 0, logs[name].read_text()
            summaries[name] = json.loads(stdout.decode().strip().splitlines()[-1])
    finally:
        producer.stop()
        for process in archivers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait(timeout=10)
        metadata.close()

    with _env(env):
        config = load_config()
    hot, archived, problems = asyncio.run(archive_problems(config))
    assert problems == []
    assert hot == archived == producer.produced
    assert {(q.owner) for q in MetadataStore(postgres_url).list_queues()} == {None}, "leases handed back at SIGTERM"
    # Each archiver indexed keys in a namespace of its own (the killed one's too): query-key finds them all.
    expected, found = asyncio.run(_key_hits(config, "k7"))
    assert found == expected and len(expected) > 100
    # The killed archiver's namespace was swept by a survivor: its files are in cold storage, none left local.
    killed = re.search(r"key index namespace (\S+)", logs["b"].read_text())
    assert killed is not None, logs["b"].read_text()[:2000]
    namespace = killed.group(1)
    assert not list((config.data_dir / "index" / namespace).glob("*.index"))
    with MetadataStore(postgres_url) as store:
        rows = [row for row in store.list_index_files() if f"/{namespace}/" in row.name]
    assert rows and {row.status.value for row in rows} == {"UPLOAD"}, rows
    print(
        f"scale-out: {producer.produced} messages over 64 queues; a lost {len(before_pause)} leases while paused; "
        f"summaries {summaries}"
    )
