"""Opening providers by URL scheme, and redacting URLs for logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tieredstore.errors import ConfigError
from tieredstore.providers.fsspec import FsspecProvider
from tieredstore.providers.memory import MemoryProvider
from tieredstore.providers.posix import PosixProvider
from tieredstore.providers.registry import open_provider, redact_url
from tieredstore.providers.s3 import S3Provider


def test_each_scheme_opens_its_provider(tmp_path: Path) -> None:
    assert isinstance(open_provider("memory://registry"), MemoryProvider)
    assert isinstance(open_provider(str(tmp_path)), PosixProvider)
    assert isinstance(open_provider(f"file://{tmp_path}"), PosixProvider)
    assert isinstance(open_provider("s3://bucket/prefix", region="eu-west-1"), S3Provider)
    assert isinstance(open_provider("s3a://bucket/prefix"), FsspecProvider)
    assert isinstance(open_provider(f"local://{tmp_path}"), FsspecProvider)
    forced = open_provider("fsspec+s3://bucket/prefix")
    assert isinstance(forced, FsspecProvider)
    assert forced.url == "s3://bucket/prefix"


def test_options_for_a_provider_that_takes_none_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        open_provider(str(tmp_path), endpoint_url="http://x")
    with pytest.raises(ConfigError):
        open_provider("")


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("s3://bucket/prefix?region=eu-west-1", "s3://bucket/prefix?region=eu-west-1"),
        ("ftp://user:hunter2@host/data", "ftp://host/data"),
        ("abfs://container/x?account_key=abc&sas_token=def&account_name=me", "abfs://container/x?account_name=me"),
        ("/var/lib/tieredstore", "/var/lib/tieredstore"),
    ],
)
def test_redact_url_strips_credentials(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted
