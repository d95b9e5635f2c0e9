"""S3 under injected faults: the fault proxy does what it says, and the container layer archives through it.

The archiver-level scenario (200,000 messages under 5% 500 + 2% SlowDown + 1% resets) needs the
dispatcher; this is the layer below it, driven the way the dispatcher drives it: append a batch,
commit, retry a failed commit from the kept buffers.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from tests.fixtures.faultproxy import Fault, FaultProxy, FaultRates, FaultRule
from tests.fixtures.s3 import S3Server
from tests.reliability.workload import append_records, commit_until_durable, new_flat_store
from tieredstore.errors import CorruptRecordError, StorageError
from tieredstore.flat import check_queue_invariant
from tieredstore.formats.message import decode
from tieredstore.metadata import MetadataStore
from tieredstore.providers.s3 import S3Provider

pytestmark = pytest.mark.reliability

ISSUE_RATES = FaultRates(internal_error=0.05, slow_down=0.02, reset=0.01, truncate=0.01, latency=0.002)
# Two attempts only, so some commits fail past the provider and the container layer's retry is exercised too.
FAST_RETRIES = {"retry_initial_delay": 0.005, "retry_max_delay": 0.05, "max_attempts": 2}


def boto_outcomes(proxy: FaultProxy, s3_server: S3Server, bucket: str, calls: int) -> list[str]:
    """What a plain boto3 client (no retries) sees for ``calls`` GETs of one object through the proxy."""
    s3_server.client().put_object(Bucket=bucket, Key="probe", Body=bytes(range(256)) * 64)
    proxied = boto3.client(
        "s3",
        endpoint_url=proxy.endpoint_url,
        region_name=s3_server.region,
        aws_access_key_id=s3_server.access_key_id,
        aws_secret_access_key=s3_server.secret_access_key,
        config=Config(retries={"total_max_attempts": 1}),
    )
    outcomes = []
    for _ in range(calls):
        try:
            body = proxied.get_object(Bucket=bucket, Key="probe")["Body"].read()
            outcomes.append("ok" if body == bytes(range(256)) * 64 else "WRONG BYTES")
        except botocore.exceptions.ClientError as error:
            outcomes.append(error.response["Error"]["Code"])
        except (botocore.exceptions.BotoCoreError, ConnectionError) as error:
            outcomes.append(type(error).__name__)
    return outcomes


def test_the_proxy_injects_each_fault_at_its_rate_deterministically(s3_server: S3Server, s3_bucket: str) -> None:
    rates = FaultRates(internal_error=0.2, slow_down=0.1, reset=0.1, truncate=0.1)
    runs = []
    for _ in range(2):
        with FaultProxy(s3_server.endpoint_url, rates=rates, seed=42) as proxy:
            outcomes = boto_outcomes(proxy, s3_server, s3_bucket, 300)
            runs.append((outcomes, proxy.summary()))
    (outcomes, summary), (again, summary_again) = runs
    assert (outcomes, summary) == (again, summary_again)  # same seed, same requests: same faults
    assert "WRONG BYTES" not in outcomes  # a cut reply is an error, never short data
    assert summary["requests"] == 300
    for fault, rate in ((Fault.INTERNAL_ERROR, 0.2), (Fault.SLOW_DOWN, 0.1), (Fault.RESET, 0.1), (Fault.TRUNCATE, 0.1)):
        # Decisions hash the request path, which holds a random bucket name: counts are binomial draws,
        # so allow 4.5 standard deviations (a proxy ignoring its rates is still far outside).
        sigma = (300 * rate * (1 - rate)) ** 0.5
        assert abs(summary[str(fault)] - rate * 300) < 4.5 * sigma, summary
    assert outcomes.count("InternalError") == summary[str(Fault.INTERNAL_ERROR)]
    assert outcomes.count("SlowDown") == summary[str(Fault.SLOW_DOWN)]
    cut = summary[str(Fault.RESET)] + summary[str(Fault.TRUNCATE)]
    assert len(outcomes) - outcomes.count("ok") - outcomes.count("InternalError") - outcomes.count("SlowDown") == cut
    with FaultProxy(s3_server.endpoint_url, rates=rates, seed=43) as other:
        assert boto_outcomes(other, s3_server, s3_bucket, 300) != outcomes  # another seed, another run


def test_an_outage_refuses_connections_until_it_ends(s3_server: S3Server, s3_bucket: str) -> None:
    with FaultProxy(s3_server.endpoint_url) as proxy:
        port = int(proxy.endpoint_url.rsplit(":", 1)[1])
        with proxy.outage(), pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
            pass
        assert boto_outcomes(proxy, s3_server, s3_bucket, 3) == ["ok", "ok", "ok"]


async def test_the_container_layer_archives_through_s3_faults_exactly_once(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    messages, batch = 3000, 20
    with FaultProxy(s3_server.endpoint_url, rates=ISSUE_RATES, seed=2024) as proxy:
        options = {**s3_options, "endpoint_url": proxy.endpoint_url, **FAST_RETRIES}
        with MetadataStore.open(f"sqlite:///{tmp_path / 'metadata.db'}") as metadata:
            async with S3Provider(f"s3://{s3_bucket}/archive", **options) as provider:
                store = new_flat_store(provider, metadata)
                queue = await store.get_or_create("S3Faults", 0)
                reference: dict[int, bytes] = {}
                failed_commits = 0
                for start in range(0, messages, batch):
                    if start == messages // 2:
                        # Both provider attempts of one commit fail, so at least one commit must be
                        # retried from its kept buffer whatever the random faults did.
                        proxy.fail(FaultRule("PUT", 500, "InternalError", times=2, path_contains="COMMIT_LOG"))
                    reference |= await append_records(queue, start, start + batch)
                    archived, failures = await commit_until_durable(queue)
                    failed_commits += failures
                    assert archived == start + batch
                assert failed_commits > 0  # some commits failed past the provider and were retried from buffers
                proxy.rates = FaultRates()  # the checker reads everything once; it is not the reader under test
                assert await check_queue_invariant(queue, reference=reference) == []
                proxy.rates = ISSUE_RATES

                served, read_errors = 0, 0
                for offset in range(0, messages, 25):  # readers under the same faults
                    try:
                        records = await queue.read_messages(offset, 25)
                    except StorageError:
                        read_errors += 1
                        continue
                    for position, raw in enumerate(records):
                        try:
                            record = decode(raw)
                        except CorruptRecordError:
                            pytest.fail(f"a corrupt record was served at queue offset {offset + position}")
                        assert (
                            record.queue_offset == offset + position
                            and record.body == decode(reference[offset + position]).body
                        )
                        served += 1
            restarted = new_flat_store(S3Provider(f"s3://{s3_bucket}/archive", **s3_options), metadata)
            report = await restarted.recover()
            assert report.failed == {}
            assert await check_queue_invariant(restarted.get("S3Faults", 0), reference=reference) == []
            await restarted.provider.close()
        summary = proxy.summary()
    assert proxy.injected_total > 30, summary
    print(
        f"\nfigures s3-faults: {messages} messages, {summary['requests']} requests, injected {summary}, "
        f"{failed_commits} failed commits retried, {served} served / {read_errors} reads refused typed"
    )
