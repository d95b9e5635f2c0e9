"""The upload cap (``archiver.max_upload_bytes_per_second``): one budget for every queue, big batches still go.

The archive runs through ``open_runtime`` exactly as ``tieredstore run`` wires it, on POSIX and on S3
over HTTP. Durations are checked from below only (a throttle can only make things slower, and a loaded
machine only slower still), so these tests cannot flake on a slow host.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.s3 import S3Server
from tests.reliability.archiver_run import invariant_problems, s3_config
from tieredstore.cli import main
from tieredstore.cli.app import EXIT_CONFIG
from tieredstore.config import ArchiverSettings, TieredStoreConfig, load_config
from tieredstore.dispatcher import Dispatcher
from tieredstore.errors import CommitTimeoutError, ConfigError
from tieredstore.formats.naming import FileType
from tieredstore.metrics import Metrics
from tieredstore.providers.memory import MemoryProvider
from tieredstore.providers.throttle import UploadBudget
from tieredstore.runtime import archiving_provider, open_runtime

RATE = 256 << 10  # bytes a second
BODY = 4 << 10
MESSAGES_PER_QUEUE = 80  # 4 queues of 320 KiB of bodies: with the big batch about 2 MiB, 8 s at the rate
QUEUES = 4
BIG_BODY = 768 << 10  # three seconds' worth: above the one-second budget


async def test_spending_more_than_the_budget_waits_at_the_rate_and_a_big_spend_goes_alone() -> None:
    waits: list[float] = []
    budget = UploadBudget(100_000, on_wait=waits.append)  # 100 kB/s, a budget of 100 kB
    started = time.monotonic()
    assert await budget.spend(100_000) == 0.0  # a full bucket: the first second's worth goes at once
    await budget.spend(50_000)  # half a second's worth more
    await budget.spend(250_000)  # above the budget: waits for a full bucket, then goes whole
    assert budget.tokens < 0  # ... leaving a debt
    await budget.spend(1)  # which the next upload pays
    elapsed = time.monotonic() - started
    # 400,001 bytes at 100 kB/s with a 100 kB start: at least three seconds, however slow the host.
    assert elapsed >= 0.8 * 3.0
    assert len(waits) == 3 and sum(waits) <= elapsed + 0.01


async def test_waiting_for_the_budget_is_not_a_hang() -> None:
    """The watchdog times the upload, not its wait for the budget: a long throttle wait is no timeout."""
    metrics = Metrics()
    name = "throttled-watchdog"
    settings = ArchiverSettings(max_upload_bytes_per_second=20_000, commit_timeout=0.5)
    provider = archiving_provider(MemoryProvider(f"memory://{name}"), settings, metrics)
    try:
        segment = provider.segment(FileType.COMMIT_LOG, "topic/0", 0)
        for _ in range(2):  # the second commit waits a second for its budget: twice the commit timeout
            segment.append(b"x" * 20_000)
            await segment.commit()
        assert segment.commit_position == 40_000
        assert metrics.registry.get_sample_value("tieredstore_upload_throttled_seconds_total") >= 0.8
    except CommitTimeoutError as error:  # pragma: no cover - the failure this test exists to catch
        pytest.fail(f"a wait for the upload budget was taken for a hang: {error}")
    finally:
        MemoryProvider.wipe(name)


def _posix_config(data_dir: Path, **archiver: Any) -> TieredStoreConfig:
    return TieredStoreConfig(
        data_dir=data_dir,
        hot={"commit_log_file_size": 16 << 20, "max_message_size": 1 << 20},
        archiver={"group_commit_count": 32, "group_commit_timeout": 0, **archiver},
    )


@pytest.fixture(params=["posix", "s3"])
def throttled_config(request: pytest.FixtureRequest, tmp_path: Path) -> TieredStoreConfig:
    throttle = {"max_upload_bytes_per_second": RATE}
    if request.param == "posix":
        return _posix_config(tmp_path / "data", **throttle)
    s3: S3Server = request.getfixturevalue("s3_server")
    bucket_url: str = request.getfixturevalue("s3_bucket_url")
    config = s3_config(tmp_path / "data", bucket_url, s3, s3.endpoint_url, group_commit_count=32, **throttle)
    return config.model_copy(update={"hot": config.hot.model_copy(update={"max_message_size": 1 << 20})})


@pytest.mark.timeout(120)
async def test_a_throttled_archive_of_many_queues_runs_no_faster_than_the_cap(
    throttled_config: TieredStoreConfig,
) -> None:
    async with open_runtime(throttled_config) as runtime:
        hot = runtime.hot
        assert hot is not None
        for queue_id in range(QUEUES):
            for n in range(MESSAGES_PER_QUEUE):
                hot.put_message("Throttled", queue_id, bytes([n % 251]) * BODY)
        hot.put_message("BigBatch", 0, b"B" * BIG_BODY)  # one message, one batch, above the budget
        dispatcher = Dispatcher.from_runtime(runtime)
        started = time.monotonic()
        result = await dispatcher.run_once()
        elapsed = time.monotonic() - started
        archived, problems = await invariant_problems(runtime)
        throttled = runtime.metrics.registry.get_sample_value("tieredstore_upload_throttled_seconds_total")

    assert result.failed == {} and problems == []
    assert archived == QUEUES * MESSAGES_PER_QUEUE + 1  # the big batch went, whole, exactly once
    # Every record byte went through the budget (consume queues and metadata only add to it), less the
    # one second's worth the full bucket lets through at once.
    uploaded = result.stats.bytes
    assert uploaded > QUEUES * MESSAGES_PER_QUEUE * BODY + BIG_BODY
    floor = (uploaded - RATE) / RATE
    assert elapsed >= 0.8 * floor, f"{uploaded:,} bytes at {RATE:,} B/s took {elapsed:.2f}s"
    assert throttled is not None and throttled > 0  # the metric shows the commits waited for their budget


@pytest.mark.parametrize(
    ("variable", "value"),
    [("MAX_UPLOAD_BYTES_PER_SECOND", "50MiB"), ("MAX_UPLOAD_BYTES_PER_SECOND", "0"), ("COMMIT_TIMEOUT", "-1")],
)
def test_tieredstore_run_refuses_a_bad_cap_or_timeout_in_one_line_with_exit_7_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    data_dir = tmp_path / "data"
    monkeypatch.setenv(f"TIEREDSTORE_ARCHIVER__{variable}", value)
    assert main(["--data-dir", str(data_dir), "run", "--once"]) == EXIT_CONFIG
    captured = capsys.readouterr()
    assert captured.err.startswith("tieredstore: error: invalid configuration") and variable.lower() in captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""
    assert not data_dir.exists()


def test_the_cap_and_the_timeout_are_refused_unless_positive(tmp_path: Path) -> None:
    for bad in (0, -5, "fast"):
        with pytest.raises(ConfigError, match="max_upload_bytes_per_second"):
            load_config(data_dir=tmp_path, archiver={"max_upload_bytes_per_second": bad})
    with pytest.raises(ConfigError, match="commit_timeout"):
        load_config(data_dir=tmp_path, archiver={"commit_timeout": 0})
    defaults = load_config(data_dir=tmp_path).archiver
    assert (defaults.max_upload_bytes_per_second, defaults.commit_timeout) == (None, 120.0)
