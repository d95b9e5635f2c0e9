"""The shared ``provider_factory`` fixture opens every backend on one root that survives a restart."""

from __future__ import annotations

from tests.fixtures.backends import ProviderBackend
from tieredstore.formats.naming import FileType

QUEUE = "c1_cluster/broker-a/TopicTest/0"


async def test_each_backend_keeps_data_across_provider_instances(provider_factory: ProviderBackend) -> None:
    writer = provider_factory().segment(FileType.COMMIT_LOG, QUEUE, 0)
    writer.append(f"stored by {provider_factory.name}".encode())
    await writer.commit()
    reader = provider_factory().segment(FileType.COMMIT_LOG, QUEUE, 0)
    size = await reader.correct_commit_position()
    assert await reader.read(0, size) == f"stored by {provider_factory.name}".encode()
    assert await provider_factory().list_segments(QUEUE, FileType.COMMIT_LOG) == [0]
