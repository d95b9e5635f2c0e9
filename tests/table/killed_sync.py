"""A ``tieredstore table sync`` subprocess to SIGKILL, its catalog row held so no commit can land first, and
the files of a table's folder as storage lists them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy

from tests.table.conftest import TOPIC, TableNode
from tieredstore.runtime import open_cold_provider
from tieredstore.table.catalog import table_path
from tieredstore.table.orphans import table_references

CLI = str(Path(sys.executable).parent / "tieredstore")


def start_sync(node: TableNode, stderr: Path, settings: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [CLI, *node.node.flags, "table", "sync", TOPIC]
    env = {**os.environ, **node.node.env, **settings}
    with stderr.open("wb") as sink:
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=sink)


def kill_when(syncing: subprocess.Popen[bytes], stderr: Path, ready: Callable[[], bool]) -> None:
    """SIGKILL ``syncing`` as soon as ``ready()`` holds (polled); fail if it exits or a minute passes first."""
    deadline = time.monotonic() + 60
    while not ready():
        assert syncing.poll() is None, stderr.read_text()
        assert time.monotonic() < deadline, f"the sync never got there: {stderr.read_text()}"
        time.sleep(0.002)
    syncing.send_signal(signal.SIGKILL)
    syncing.wait(timeout=30)
    assert syncing.returncode == -signal.SIGKILL


@contextmanager
def catalog_held(node: TableNode, topic: str = TOPIC) -> Iterator[None]:
    """The table's catalog row locked by an open transaction: another process's commit waits on it (the row
    lock on PostgreSQL, the write lock on SQLite), while reads go on. Rolled back on exit."""
    engine = sqlalchemy.create_engine(node.archive.metadata_url)
    try:
        with engine.connect() as connection:
            transaction = connection.begin()
            locked = connection.execute(
                sqlalchemy.text(
                    "UPDATE iceberg_tables SET metadata_location = metadata_location WHERE table_name = :name"
                ),
                {"name": topic},
            )
            assert locked.rowcount == 1, "the table must exist before its catalog row can be held"
            try:
                yield
            finally:
                transaction.rollback()
    finally:
        engine.dispose()


def folder_files(node: TableNode, topic: str = TOPIC) -> set[str]:
    """Every file under ``topic``'s table folder, relative to it (``data/...``, ``metadata/...``)."""
    config = node.config()
    folder = table_path(config, topic)

    async def listed() -> set[str]:
        provider = open_cold_provider(config)
        try:
            return {item.key.removeprefix(folder + "/") for item in await provider.list_objects(folder)}
        finally:
            await provider.close()

    return asyncio.run(listed())


def referenced_files(node: TableNode, topic: str = TOPIC) -> set[str]:
    """Every file the table's current metadata reaches, relative to its folder."""
    table = node.table(topic)
    location = table.location()
    prefixes = (location + "/", location.removeprefix("file://") + "/")
    relative = set()
    for path in table_references(table).all():
        prefix = next(p for p in prefixes if path.startswith(p))
        relative.add(path.removeprefix(prefix))
    return relative
