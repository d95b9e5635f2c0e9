"""``tieredstore run``: the archiver as a long-running process, with an optional demo workload and live progress.

SIGTERM or SIGINT stops it cleanly: no new batches are taken, in-flight commits finish (a second
signal abandons them; the next start recovers), positions are flushed to metadata, and the exit code
is 0 within ``shutdown_timeout``. ``--once`` archives what the hot store holds and exits (cron, tests).
``--hot-mode``: by default the archiver owns the hot store when its writer lock is free (the demo and
producers in this process) and follows it read-only when a producer process holds the lock. A
``--hot-mode follower`` started before the producer has created the hot store waits for it.

Several archivers on one PostgreSQL split the queues by lease (``[archiver] leases``, on by default
for PostgreSQL; ``--owner-id`` names the process in the queues table). On SQLite the archiver is
single-process: a second one on the same database refuses to start. Leases are refused on S3 storage
configured without conditional writes (``s3.conditional_writes = "unsupported"``): nothing would fence
an archiver whose lease was taken over.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import structlog
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tieredstore import errors
from tieredstore.cli.app import CliState, app, state
from tieredstore.config import ArchiverSettings, TieredStoreConfig
from tieredstore.dispatcher import Dispatcher, DispatchStats, QueueStatus
from tieredstore.leases import LeaseManager, SingleArchiverLock
from tieredstore.local import LocalMessageStore, PutRequest, hot_writer
from tieredstore.local.follower import HotStoreFollower
from tieredstore.local.store_dir import refuse_non_directory
from tieredstore.metadata.engine import parse_url
from tieredstore.metrics import Metrics
from tieredstore.providers.registry import url_scheme
from tieredstore.providers.s3_choices import UNSUPPORTED_SETTING
from tieredstore.runtime import HotMode, open_runtime
from tieredstore.topic_filter import TopicFilter
from tieredstore.tuning import tune_for_archiver

if TYPE_CHECKING:
    from tieredstore.table.background import BackgroundTableSync

log = structlog.get_logger(__name__)

DEMO_TOPICS = (("DemoOrders", 4), ("DemoPayments", 2))
DEMO_TAGS = ("created", "paid", "shipped", "delivered")
DEMO_TIMEOUT = 1.0  # seconds: a demo shows messages flowing at once instead of after a 30 s group commit
PLAIN_PROGRESS_INTERVAL = 5.0
MB = 1_000_000


class DemoProducer:
    """A thread putting sample messages with keys and tags into a few topics and queues at a steady rate."""

    def __init__(self, hot: LocalMessageStore, total: int, rate: float) -> None:
        self.hot = hot
        self.total = total
        self.rate = rate
        self.produced = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="demo-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def join(self) -> None:
        self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _produce(self) -> None:
        batch_size = 50
        queues = [(topic, queue_id) for topic, count in DEMO_TOPICS for queue_id in range(count)]
        started = time.monotonic()
        while self.produced < self.total and not self._stop.is_set():
            requests: list[PutRequest] = []
            for _ in range(min(batch_size, self.total - self.produced)):
                n = self.produced + len(requests)
                topic, queue_id = queues[n % len(queues)]
                body = json.dumps(
                    {
                        "order": n,
                        "customer": f"customer-{n % 977}",
                        "amount": (n * 37) % 10_000 / 100,
                        "note": "x" * 600,
                    }
                ).encode()
                requests.append(
                    PutRequest(topic, queue_id, body, keys=(f"order-{n}",), tags=DEMO_TAGS[n % len(DEMO_TAGS)])
                )
            try:
                self.hot.put_messages(requests)
            except (errors.StoreFullError, errors.ValidationError) as error:
                self.error = str(error)
                return
            self.produced += len(requests)
            ahead = self.produced / self.rate - (time.monotonic() - started)
            if ahead > 0:
                self._stop.wait(ahead)


@dataclass
class _Rates:
    at: float
    messages: int
    bytes: int


class ProgressView:
    """Messages/s, bytes/s and the most lagging queues: a live panel on a terminal, else a line every few seconds."""

    def __init__(self, console: Console, dispatcher: Dispatcher, producer: DemoProducer | None) -> None:
        self.console = console
        self.dispatcher = dispatcher
        self.producer = producer
        self._last = _Rates(time.monotonic(), 0, 0)
        self._rates = (0.0, 0.0)

    def _sample(self) -> tuple[float, float]:
        stats = self.dispatcher.stats
        now = time.monotonic()
        elapsed = now - self._last.at
        if elapsed >= 0.5:
            self._rates = (
                (stats.messages - self._last.messages) / elapsed,
                (stats.bytes - self._last.bytes) / elapsed,
            )
            self._last = _Rates(now, stats.messages, stats.bytes)
        return self._rates

    def headline(self) -> str:
        stats = self.dispatcher.stats
        per_second, bytes_per_second = self._sample()
        queues = self.dispatcher.status()
        lag = sum(q.lag for q in queues)
        failing = sum(1 for q in queues if q.last_error)
        parts = [
            f"archived {stats.messages:,} msgs ({stats.bytes / MB:,.1f} MB)",
            f"{per_second:,.0f} msg/s",
            f"{bytes_per_second / MB:,.2f} MB/s",
            f"lag {lag:,} over {len(queues)} queues",
        ]
        if self.producer is not None:
            parts.insert(0, f"produced {self.producer.produced:,}")
        if failing:
            parts.append(f"{failing} queues retrying")
        if stats.lost_messages:
            parts.append(f"{stats.lost_messages:,} lost before archiving")
        return " · ".join(parts)

    def panel(self) -> Group:
        table = Table(box=None, pad_edge=False)
        for column in ("topic", "queue", "archived", "hot max", "lag", "state"):
            table.add_column(column, justify="right" if column in ("queue", "archived", "hot max", "lag") else "left")
        for queue in _most_lagging(self.dispatcher.status()):
            table.add_row(
                queue.topic,
                str(queue.queue_id),
                f"{queue.archived_offset:,}",
                f"{queue.hot_max_offset:,}",
                f"{queue.lag:,}",
                "retrying: " + queue.last_error if queue.last_error else "ok",
            )
        return Group(Text(self.headline()), table)

    def plain_line(self) -> str:
        lagging = [q for q in _most_lagging(self.dispatcher.status(), 3) if q.lag]
        worst = ", ".join(f"{q.topic}/{q.queue_id}={q.lag:,}" for q in lagging)
        return self.headline() + (f" · most behind: {worst}" if worst else "")

    async def show(self, stop: asyncio.Event) -> None:
        if self.console.is_terminal:
            with Live(self.panel(), console=self.console, refresh_per_second=2, transient=False) as live:
                while not stop.is_set():
                    await _wait(stop, 0.5)
                    live.update(self.panel())
            return
        while not stop.is_set():
            await _wait(stop, PLAIN_PROGRESS_INTERVAL)
            if not stop.is_set():
                self.console.print(self.plain_line(), markup=False, highlight=False)


def _most_lagging(queues: list[QueueStatus], limit: int = 8) -> list[QueueStatus]:
    return sorted(queues, key=lambda q: (-q.lag, q.topic, q.queue_id))[:limit]


async def _wait(event: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout=seconds)
    except TimeoutError:
        pass


def _summary(stats: DispatchStats, queues: list[QueueStatus], produced: int | None) -> dict[str, Any]:
    seconds = max(stats.seconds, 1e-9)
    summary: dict[str, Any] = {
        "messages": stats.messages,
        "bytes": stats.bytes,
        "seconds": round(stats.seconds, 3),
        "messages_per_second": round(stats.messages / seconds, 1),
        "mb_per_second": round(stats.bytes / MB / seconds, 3),
        "commits": stats.commits,
        "commit_failures": stats.commit_failures,
        "lost_messages": stats.lost_messages,
        "queues_lost": stats.queues_lost,
        "queues": len(queues),
        "lag": sum(q.lag for q in queues),
    }
    if produced is not None:
        summary["demo_messages_produced"] = produced
    return summary


@dataclass(frozen=True)
class RunOptions:
    demo: bool | None
    once: bool
    duration: float | None
    demo_messages: int
    demo_rate: float
    hot_mode: HotMode = "auto"


def _uses_leases(config: TieredStoreConfig) -> bool:
    leases = config.archiver.leases
    if leases is None:
        leases = parse_url(config.effective_metadata_url).get_backend_name() == "postgresql"
    if leases and url_scheme(config.effective_cold_url) == "s3" and config.s3.conditional_writes == "unsupported":
        # A lease is only safe because storage refuses a fenced archiver's late writes.
        raise errors.ConfigError(
            f"queue leases need conditional writes, and {UNSUPPORTED_SETTING} says the storage has none: "
            "run a single archiver with [archiver] leases = false"
        )
    return leases


# How often a follower started before its writer looks for the hot store again.
HOT_STORE_POLL = 1.0


async def _hot_store_exists(cli: CliState, config: TieredStoreConfig, options: RunOptions) -> bool:
    """A follower started before its writer (a deployment starting all at once) waits for the hot store.

    False when SIGTERM/SIGINT or ``--duration`` ends the wait first. ``--once`` does not wait: with no
    hot store there is nothing to archive now, and it says so as an error.
    """
    hot_dir = config.hot_dir
    refuse_non_directory(hot_dir)  # a regular file never becomes a hot store: waiting for it would be forever
    if options.hot_mode != "follower" or options.once or hot_dir.is_dir():
        return True
    cli.output.note(f"waiting for the hot store {hot_dir}: its writer has not created it yet")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    deadline = None if options.duration is None else time.monotonic() + options.duration
    try:
        while not hot_dir.is_dir():
            timeout = HOT_STORE_POLL if deadline is None else min(HOT_STORE_POLL, deadline - time.monotonic())
            if stop.is_set() or timeout <= 0:
                cli.output.note("stopped before the hot store appeared; nothing was archived")
                return False
            try:
                await asyncio.wait_for(stop.wait(), timeout=timeout)
            except TimeoutError:
                continue
        cli.output.note(f"the hot store {hot_dir} appeared")
        return True
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def _archive(cli: CliState, config: TieredStoreConfig, options: RunOptions) -> dict[str, Any]:
    if not await _hot_store_exists(cli, config, options):
        return _summary(DispatchStats(), [], None)
    # Before anything is opened: a second archiver on one SQLite database must not touch it at all.
    single = SingleArchiverLock.for_url(config.effective_metadata_url)
    if single is None:
        return await _archive_opened(cli, config, options)
    with single:
        return await _archive_opened(cli, config, options)


async def _archive_opened(cli: CliState, config: TieredStoreConfig, options: RunOptions) -> dict[str, Any]:
    note = cli.output.note
    settings: ArchiverSettings = config.archiver
    metrics = Metrics()
    async with open_runtime(
        config, recover=False, metrics=metrics, hot_mode=options.hot_mode, shared_index=_uses_leases(config)
    ) as runtime:
        assert runtime.hot is not None
        hot = runtime.hot
        following = isinstance(hot, HotStoreFollower)
        if following:
            note(
                f"following {config.hot_dir} read-only: another process holds its writer lock "
                "(it puts messages and deletes archived hot files)"
            )
            if options.demo:
                raise errors.ConfigError("--demo needs to own the hot store; another process is its writer")
        empty = not hot.queues()
        run_demo = options.demo is True or (options.demo is None and empty and not options.once and not following)
        if run_demo and options.demo is None:
            note(
                f"The hot store in {config.hot_dir} is empty: starting a demo workload of "
                f"{options.demo_messages:,} messages so you can see them flow (--no-demo turns this off)."
            )
        if run_demo and settings.group_commit_timeout > DEMO_TIMEOUT:
            settings = settings.model_copy(
                update={"group_commit_timeout": DEMO_TIMEOUT, "scan_interval": min(settings.scan_interval, 0.5)}
            )
            note(f"demo: group_commit_timeout lowered to {DEMO_TIMEOUT:g}s so batches commit while you watch")
        if settings.metrics_port is not None:
            port = metrics.serve(settings.metrics_port, addr=settings.metrics_addr)
            note(f"metrics: http://{settings.metrics_addr}:{port}/metrics")
        leases: LeaseManager | None = None
        if _uses_leases(config):
            leases = LeaseManager(
                runtime.metadata,
                owner=settings.owner_id,
                lease_duration=settings.lease_duration,
                renew_interval=settings.lease_renew_interval,
                topics=TopicFilter.of(settings, cluster=config.cluster, broker=config.broker).archives,
            )
            note(
                f"leasing queues as {leases.owner} (lease {settings.lease_duration:g}s); "
                f"key index namespace {runtime.index.namespace}"
            )
        table_sync = _table_sync(config, metrics, leases) if config.table.enabled and not options.once else None
        dispatcher = Dispatcher.from_runtime(runtime, settings=settings, leases=leases)
        await dispatcher.start()
        note(f"archiving {config.hot_dir} to {runtime.provider.url} (metadata: {runtime.metadata.url})")
        if table_sync is not None:
            table_sync.start()
            note(f"syncing every topic's Iceberg table every {config.table.commit_interval:g}s")

        producer = (
            DemoProducer(hot_writer(hot, "--demo puts"), options.demo_messages, options.demo_rate) if run_demo else None
        )
        if producer is not None:
            producer.start()
        try:
            if options.once:
                return await _run_once(cli, dispatcher, producer)
            return await _run_until_stopped(cli, dispatcher, producer, options, settings)
        finally:
            if producer is not None:
                producer.stop()
            if table_sync is not None:
                # A sync in progress finishes its commit (or is abandoned at exit: its files are orphans the
                # next sync removes); the archiver does not wait for it past the shutdown timeout.
                await asyncio.to_thread(table_sync.stop, settings.shutdown_timeout)


def _table_sync(config: TieredStoreConfig, metrics: Metrics, leases: LeaseManager | None) -> BackgroundTableSync:
    """The background table sync of ``[table] enabled``; imported here, so that only it needs pyiceberg."""
    from tieredstore.table.catalog import require_pyiceberg

    require_pyiceberg()  # MissingExtraError naming the extra, before pyarrow or pyiceberg is imported
    from tieredstore.table.background import BackgroundTableSync

    return BackgroundTableSync(config, metrics, leases)


async def _run_once(cli: CliState, dispatcher: Dispatcher, producer: DemoProducer | None) -> dict[str, Any]:
    if producer is not None:
        await asyncio.to_thread(producer.join)
    result = await dispatcher.run_once()
    if dispatcher.leases is not None:
        await dispatcher.shutdown()  # hands the leases back at once instead of letting them expire
    summary = _summary(result.stats, dispatcher.status(), producer.produced if producer else None)
    if result.failed:
        summary["failed_queues"] = {f"{t}/{q}": error for (t, q), error in sorted(result.failed.items())}
    return summary


async def _run_until_stopped(
    cli: CliState,
    dispatcher: Dispatcher,
    producer: DemoProducer | None,
    options: RunOptions,
    settings: ArchiverSettings,
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    archiving = asyncio.current_task()
    signals_seen: list[int] = []

    def on_signal(signum: int) -> None:
        signals_seen.append(signum)
        if len(signals_seen) == 1:
            cli.output.note(
                f"{signal.Signals(signum).name}: stopping; finishing in-flight commits "
                f"(up to {settings.shutdown_timeout:g}s, signal again to abandon them)"
            )
            stop.set()
        elif archiving is not None:
            archiving.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    if options.duration is not None:
        loop.call_later(options.duration, stop.set)
    progress = ProgressView(cli.output.err, dispatcher, producer)
    display = asyncio.create_task(progress.show(stop))
    try:
        stats = await dispatcher.run(stop)
    finally:
        stop.set()
        await display
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    if producer is not None and producer.error:
        cli.output.note(f"demo producer stopped: {producer.error}")
    return _summary(stats, dispatcher.status(), producer.produced if producer else None)


@app.command("run")
def run(
    ctx: typer.Context,
    demo: Annotated[
        bool | None,
        typer.Option(
            "--demo/--no-demo",
            help="Produce a sample workload while archiving. Default: only when the hot store is empty.",
        ),
    ] = None,
    once: Annotated[bool, typer.Option(help="Archive everything the hot store holds now, then exit.")] = False,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port (0 picks a free one).", min=0, max=65535)
    ] = None,
    metrics_addr: Annotated[
        str | None, typer.Option(help="Address the metrics server binds to (0.0.0.0 in a container).")
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="Stop by itself after this many seconds (as if sent SIGTERM).", min=0)
    ] = None,
    demo_messages: Annotated[int, typer.Option(help="How many messages the demo workload puts.", min=1)] = 20_000,
    demo_rate: Annotated[float, typer.Option(help="Demo messages per second.", min=1)] = 2_000.0,
    hot_mode: Annotated[
        HotMode,
        typer.Option(
            help="auto: own the hot store if its writer lock is free, else follow it; writer: own it or fail; "
            "follower: only read it (a producer process owns it; waits until that process has created it).",
        ),
    ] = "auto",
    owner_id: Annotated[
        str | None,
        typer.Option(help="This archiver's name in queue leases (default: <hostname>-<pid>-<random>)."),
    ] = None,
) -> None:
    """Archive the hot store to cold storage until stopped (SIGTERM/SIGINT), showing progress on stderr.

    Every [archiver] maintain_interval seconds it also applies hot and cold retention (--once does not).
    Examples: tieredstore run --demo · tieredstore run --once · tieredstore run --metrics-port 9100
    """
    cli = state(ctx)
    config = cli.config
    overrides = {
        k: v
        for k, v in (("metrics_port", metrics_port), ("metrics_addr", metrics_addr), ("owner_id", owner_id))
        if v is not None
    }
    if overrides:
        config = config.model_copy(update={"archiver": config.archiver.model_copy(update=overrides)})
    options = RunOptions(demo, once, duration, demo_messages, demo_rate, hot_mode)
    # This command owns its process: before the event loop and its worker threads exist (arenas made earlier stay).
    tuned = tune_for_archiver()
    if tuned:
        log.info("allocator tuned for batches", **{name.strip("_").lower(): value for name, value in tuned.items()})
    try:
        summary = asyncio.run(_archive(cli, config, options))
    except asyncio.CancelledError:
        cli.output.note("in-flight commits abandoned; the next start recovers them")
        raise typer.Exit(130) from None
    cli.output.record("archiver summary", summary)
    failed = summary.get("failed_queues")
    if failed:
        raise errors.StorageUnavailableError(f"{len(failed)} queues could not be archived: " + ", ".join(failed))
