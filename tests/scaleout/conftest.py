"""Fixtures of the scale-out tests."""

from __future__ import annotations

import pytest

from tieredstore.metadata import MetadataStore


@pytest.fixture
def no_idle_transaction_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leases of 1.5 s leave PostgreSQL ending any transaction idle for 1 s (``limit_idle_transactions``),
    which a loaded CI machine can pause a test inside; these tests stall between transactions (sleeps), never
    inside one, and the limit has its own test (test_leases.py), so here the server's default stands."""
    original = MetadataStore.limit_idle_transactions
    monkeypatch.setattr(MetadataStore, "limit_idle_transactions", lambda self, seconds: original(self, None))
