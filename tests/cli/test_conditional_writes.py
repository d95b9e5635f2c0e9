"""``tieredstore run`` on S3 checks that the endpoint refuses a second conditional create before archiving.

The endpoint that ignores ``If-None-Match`` is moto behind the fault proxy stripping that header, with
metadata on SQLite and on PostgreSQL (where leases are on by default) through ``metadata_url``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.s3_nodes import s3_node, stored_keys
from tests.cli.test_restore import TOPIC, produce
from tests.fixtures.faultproxy import FaultProxy
from tests.fixtures.s3 import S3Server
from tieredstore.config import load_config
from tieredstore.errors import ConditionalWritesUnsupportedError
from tieredstore.formats.naming import FileType
from tieredstore.metrics import Metrics
from tieredstore.providers.chunks import PROBE_FOLDER
from tieredstore.runtime import open_runtime

UNSUPPORTED = 's3.conditional_writes = "unsupported"'


@pytest.fixture
def ignoring(s3_server: S3Server) -> Iterator[FaultProxy]:
    """moto behind a proxy that drops If-None-Match: an endpoint that accepts the header and ignores it."""
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.strip_request_headers = frozenset({"if-none-match"})
        yield proxy


def test_run_refuses_an_endpoint_that_ignores_if_none_match_and_archives_nothing(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, metadata_url: str, ignoring: FaultProxy
) -> None:
    node = s3_node(tmp_path, s3_server, s3_bucket_url, metadata_url, ignoring.endpoint_url)
    produce(node, 0, 50)
    result = node("run", "--once")
    assert result.exit_code == 4, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("tieredstore: error: ") and UNSUPPORTED in line
    assert stored_keys(s3_server, s3_bucket) == []  # nothing archived, the probe key deleted
    (row,) = node("status", output="json").json()["rows"]
    assert (row["topic"], row["archived"], row["lag"]) == (TOPIC, None, 50)
    probes = [path for method, path in ignoring.requests if method == "PUT"]
    assert probes and all(f"/{PROBE_FOLDER}/" in path for path in probes)


def test_run_archives_on_an_endpoint_that_honours_it(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, metadata_url: str
) -> None:
    node = s3_node(tmp_path, s3_server, s3_bucket_url, metadata_url)
    produce(node, 0, 50)
    assert node("run", "--once").exit_code == 0
    keys = stored_keys(s3_server, s3_bucket)
    assert keys and not any(PROBE_FOLDER in key for key in keys)
    assert node("verify", "--deep").exit_code == 0


def test_unsupported_archives_a_single_archiver_and_reads_need_no_probe(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, metadata_url: str, ignoring: FaultProxy
) -> None:
    node = s3_node(tmp_path, s3_server, s3_bucket_url, metadata_url, ignoring.endpoint_url)
    node.env.update({"TIEREDSTORE_S3__CONDITIONAL_WRITES": "unsupported", "TIEREDSTORE_ARCHIVER__LEASES": "false"})
    produce(node, 0, 200)
    result = node("run", "--once")
    assert result.exit_code == 0, result.stderr
    puts = [path for method, path in ignoring.requests if method == "PUT"]
    assert puts and not any(PROBE_FOLDER in path for path in puts)
    chunk_puts = [path for path in puts if "/COMMIT_LOG/" in path or "/CONSUME_QUEUE/" in path]
    chunk_reads = [path for method, path in ignoring.requests if method == "GET" and path in chunk_puts]
    assert chunk_puts and set(chunk_reads) == set(chunk_puts)  # every chunk read back after it was written
    assert node("verify", "--deep").exit_code == 0

    # Reading commands open the bucket without writing it: with the default setting they do not probe.
    del node.env["TIEREDSTORE_S3__CONDITIONAL_WRITES"]
    seen = len(ignoring.requests)
    assert node("verify", "--deep").exit_code == 0
    read = node("read", TOPIC, "0", "--offset", "0", "--count", "200", "--tier", "cold", output="json")
    assert read.exit_code == 0, read.stderr
    assert not [path for method, path in ignoring.requests[seen:] if method == "PUT"]


@pytest.mark.postgres
def test_unsupported_refuses_leases_with_one_line(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, postgres_url: str
) -> None:
    node = s3_node(tmp_path, s3_server, s3_bucket_url, postgres_url)
    node.env["TIEREDSTORE_S3__CONDITIONAL_WRITES"] = "unsupported"
    produce(node, 0, 20)
    for leases in ({}, {"TIEREDSTORE_ARCHIVER__LEASES": "true"}):  # on by default for PostgreSQL
        node.env.update(leases)
        result = node("run", "--once")
        assert result.exit_code == 7, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert "leases" in line and UNSUPPORTED in line and "leases = false" in line
    assert stored_keys(s3_server, s3_bucket) == []


def probes(metrics: Metrics, result: str) -> float:
    sample = metrics.registry.get_sample_value("tieredstore_conditional_write_probes_total", {"result": result})
    return float(sample or 0)


async def test_only_a_cold_owner_probes_and_the_probe_is_counted(
    tmp_path: Path, s3_server: S3Server, s3_bucket_url: str, ignoring: FaultProxy
) -> None:
    s3: dict[str, Any] = {**s3_server.provider_options(), "endpoint_url": ignoring.endpoint_url}
    config = load_config(data_dir=tmp_path / "node", cold_url=s3_bucket_url, s3=s3)
    metrics = Metrics()
    async with open_runtime(config, hot=False, cold_owner=False, metrics=metrics):
        pass
    assert ignoring.count("PUT") == 0 and probes(metrics, "ignored") == 0
    with pytest.raises(ConditionalWritesUnsupportedError):
        async with open_runtime(config, hot=False, metrics=metrics):
            pass
    assert probes(metrics, "ignored") == 1
    honest = load_config(data_dir=tmp_path / "node", cold_url=s3_bucket_url, s3=s3_server.provider_options())
    async with open_runtime(honest, hot=False, metrics=metrics):
        assert probes(metrics, "honoured") == 1


async def test_a_cold_owner_opened_during_an_outage_checks_before_its_first_write(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, ignoring: FaultProxy
) -> None:
    s3: dict[str, Any] = {**s3_server.provider_options(), "endpoint_url": ignoring.endpoint_url, "max_attempts": 1}
    config = load_config(data_dir=tmp_path / "node", cold_url=s3_bucket_url, s3=s3)
    async with contextlib.AsyncExitStack() as stack:
        with ignoring.outage():  # only while it opens: the check cannot reach storage and is put off
            runtime = await stack.enter_async_context(open_runtime(config, hot=False))
        segment = runtime.provider.segment(FileType.COMMIT_LOG, "c/b/t/0", 0)
        segment.append(b"not on this endpoint")
        with pytest.raises(ConditionalWritesUnsupportedError):
            await segment.commit()
    assert stored_keys(s3_server, s3_bucket) == []
