"""One local[2] SparkSession for every Spark test, and archives of known messages on POSIX and S3."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tests.fixtures.s3 import S3Server
from tests.spark.helpers import Archive, archive_messages, make_message
from tieredstore.spark import register

ORDER_QUEUES = {0: 240, 1: 130, 2: 60}
BIG_BODY = 300 * 1024
# Queue "abandoned"/0: a commit cut short after 40 messages, recovered under a lease (bytes left in place).
ABANDON_AFTER = {("abandoned", 0): 40}


def _require_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java_home and Path(java_home, "bin", "java").exists()):
        pytest.fail("the Spark tests need Java 17 (java on PATH or JAVA_HOME); it was not found", pytrace=False)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the group into the test's id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` every test using the session goes to one worker: one JVM and one build of
    the session's archives, not one per worker."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    _require_java()
    # Python workers must be this interpreter: it is the one with tieredstore, pyarrow and aiobotocore.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("tieredstore-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def _order_messages() -> dict[tuple[str, int], list[Any]]:
    messages: dict[tuple[str, int], list[Any]] = {
        ("orders", queue_id): [make_message("orders", queue_id, offset) for offset in range(count)]
        for queue_id, count in ORDER_QUEUES.items()
    }
    messages[("empty", 0)] = []
    messages[("holes", 0)] = [make_message("holes", 0, offset) for offset in [*range(0, 33), *range(60, 100)]]
    messages[("abandoned", 0)] = [make_message("abandoned", 0, offset) for offset in range(90)]
    messages[("big", 0)] = [
        make_message("big", 0, 0, body_size=10),
        make_message("big", 0, 1, body_size=BIG_BODY),
        make_message("big", 0, 2, body_size=10),
    ]
    return messages


@pytest.fixture(scope="session")
def posix_archive(tmp_path_factory: pytest.TempPathFactory) -> Archive:
    root = tmp_path_factory.mktemp("spark-posix")
    archive = Archive("posix", str(root / "cold"), f"sqlite:///{root / 'metadata.db'}")
    asyncio.run(archive_messages(archive, {}, _order_messages(), abandon_after=ABANDON_AFTER))
    return archive


@pytest.fixture(scope="session")
def s3_archive(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> Archive:
    bucket = f"tieredstore-spark-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket)
    root = tmp_path_factory.mktemp("spark-s3")
    provider_options = s3_server.provider_options()
    archive = Archive(
        "s3",
        f"s3://{bucket}/archive",
        f"sqlite:///{root / 'metadata.db'}",
        storage_options={name: str(value) for name, value in provider_options.items()},
    )
    asyncio.run(archive_messages(archive, provider_options, _order_messages(), abandon_after=ABANDON_AFTER))
    return archive


@pytest.fixture(params=["posix", "s3"])
def archive(request: pytest.FixtureRequest) -> Archive:
    """The same messages on each storage backend in turn."""
    return request.getfixturevalue(f"{request.param}_archive")  # type: ignore[no-any-return]
