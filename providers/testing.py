"""The provider conformance suite and a fault-injecting wrapper, importable by third-party providers.

Subclass ``ProviderTests`` in a test module and give it a ``make_provider`` fixture that returns a
callable opening a provider on one fresh, empty root (the same root on every call, so the suite can
"restart" by opening a second instance)::

    class TestMyProvider(ProviderTests):
        @pytest.fixture
        def make_provider(self, tmp_path):
            return lambda: MyProvider(f"my://{tmp_path}")

Capabilities are class attributes. A provider that does not claim one sets it to False and the
tests needing it are not collected (rather than skipped): ``supports_truncate``, ``lists_objects``
(``list_objects`` gives every stored object with its size and last-modified time, ``ListsObjects``),
``supports_conditional_create`` (a commit never overwrites committed bytes: a second writer with
other bytes is refused with CommitConflictError), ``confines_paths`` (bad logical paths raise
PathEscapeError). The suite needs pytest and pytest-asyncio (``asyncio_mode = "auto"``).

``FaultyProvider`` wraps any provider and, following a shared ``FaultPlan``, makes commits fail
before or after their bytes land, delays them, or makes the real size unknowable (an outage).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import pytest

from tieredstore.basics import MIB, now_ms
from tieredstore.errors import (
    CommitConflictError,
    PathEscapeError,
    SizeUnknownError,
    StorageUnavailableError,
)
from tieredstore.formats.naming import FileType, queue_path
from tieredstore.providers.base import AppendResult, DeletesObjects, FileSegment, ListsObjects, Provider, StoredObject
from tieredstore.providers.wrapper import WrappedProvider, WrappedSegment

F = TypeVar("F", bound=Callable[..., Any])
ProviderFactory = Callable[[], Provider]

COMMIT_LOG = FileType.COMMIT_LOG
CONSUME_QUEUE = FileType.CONSUME_QUEUE
QUEUE = queue_path("DefaultCluster", "broker-a", "TopicTest", 0)
UNICODE_QUEUE = queue_path("集群-ñ", "brøker-ü", "тема_主题", 3)
CLOCK_SLACK_MS = 5_000
ESCAPING_PATHS = [
    "../outside",
    "queue/../../outside",
    "/etc/passwd",
    "a//b",
    "a/./b",
    "a/b/",
    "",
    "a/\x00/b",
    "a\\..\\b",
]


# ---- fault injection -------------------------------------------------------------------------------


@dataclass
class FaultPlan:
    """What the next calls through a FaultyProvider should suffer; counters record what happened."""

    fail_before_landing: int = 0
    fail_after_landing: int = 0
    size_unknown: bool = False
    commit_delay: float = 0.0
    commits_in_flight: int = 0
    max_commits_in_flight: int = 0
    commit_calls: int = 0


class FaultySegment(WrappedSegment):
    """A segment that runs another segment's storage core, with the faults its plan asks for."""

    def __init__(self, inner: FileSegment, plan: FaultPlan) -> None:
        super().__init__(inner)
        self.plan = plan

    async def _real_size(self) -> int:
        if self.plan.size_unknown:
            raise SizeUnknownError(f"{self.key}: injected outage, size unknown")
        return await self.inner._real_size()

    async def _commit(self, position: int, data: bytes | bytearray) -> None:
        plan = self.plan
        plan.commit_calls += 1
        plan.commits_in_flight += 1
        plan.max_commits_in_flight = max(plan.max_commits_in_flight, plan.commits_in_flight)
        try:
            if plan.commit_delay:
                await asyncio.sleep(plan.commit_delay)
            if plan.fail_before_landing > 0:
                plan.fail_before_landing -= 1
                raise StorageUnavailableError(f"{self.key}: injected failure before the bytes landed")
            await self.inner._commit(position, data)
            if plan.fail_after_landing > 0:
                plan.fail_after_landing -= 1
                raise StorageUnavailableError(f"{self.key}: injected lost reply after the bytes landed")
        finally:
            plan.commits_in_flight -= 1


class FaultyProvider(WrappedProvider):
    """Wraps a provider so every segment it makes follows one shared FaultPlan."""

    scheme: ClassVar[str] = "faulty"

    def __init__(self, inner: Provider, plan: FaultPlan | None = None) -> None:
        super().__init__(inner)
        self.plan = plan if plan is not None else FaultPlan()

    def wrap(self, segment: FileSegment) -> FaultySegment:
        return FaultySegment(segment, self.plan)


# ---- the conformance suite -------------------------------------------------------------------------


def requires(capability: str) -> Callable[[F], F]:
    """Mark a test as needing a capability; subclasses that lack it do not collect the test."""

    def mark(test: F) -> F:
        test._requires_capability = capability  # type: ignore[attr-defined]
        return test

    return mark


def payload(size: int, seed: int) -> bytes:
    """Deterministic bytes that differ at every position from other seeds (so misplaced bytes show)."""
    return random.Random(seed).randbytes(size)


async def committed(segment: FileSegment, *parts: bytes) -> FileSegment:
    """Append and commit each part in turn (one commit, hence one chunk, per part)."""
    for part in parts:
        assert segment.append(part) is AppendResult.SUCCESS
        await segment.commit()
    return segment


class ProviderTests:
    """Behaviour every provider must show. Subclasses supply the ``make_provider`` fixture."""

    supports_truncate: ClassVar[bool] = True
    lists_objects: ClassVar[bool] = True
    supports_conditional_create: ClassVar[bool] = True
    confines_paths: ClassVar[bool] = True
    # False for a provider whose codecs frame what it stores (compressed, encrypted): stored sizes differ.
    stores_bytes_as_given: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            capability = getattr(getattr(cls, name, None), "_requires_capability", None)
            if name.startswith("test_") and capability is not None and not getattr(cls, capability):
                setattr(cls, name, None)

    @pytest.fixture
    def make_provider(self) -> ProviderFactory:
        raise NotImplementedError("a ProviderTests subclass must define the make_provider fixture")

    @pytest.fixture
    async def open_provider(self, make_provider: ProviderFactory) -> AsyncIterator[ProviderFactory]:
        """Opens providers on the test's root and closes them all when the test ends."""
        opened: list[Provider] = []

        def open_one() -> Provider:
            provider = make_provider()
            opened.append(provider)
            return provider

        yield open_one
        for provider in opened:
            await provider.close()

    @pytest.fixture
    def provider(self, open_provider: ProviderFactory) -> Provider:
        return open_provider()

    # ---- life cycle ------------------------------------------------------------------------------

    async def test_create_exists_destroy(self, provider: Provider) -> None:
        segment = provider.segment(COMMIT_LOG, QUEUE, 0)
        assert not await segment.exists()
        await segment.create()
        assert await segment.exists()
        assert await segment.real_size() == 0
        await committed(segment, b"kept")
        await provider.segment(COMMIT_LOG, QUEUE, 0).create()  # creating again must not clobber
        assert await segment.real_size() == 4
        await segment.destroy()
        assert not await segment.exists()
        assert await segment.real_size() == 0
        assert segment.append(b"x") is AppendResult.FILE_CLOSED

    async def test_destroy_of_missing_segment_is_not_an_error(self, provider: Provider) -> None:
        segment = provider.segment(CONSUME_QUEUE, QUEUE, 12345)
        await segment.destroy()
        assert not await segment.exists()

    # ---- appends, commits, reads -----------------------------------------------------------------

    async def test_append_commit_read_round_trip(self, provider: Provider) -> None:
        segment = provider.segment(COMMIT_LOG, QUEUE, 0)
        first, second = payload(100, 1), payload(57, 2)
        assert segment.append(first, timestamp=10) is AppendResult.SUCCESS
        assert segment.append(second, timestamp=5) is AppendResult.SUCCESS
        assert (segment.commit_position, segment.append_position) == (0, 157)
        assert await segment.read(0, 157) == b""  # nothing is readable before it is committed
        await segment.commit()
        assert (segment.commit_position, segment.pending_bytes) == (157, 0)
        assert (segment.min_timestamp, segment.max_timestamp) == (5, 10)
        assert await segment.read(0, 157) == first + second
        assert await segment.read(100, 57) == second
        assert await segment.real_size() == 157

    async def test_reads_spanning_commit_chunks(self, open_provider: ProviderFactory) -> None:
        parts = [payload(5, 1), payload(9, 2), payload(1, 3), payload(12, 4)]
        model = b"".join(parts)
        writer = await committed(open_provider().segment(COMMIT_LOG, QUEUE, 0), *parts)
        reader = open_provider().segment(COMMIT_LOG, QUEUE, 0, commit_position=len(model))
        for segment in (writer, reader):
            for start in range(0, len(model), 2):
                for length in (1, 6, 11, len(model)):
                    expected = model[start : start + length]
                    assert await segment.read(start, length) == expected, (start, length)

    async def test_reading_on_from_where_the_last_read_ended_gives_every_byte_once(
        self, open_provider: ProviderFactory
    ) -> None:
        parts = [payload(5, 1), payload(9, 2), payload(1, 3), payload(12, 4)]
        model = b"".join(parts)
        writer = await committed(open_provider().segment(COMMIT_LOG, QUEUE, 0), *parts)
        reader = open_provider().segment(COMMIT_LOG, QUEUE, 0, commit_position=len(model))
        for segment in (writer, reader):
            for start in range(len(model)):
                for most in (1, 4, 11, 100):
                    piece = await segment.read_from(start, most)
                    # at least one byte while any is left, never more than asked, always the right bytes
                    assert 1 <= len(piece) <= most and piece == model[start : start + len(piece)], (start, most)
            for most in (3, 10, 100):
                position, pieces = 0, []
                while piece := await segment.read_from(position, most):
                    pieces.append(piece)
                    position += len(piece)
                assert b"".join(pieces) == model
        assert await reader.read_from(len(model), 10) == b""
        assert await reader.read_from(3, 0) == b""
        pending = await committed(open_provider().segment(COMMIT_LOG, "other", 0), b"committed")
        assert pending.append(b"buffered") is AppendResult.SUCCESS
        assert await pending.read_from(0, 100) == b"committed"  # trimmed at the commit position

    async def test_reads_past_the_commit_position_are_trimmed(self, provider: Provider) -> None:
        data = payload(10, 7)
        segment = await committed(provider.segment(COMMIT_LOG, QUEUE, 0), data)
        assert segment.append(b"pending") is AppendResult.SUCCESS
        assert await segment.read(5, 100) == data[5:]
        assert await segment.read(10, 5) == b""
        assert await segment.read(50, 5) == b""
        assert await segment.read(0, 0) == b""
        stale = provider.segment(COMMIT_LOG, QUEUE, 0, commit_position=4)
        assert await stale.read(0, 10) == data[:4]  # a handle sees only what it knows is committed

    async def test_file_full_at_max_size(self, provider: Provider) -> None:
        segment = provider.segment(CONSUME_QUEUE, QUEUE, 0, max_size=10)
        assert segment.append(b"123456") is AppendResult.SUCCESS
        assert segment.append(b"78901") is AppendResult.FILE_FULL
        assert segment.append(b"7890") is AppendResult.SUCCESS
        assert segment.is_full
        assert segment.append(b"x") is AppendResult.FILE_FULL
        await segment.commit()
        assert await segment.read(0, 10) == b"1234567890"
        oversized = provider.segment(CONSUME_QUEUE, QUEUE, 100, max_size=10)
        assert oversized.append(b"x" * 25) is AppendResult.SUCCESS  # an empty file admits one append
        assert oversized.append(b"y") is AppendResult.FILE_FULL

    async def test_buffer_full_until_committed(self, provider: Provider) -> None:
        segment = provider.segment(COMMIT_LOG, QUEUE, 0)
        segment.max_pending_buffers = 3
        assert [segment.append(b"ab") for _ in range(3)] == [AppendResult.SUCCESS] * 3
        assert segment.append(b"cd") is AppendResult.BUFFER_FULL
        await segment.commit()
        assert segment.append(b"cd") is AppendResult.SUCCESS
        await segment.commit()
        assert await segment.read(0, 8) == b"abababcd"

    async def test_closed_file_refuses_appends_but_commits_its_buffer(self, provider: Provider) -> None:
        segment = provider.segment(COMMIT_LOG, QUEUE, 0)
        assert segment.append(b"last words") is AppendResult.SUCCESS
        segment.close()
        assert segment.append(b"more") is AppendResult.FILE_CLOSED
        await segment.commit()
        assert await segment.read(0, 100) == b"last words"

    async def test_concurrent_commits_run_one_at_a_time(self, provider: Provider) -> None:
        faulty = FaultyProvider(provider, FaultPlan(commit_delay=0.02))
        segment = faulty.segment(COMMIT_LOG, QUEUE, 0)
        parts = [payload(50 + i, i) for i in range(6)]

        async def append_and_commit(part: bytes) -> None:
            assert segment.append(part) is AppendResult.SUCCESS
            await segment.commit()

        await asyncio.gather(*(append_and_commit(part) for part in parts))
        assert faulty.plan.max_commits_in_flight == 1
        assert faulty.plan.commit_calls >= 2
        total = sum(len(part) for part in parts)
        assert await segment.read(0, total) == b"".join(parts)
        assert await segment.real_size() == total

    # ---- failures and their correction -----------------------------------------------------------

    async def test_commit_failing_after_bytes_landed_is_not_written_twice(self, provider: Provider) -> None:
        faulty = FaultyProvider(provider, FaultPlan(fail_after_landing=1))
        segment = faulty.segment(COMMIT_LOG, QUEUE, 0)
        first, second = payload(40, 1), payload(30, 2)
        segment.append(first)
        with pytest.raises(StorageUnavailableError):
            await segment.commit()
        assert (segment.commit_position, segment.pending_bytes) == (40, 0)
        segment.append(second)
        await segment.commit()
        assert await segment.real_size() == 70
        assert await segment.read(0, 70) == first + second

    async def test_lost_reply_during_outage_is_resolved_by_the_provider(self, provider: Provider) -> None:
        faulty = FaultyProvider(provider, FaultPlan(fail_after_landing=1, size_unknown=True))
        segment = faulty.segment(COMMIT_LOG, QUEUE, 0)
        first, second = payload(40, 1), payload(30, 2)
        segment.append(first)
        with pytest.raises(StorageUnavailableError):
            await segment.commit()
        # The size could not be read, so the landed bytes are still buffered...
        assert (segment.commit_position, segment.pending_bytes) == (0, 40)
        faulty.plan.size_unknown = False
        segment.append(second)
        await segment.commit()
        # ...and committing them again together with new bytes must not duplicate them.
        assert segment.commit_position == 70
        assert await segment.real_size() == 70
        fresh = provider.segment(COMMIT_LOG, QUEUE, 0, commit_position=70)
        assert await fresh.read(0, 70) == first + second

    async def test_commit_failing_before_bytes_landed_is_retried_from_buffer(self, provider: Provider) -> None:
        faulty = FaultyProvider(provider, FaultPlan(fail_before_landing=2))
        segment = faulty.segment(COMMIT_LOG, QUEUE, 0)
        data = payload(64, 3)
        segment.append(data)
        for _ in range(2):
            with pytest.raises(StorageUnavailableError):
                await segment.commit()
            assert (segment.commit_position, segment.pending_bytes) == (0, 64)
            assert await segment.real_size() == 0
        await segment.commit()
        assert await segment.read(0, 64) == data
        assert await segment.real_size() == 64

    async def test_size_unknown_during_outage_is_not_zero(self, provider: Provider) -> None:
        missing = provider.segment(COMMIT_LOG, QUEUE, 999)
        assert await missing.real_size() == 0
        faulty = FaultyProvider(provider, FaultPlan())
        segment = await committed(faulty.segment(COMMIT_LOG, QUEUE, 0), b"durable")
        faulty.plan.size_unknown = True
        with pytest.raises(SizeUnknownError):
            await segment.real_size()
        with pytest.raises(SizeUnknownError):
            await segment.correct_commit_position()
        assert segment.commit_position == 7
        faulty.plan.size_unknown = False
        assert await segment.correct_commit_position() == 7

    # ---- second writers --------------------------------------------------------------------------

    @requires("supports_conditional_create")
    async def test_other_bytes_at_the_commit_position_are_a_conflict(self, open_provider: ProviderFactory) -> None:
        winner = await committed(open_provider().segment(COMMIT_LOG, QUEUE, 0), b"first writer")
        zombie = open_provider().segment(COMMIT_LOG, QUEUE, 0)
        zombie.append(b"zombie bytes")
        with pytest.raises(CommitConflictError):
            await zombie.commit()
        assert (zombie.commit_position, zombie.pending_bytes) == (0, 12)
        with pytest.raises(CommitConflictError):
            await zombie.correct_commit_position()
        assert await winner.read(0, 12) == b"first writer"
        assert await winner.real_size() == 12

    @requires("supports_conditional_create")
    async def test_recommitting_the_same_bytes_succeeds_without_duplicates(
        self, open_provider: ProviderFactory
    ) -> None:
        await committed(open_provider().segment(COMMIT_LOG, QUEUE, 0), b"abc")
        same = open_provider().segment(COMMIT_LOG, QUEUE, 0)
        await committed(same, b"abc")
        assert same.commit_position == 3
        longer = open_provider().segment(COMMIT_LOG, QUEUE, 0)
        await committed(longer, b"abcdef")
        assert longer.commit_position == 6
        reader = open_provider().segment(COMMIT_LOG, QUEUE, 0)
        assert await reader.correct_commit_position() == 6
        assert await reader.read(0, 100) == b"abcdef"

    @requires("supports_conditional_create")
    async def test_the_conditional_write_check_passes_once_and_leaves_nothing(self, provider: Provider) -> None:
        await provider.check_conditional_writes()
        assert await provider.check_conditional_writes() is False  # checked once per provider
        assert await provider.list_children("") == []
        segment = await committed(provider.segment(COMMIT_LOG, QUEUE, 0), b"written after the check")
        assert await segment.read(0, 100) == b"written after the check"

    # ---- paths, names and listing ----------------------------------------------------------------

    @requires("confines_paths")
    @pytest.mark.parametrize("path", ESCAPING_PATHS)
    async def test_paths_that_escape_or_alias_are_rejected(self, provider: Provider, path: str) -> None:
        with pytest.raises(PathEscapeError):
            provider.segment(COMMIT_LOG, path, 0)
        with pytest.raises(PathEscapeError):
            await provider.list_segments(path, COMMIT_LOG)
        if path:
            with pytest.raises(PathEscapeError):
                await provider.list_children(path)
        assert await provider.list_children("") == []

    async def test_unicode_names_in_paths(self, provider: Provider) -> None:
        data = "ünïcödé 消息".encode()
        segment = await committed(provider.segment(CONSUME_QUEUE, UNICODE_QUEUE, 20), data)
        assert await segment.read(0, len(data)) == data
        assert await provider.list_segments(UNICODE_QUEUE, CONSUME_QUEUE) == [20]
        cluster, broker, topic, queue_id = UNICODE_QUEUE.split("/")
        assert await provider.list_children("") == [cluster]
        assert await provider.list_children(f"{cluster}/{broker}") == [topic]
        assert await provider.list_children(f"{cluster}/{broker}/{topic}") == [queue_id]

    async def test_list_segments_and_children(self, provider: Provider) -> None:
        offsets = [4294937144, 0, 1000]
        for offset in offsets:
            await committed(provider.segment(COMMIT_LOG, QUEUE, offset), b"m" * 3)
        await provider.segment(CONSUME_QUEUE, QUEUE, 0).create()
        assert await provider.list_segments(QUEUE, COMMIT_LOG) == sorted(offsets)
        assert await provider.list_segments(QUEUE, CONSUME_QUEUE) == [0]
        assert await provider.list_segments(QUEUE, FileType.INDEX) == []
        assert await provider.list_children(QUEUE) == ["COMMIT_LOG", "CONSUME_QUEUE"]
        assert await provider.list_children(QUEUE.rsplit("/", 1)[0]) == ["0"]
        assert await provider.list_children(QUEUE.split("/", 1)[0]) == ["broker-a"]
        assert await provider.list_children("no-such/folder") == []
        assert await provider.list_segments("no-such/folder", COMMIT_LOG) == []
        await provider.segment(COMMIT_LOG, QUEUE, 1000).destroy()
        assert await provider.list_segments(QUEUE, COMMIT_LOG) == [0, 4294937144]

    @requires("lists_objects")
    async def test_delete_objects_removes_listed_objects_and_nothing_else(self, provider: Provider) -> None:
        assert isinstance(provider, ListsObjects) and isinstance(provider, DeletesObjects)
        records = await committed(provider.segment(COMMIT_LOG, QUEUE, 0), b"abc")
        units = await committed(provider.segment(CONSUME_QUEUE, QUEUE, 40), b"u" * 20)
        kept = await provider.list_objects(units.key)
        doomed = [stored.key for stored in await provider.list_objects(records.key)]
        assert doomed and kept
        await provider.delete_objects([*doomed, f"{QUEUE}/no-such-object"])  # a missing key is no error
        assert await provider.list_objects(records.key) == []
        assert await provider.list_objects(units.key) == kept

    async def test_list_objects_gives_each_segments_bytes_and_last_write(self, provider: Provider) -> None:
        assert isinstance(provider, ListsObjects)
        # Storage stamps writes with its own clock, to the second on S3: allow for both.
        before = now_ms() - CLOCK_SLACK_MS
        records = await committed(provider.segment(COMMIT_LOG, QUEUE, 0), b"abc", b"defg")
        units = await committed(provider.segment(CONSUME_QUEUE, QUEUE, 40), b"u" * 20)
        after = now_ms() + CLOCK_SLACK_MS

        def bytes_of(objects: list[StoredObject], key: str) -> int:
            return sum(o.size for o in objects if o.key == key or o.key.startswith(f"{key}/"))

        everything = await provider.list_objects("")
        assert [o.key for o in everything] == sorted(o.key for o in everything)
        if self.stores_bytes_as_given:
            assert (bytes_of(everything, records.key), bytes_of(everything, units.key)) == (7, 20)
            assert sum(o.size for o in everything) == 27  # nothing else holds bytes
        else:  # framed: each segment's frames and its descriptor, and nothing outside the two segments
            assert {f"{records.key}/.codec", f"{units.key}/.codec"} <= {o.key for o in everything}
            assert bytes_of(everything, records.key) + bytes_of(everything, units.key) == sum(
                o.size for o in everything
            )
        assert all(before <= o.last_modified <= after for o in everything), (before, everything, after)
        one = await provider.list_objects(records.key)
        units_stored = bytes_of(everything, units.key)
        assert one and bytes_of(one, records.key) == bytes_of(everything, records.key) and len(one) < len(everything)
        assert await provider.list_objects(QUEUE) == everything
        assert await provider.list_objects("no-such/folder") == []
        await records.destroy()
        assert await provider.list_objects(records.key) == []
        assert bytes_of(await provider.list_objects(""), units.key) == (
            20 if self.stores_bytes_as_given else units_stored
        )

    # ---- truncation, restart, size ---------------------------------------------------------------

    @requires("supports_truncate")
    async def test_truncate(self, open_provider: ProviderFactory) -> None:
        segment = await committed(open_provider().segment(COMMIT_LOG, QUEUE, 0), b"aaaa", b"bbbb", b"cccc")
        await segment.truncate(100)
        assert await segment.real_size() == 12
        await segment.truncate(6)  # inside the second chunk
        assert (segment.commit_position, await segment.real_size()) == (6, 6)
        assert await segment.read(0, 100) == b"aaaabb"
        await committed(segment, b"xyz")
        assert await segment.read(0, 100) == b"aaaabbxyz"
        await segment.truncate(4)  # on a chunk boundary
        assert await segment.real_size() == 4
        restarted = open_provider().segment(COMMIT_LOG, QUEUE, 0)
        assert await restarted.correct_commit_position() == 4
        assert await restarted.read(0, 100) == b"aaaa"
        await segment.truncate(0)
        assert await segment.real_size() == 0

    async def test_restart_sees_committed_data(self, open_provider: ProviderFactory) -> None:
        first, second = payload(1000, 1), payload(500, 2)
        await committed(open_provider().segment(COMMIT_LOG, QUEUE, 0), first)
        after_restart = open_provider()
        size = await after_restart.segment(COMMIT_LOG, QUEUE, 0).real_size()
        assert size == 1000
        segment = after_restart.segment(COMMIT_LOG, QUEUE, 0, commit_position=size)
        assert await segment.read(0, size) == first
        await committed(segment, second)
        third_run = open_provider().segment(COMMIT_LOG, QUEUE, 0)
        assert await third_run.correct_commit_position() == 1500
        assert await third_run.read(0, 1500) == first + second

    @pytest.mark.slow
    async def test_twenty_mib_segment_from_five_commits(self, open_provider: ProviderFactory) -> None:
        parts = [payload(4 * MIB, seed) for seed in range(5)]
        segment = await committed(open_provider().segment(COMMIT_LOG, QUEUE, 0), *parts)
        expected = hashlib.sha256(b"".join(parts)).hexdigest()
        assert segment.commit_position == 20 * MIB
        reader = open_provider().segment(COMMIT_LOG, QUEUE, 0)
        assert await reader.correct_commit_position() == 20 * MIB
        assert hashlib.sha256(await reader.read(0, 20 * MIB)).hexdigest() == expected
        middle = 2 * 4 * MIB - 100  # straddles the second and third commit
        assert await reader.read(middle, 200) == b"".join(parts)[middle : middle + 200]
