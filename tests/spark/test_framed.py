"""Archives the archiver wrote compressed and encrypted, read by Spark with the keyring its options name.

Messages go in with ``tieredstore put`` and ``tieredstore run --once`` archives them, on POSIX and on S3
(moto over HTTP), with small segments so each queue spans several. Topic ``Sealed`` is archived with
``[cold] compression = "zstd"`` and an active key: every segment is compressed and encrypted. Topic
``Switched`` is archived first with no codec, then with both, so it holds plain segments and framed ones.
Topic ``Small`` is one framed segment per file, so its plan needs no read. Spark must return every message
as it was put, with the key's material in no plan, log or pickle, and fail naming the key id when it lacks
the key: on the driver when planning must read a framed segment, else in the task.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException, PythonException
from pyspark.sql import DataFrame, SparkSession

from tests.cli.helpers import invoke
from tests.fixtures.s3 import S3Server
from tieredstore.providers.chunks import ObjectInfo
from tieredstore.providers.s3 import S3ObjectStore
from tieredstore.scan import ScanOptions, plan_partitions, read_partition
from tieredstore.spark.source import TieredStorePartition, TieredStoreReader

pytestmark = pytest.mark.spark

KEY_ID = "spark-k1"
SWITCHED_BEFORE = 40  # messages of Switched archived before the codecs were switched on
COUNTS = {"Sealed": 80, "Switched": 80, "Small": 5}
TOPICS = ",".join(COUNTS)
KEYRING_VARIABLE = "SPARK_TEST_KEYRING"

Message = tuple[str, int, bytes, list[str], str | None]  # topic, queue offset, body, keys, tags


def _key_text() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def _line(topic: str, n: int) -> dict[str, Any]:
    # JSON bodies of repeated words, as the demo's: zstd has something to compress.
    body = json.dumps({"topic": topic, "order": n, "items": ["widget"] * (n % 9), "note": "paid " * (n % 13)})
    return {"body": body, "keys": [f"order-{n}"] if n % 3 else [], "tags": f"t{n % 2}" if n % 4 else None}


def _message(topic: str, n: int) -> Message:
    line = _line(topic, n)
    return topic, n, line["body"].encode(), line["keys"], line["tags"]


@dataclass
class FramedArchive:
    """Where the archive is, the keyring file that opens it, and every message put into it."""

    root: Path
    cold_url: str
    metadata_url: str
    key_text: str = field(repr=False)
    storage: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def keyring_file(self) -> Path:
        return self.root / "keyring.toml"

    def options(self, **extra: str) -> dict[str, str]:
        return {"cold_url": self.cold_url, "metadata_url": self.metadata_url, **self.storage, **extra}

    def keyring(self, name: str, keys: dict[str, str]) -> str:
        """A keyring file of ``keys`` (id = base64), by path."""
        path = self.root / name
        path.write_text("[keys]\n" + "".join(f'"{key_id}" = "{text}"\n' for key_id, text in keys.items()))
        return str(path)

    @property
    def expected(self) -> list[Message]:
        return sorted(_message(topic, n) for topic, count in COUNTS.items() for n in range(count))


def _archive(root: Path, cold_url: str, env: dict[str, str], storage: dict[str, str]) -> FramedArchive:
    key_text = _key_text()
    archive = FramedArchive(root, cold_url, f"sqlite:///{root / 'metadata.db'}", key_text, storage)
    archive.keyring(archive.keyring_file.name, {KEY_ID: key_text})
    common = (
        f'data_dir = "{root / "data"}"\ncold_url = "{cold_url}"\nmetadata_url = "{archive.metadata_url}"\n'
        "[segments]\ncommit_log_max_size = 4096\nconsume_queue_max_size = 200\n"
    )
    plain = root / "plain.toml"
    plain.write_text(common)
    framed = root / "framed.toml"
    framed.write_text(
        common + '[cold]\ncompression = "zstd"\n'
        f'[encryption]\nkeyring_file = "{archive.keyring_file}"\nactive_key = "{KEY_ID}"\n'
    )

    def run(config: Path, *args: str, lines: list[dict[str, Any]] | None = None) -> None:
        given = None if lines is None else "".join(json.dumps(line) + "\n" for line in lines)
        result = invoke(["--config", str(config), *args], input=given, env=env)
        assert result.exit_code == 0, result.stderr

    run(plain, "put", "Switched", "0", "--jsonl", lines=[_line("Switched", n) for n in range(SWITCHED_BEFORE)])
    run(plain, "run", "--once")
    later = [_line("Switched", n) for n in range(SWITCHED_BEFORE, COUNTS["Switched"])]
    run(framed, "put", "Switched", "0", "--jsonl", lines=later)
    for topic in ("Sealed", "Small"):
        run(framed, "put", topic, "0", "--jsonl", lines=[_line(topic, n) for n in range(COUNTS[topic])])
    run(framed, "run", "--once")
    return archive


@pytest.fixture(scope="module")
def posix_framed(tmp_path_factory: pytest.TempPathFactory) -> FramedArchive:
    root = tmp_path_factory.mktemp("framed-posix")
    archive = _archive(root, str(root / "cold"), {}, {})
    descriptors = {path.parent.parent.parent.parent.name for path in (root / "cold").rglob("COMMIT_LOG/*/.codec")}
    plain = {p.parent.parent.parent.name for p in (root / "cold").rglob("COMMIT_LOG/*") if p.is_file()}
    assert descriptors == set(COUNTS) and plain == {"Switched"}, "Switched holds plain and framed segments"
    return archive


@pytest.fixture(scope="module")
def s3_framed(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> Iterator[FramedArchive]:
    client = s3_server.client()
    bucket = f"tieredstore-framed-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    storage = {name: str(value) for name, value in s3_server.provider_options().items()}
    yield _archive(tmp_path_factory.mktemp("framed-s3"), f"s3://{bucket}/archive", s3_server.settings(), storage)
    for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        client.delete_object(Bucket=bucket, Key=item["Key"])
    client.delete_bucket(Bucket=bucket)


@pytest.fixture(params=["posix", "s3"])
def framed(request: pytest.FixtureRequest) -> FramedArchive:
    return request.getfixturevalue(f"{request.param}_framed")  # type: ignore[no-any-return]


def _load(spark: SparkSession, archive: FramedArchive, topics: str = TOPICS, **options: str) -> DataFrame:
    return spark.read.format("tieredstore").options(**archive.options(**options)).load(topics)


def _messages(frame: DataFrame) -> list[Message]:
    return sorted(
        (row["topic"], row["queue_offset"], bytes(row["body"]), list(row["keys"]), row["tags"])
        for row in frame.collect()
    )


def test_compressed_and_encrypted_segments_read_back_as_put(spark: SparkSession, framed: FramedArchive) -> None:
    keyring_file = str(framed.keyring_file)
    assert _messages(_load(spark, framed, keyring_file=keyring_file)) == framed.expected
    # Partitions split inside framed segments: each split point is found by reading framed consume-queue units.
    small = _load(spark, framed, keyring_file=keyring_file, max_partition_bytes="1500")
    assert small.rdd.getNumPartitions() > 12
    assert _messages(small) == framed.expected


def test_a_keyring_in_an_environment_variable_reads_the_same(
    posix_framed: FramedArchive, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without Spark: planning and reading load the keyring where they run, here from the environment, and
    log what they did without it."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(KEYRING_VARIABLE, f"other={_key_text()},{KEY_ID}={posix_framed.key_text}")
    options = ScanOptions.parse({"path": TOPICS, **posix_framed.options(keyring_env=KEYRING_VARIABLE)})
    rows = [
        row for plan in plan_partitions(options) for batch in read_partition(plan, options) for row in batch.to_pylist()
    ]
    assert (
        sorted((r["topic"], r["queue_offset"], r["body"], r["keys"], r["tags"]) for r in rows) == posix_framed.expected
    )


@contextmanager
def _spark_logs(spark: SparkSession) -> Iterator[list[str]]:
    """What the driver JVM logs at INFO while the block runs (executors' task failures included), at its end."""
    jvm = spark._jvm
    assert jvm is not None
    core = jvm.org.apache.logging.log4j.core
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    writer = jvm.java.io.StringWriter()
    appender = core.appender.WriterAppender.createAppender(
        core.layout.PatternLayout.createDefaultLayout(config), None, writer, "tieredstore-test", False, True
    )
    appender.start()
    root = config.getRootLogger()
    # The console's appenders step aside meanwhile: INFO lines would flood the test's output.
    console = dict(root.getAppenders())
    for name in console:
        root.removeAppender(name)
    root.addAppender(appender, None, None)
    context.updateLoggers()
    spark.sparkContext.setLogLevel("INFO")
    captured: list[str] = []
    try:
        yield captured
        captured.append(str(writer.toString()))
    finally:
        spark.sparkContext.setLogLevel("ERROR")
        root.removeAppender("tieredstore-test")
        for other in console.values():
            root.addAppender(other, None, None)
        context.updateLoggers()
        appender.stop()


def test_the_key_stays_out_of_plans_logs_and_what_travels_to_executors(
    spark: SparkSession, posix_framed: FramedArchive, capsys: pytest.CaptureFixture[str]
) -> None:
    keyring_file = str(posix_framed.keyring_file)
    options = ScanOptions.parse({"path": TOPICS, **posix_framed.options(keyring_file=keyring_file)})
    reader = TieredStoreReader(options)
    partitions = [TieredStorePartition(plan) for plan in plan_partitions(options)]
    assert posix_framed.key_text.encode() not in pickle.dumps(reader) + pickle.dumps(partitions)
    assert posix_framed.key_text not in repr(reader) and keyring_file in repr(reader)

    wrong_key = _key_text()
    wrong = posix_framed.keyring("wrong-for-logs.toml", {KEY_ID: wrong_key})
    with _spark_logs(spark) as logs:
        frame = _load(spark, posix_framed, keyring_file=keyring_file).where("queue_offset < 50")
        frame.explain(True)
        assert frame.count() == 105
        # A task fails: the executor logs its Python traceback.
        with pytest.raises(PythonException, match="WrongKeyError"):
            _load(spark, posix_framed, "Small", keyring_file=wrong).collect()
    plan_text = capsys.readouterr().out
    assert "== Physical Plan ==" in plan_text and "BatchScan tieredstore" in plan_text
    (log,) = logs
    assert "Finished task" in log and f"key '{KEY_ID}' does not unwrap" in log, log
    for secret in (posix_framed.key_text, wrong_key):
        assert secret not in plan_text and secret not in log


def test_a_missing_or_wrong_key_fails_naming_the_key(spark: SparkSession, posix_framed: FramedArchive) -> None:
    """In a task when the plan needed no read (Small), on the driver when it had to open a framed segment."""
    missing = f"MissingKeyError: .*wrapped by key '{KEY_ID}', which the keyring does not hold"
    wrong = f"WrongKeyError: .*key '{KEY_ID}' does not unwrap its data key"
    keyrings = {
        missing: posix_framed.keyring("other.toml", {"other": _key_text()}),
        wrong: posix_framed.keyring("wrong.toml", {KEY_ID: _key_text()}),
    }
    for complaint, keyring_file in keyrings.items():
        with pytest.raises(PythonException, match=complaint):
            _load(spark, posix_framed, "Small", keyring_file=keyring_file).collect()
        with pytest.raises(AnalysisException, match=complaint):
            _load(spark, posix_framed, "Sealed", keyring_file=keyring_file).collect()
    with pytest.raises(PythonException, match=missing):
        _load(spark, posix_framed, "Small").collect()


def test_planning_a_whole_framed_queue_reads_only_its_later_segments_heads(
    s3_framed: FramedArchive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the segment rows: no listing, no consume-queue read; a framed commit-log segment after the first
    costs its first frame's head, then its ``.codec`` and the whole frame side by side, read by name."""
    requests: list[tuple[str, str]] = []
    list_files, get_range = S3ObjectStore.list_files, S3ObjectStore.get_range

    async def listed(self: S3ObjectStore, folder: str) -> list[ObjectInfo]:
        requests.append(("list", folder))
        return await list_files(self, folder)

    async def got(self: S3ObjectStore, key: str, start: int, length: int) -> bytes:
        requests.append(("get", key))
        return await get_range(self, key, start, length)

    monkeypatch.setattr(S3ObjectStore, "list_files", listed)
    monkeypatch.setattr(S3ObjectStore, "get_range", got)
    options = ScanOptions.parse({"path": "Sealed,Small", **s3_framed.options(keyring_file=str(s3_framed.keyring_file))})
    planned = plan_partitions(options)
    small = [plan for plan in planned if plan.topic == "Small"]
    later = {plan.layout.commit_log[0].base_offset for plan in planned if plan.topic == "Sealed"} - {0}
    assert len(small) == 1 and len(later) > 2
    assert all(kind == "get" and "/Sealed/0/COMMIT_LOG/" in key for kind, key in requests), requests
    segments = Counter(key.rsplit("/", 1)[0] for _, key in requests)
    assert len(segments) == len(later) and set(segments.values()) == {3}, requests
