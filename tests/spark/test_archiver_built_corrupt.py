"""End to end: one bit flipped in an archive the archiver built on S3, met by every reader.

Messages go in with ``tieredstore put`` and ``tieredstore run --once`` archives them to the moto server
over HTTP, as a user does. Then one body bit of one record is flipped in its commit-log chunk, and the
object is rewritten behind the archiver's back with a checksum of the new bytes, so S3's object
checksum passes and only the record's own CRC can tell. Every reader must name the damage or route
around it. None may serve the damaged bytes:

- the application's store, cold only: CorruptRecordError naming topic, queue and offset; the
  records before it are still served;
- the application's store with its hot copy still there: the intact hot record, even under FORCE;
- ``tieredstore read --tier cold``: exit 5 in one line; ``verify --deep``: exit 5 naming the offset;
- Spark: the task fails naming the object and offset; ``on_corrupt=skip`` returns all the others.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession

from tests.cli.helpers import invoke
from tests.fixtures.s3 import S3Server
from tieredstore.cli.app import EXIT_INTEGRITY
from tieredstore.config import ReadPolicy, TieredStoreConfig, load_config
from tieredstore.errors import CorruptRecordError
from tieredstore.formats.message import decode, split_back_to_back
from tieredstore.store import TieredMessageStore

pytestmark = pytest.mark.spark

TOPIC = "ArchivedThenDamaged"
COUNT = 60
DAMAGED = 37


@dataclass
class Damaged:
    data_dir: Path
    cold_url: str
    env: dict[str, str]
    chunk_key: str
    bodies: list[bytes]
    damaged_at: int = 0  # the damaged record's commit-log offset (one segment, one chunk, both at 0)

    def cli(self, *args: str, input: str | None = None) -> tuple[int, str, str]:
        result = invoke(
            ["--data-dir", str(self.data_dir), "--cold-url", self.cold_url, *args], input=input, env=self.env
        )
        return result.exit_code, result.stdout, result.stderr

    def config(self) -> TieredStoreConfig:
        with pytest.MonkeyPatch.context() as patch:
            for name, value in self.env.items():
                patch.setenv(name, value)
            return load_config(data_dir=self.data_dir, cold_url=self.cold_url)

    def spark_options(self, **extra: str) -> dict[str, str]:
        return {
            "cold_url": self.cold_url,
            "metadata_url": self.config().effective_metadata_url,
            "endpoint_url": self.env["TIEREDSTORE_S3__ENDPOINT_URL"],
            "region": self.env["TIEREDSTORE_S3__REGION"],
            "access_key_id": self.env["TIEREDSTORE_S3__ACCESS_KEY_ID"],
            "secret_access_key": self.env["TIEREDSTORE_S3__SECRET_ACCESS_KEY"],
            **extra,
        }


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> Iterator[Damaged]:
    client = s3_server.client()
    bucket = f"tieredstore-e2e-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    env = {
        "TIEREDSTORE_S3__ENDPOINT_URL": s3_server.endpoint_url,
        "TIEREDSTORE_S3__REGION": s3_server.region,
        "TIEREDSTORE_S3__ACCESS_KEY_ID": s3_server.access_key_id,
        "TIEREDSTORE_S3__SECRET_ACCESS_KEY": s3_server.secret_access_key,
    }
    bodies = [f"message {n} of the archive, padded {'x' * (n % 7)}".encode() for n in range(COUNT)]
    setup = Damaged(tmp_path_factory.mktemp("e2e"), f"s3://{bucket}/archive", env, "", bodies)
    assert setup.cli("put", TOPIC, "0", input="\n".join(b.decode() for b in bodies) + "\n")[0] == 0
    code, _, stderr = setup.cli("run", "--once")
    assert code == 0, stderr

    (setup.chunk_key,) = [
        item["Key"]
        for item in client.list_objects_v2(Bucket=bucket)["Contents"]
        if f"/{TOPIC}/0/COMMIT_LOG/" in item["Key"]
    ]
    chunk = bytearray(client.get_object(Bucket=bucket, Key=setup.chunk_key)["Body"].read())
    ends = split_back_to_back(bytes(chunk), COUNT + 1)
    assert len(ends) == COUNT + 1, "the archive does not hold every message in one chunk"
    start = setup.damaged_at = ends[DAMAGED]
    record = decode(bytes(chunk[start : ends[DAMAGED + 1]]))
    assert (record.queue_offset, record.body) == (DAMAGED, bodies[DAMAGED])
    body_at = start + bytes(chunk[start : ends[DAMAGED + 1]]).index(bodies[DAMAGED])
    chunk[body_at + 3] ^= 0x10
    # boto3 computes and sends a CRC32 of the new bytes: the object checksum agrees with them.
    client.put_object(Bucket=bucket, Key=setup.chunk_key, Body=bytes(chunk))
    yield setup
    for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        client.delete_object(Bucket=bucket, Key=item["Key"])
    client.delete_bucket(Bucket=bucket)


def test_a_cold_only_store_names_the_damaged_offset_and_serves_the_rest(damaged: Damaged) -> None:
    with TieredMessageStore(damaged.config(), hot=False, read_policy=ReadPolicy.FORCE) as store:
        before = store.get_messages(TOPIC, 0, 0, DAMAGED)
        assert [m.body for m in before.messages] == damaged.bodies[:DAMAGED]
        with pytest.raises(CorruptRecordError) as failure:
            store.get_messages(TOPIC, 0, DAMAGED, 1)
        message = str(failure.value)
        assert TOPIC in message and f"offset {DAMAGED}" in message, message
        after = store.get_messages(TOPIC, 0, DAMAGED + 1, COUNT)
        assert [m.body for m in after.messages] == damaged.bodies[DAMAGED + 1 :]


def test_with_the_hot_copy_there_the_intact_record_is_served_even_under_force(damaged: Damaged) -> None:
    with TieredMessageStore(damaged.config(), read_policy=ReadPolicy.FORCE) as store:
        result = store.get_messages(TOPIC, 0, DAMAGED, 1)
    assert [m.body for m in result.messages] == [damaged.bodies[DAMAGED]]


def test_the_cli_refuses_the_record_and_verify_deep_names_it(damaged: Damaged) -> None:
    code, stdout, stderr = damaged.cli("read", TOPIC, "0", "--offset", str(DAMAGED), "--tier", "cold")
    assert code == EXIT_INTEGRITY, (stdout, stderr)
    assert len(stderr.strip().splitlines()) == 1 and f"{TOPIC}/0 at queue offset {DAMAGED}" in stderr, stderr
    assert "at offset 0" not in stderr, stderr
    assert damaged.bodies[DAMAGED].decode()[:10] not in stdout
    code, stdout, stderr = damaged.cli("verify", TOPIC, "--deep")
    assert code == EXIT_INTEGRITY, (stdout, stderr)
    assert f"queue offset {DAMAGED}" in stdout + stderr, stdout + stderr
    code, _, stderr = damaged.cli("verify", TOPIC)
    assert code == 0, "without --deep the sizes and the invariant hold: " + stderr


def test_spark_fails_naming_the_object_or_skips_only_that_record(spark: SparkSession, damaged: Damaged) -> None:
    frame = spark.read.format("tieredstore").options(**damaged.spark_options()).load(TOPIC)
    with pytest.raises(PythonException) as failure:
        frame.collect()
    segment = damaged.chunk_key.rsplit("/", 1)[0]
    message = str(failure.value)
    assert "CorruptRecordError" in message and f"{segment} at offset {damaged.damaged_at}" in message, message
    skipping = spark.read.format("tieredstore").options(**damaged.spark_options(on_corrupt="skip")).load(TOPIC)
    rows = sorted((row["queue_offset"], bytes(row["body"])) for row in skipping.collect())
    assert rows == [(n, damaged.bodies[n]) for n in range(COUNT) if n != DAMAGED]
