"""Opening a provider from a URL: one registry keyed by scheme, importing each provider lazily.

    memory://NAME              MemoryProvider   (tests, the embedded demo)
    file:///dir or /dir, dir   PosixProvider
    s3://bucket/prefix         S3Provider       (extra: tieredstore[s3])
    fsspec+SCHEME://...        FsspecProvider   (force the generic provider, e.g. fsspec+s3://)
    any other scheme           FsspecProvider   (s3a://, gs://, abfs://, local:// ...)

A provider whose optional dependency is missing raises MissingExtraError saying what to install.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tieredstore.errors import ConfigError, MissingExtraError
from tieredstore.providers.base import Provider

FSSPEC_PREFIX = "fsspec+"


@dataclass(frozen=True, slots=True)
class ProviderEntry:
    """Where a provider class lives and which modules (and extra) it needs."""

    module: str
    class_name: str
    requires: tuple[str, ...] = ()
    extra: str | None = None

    def load(self) -> Callable[..., Provider]:
        for dependency in self.requires:
            try:
                importlib.import_module(dependency)
            except ImportError as error:
                hint = f"pip install 'tieredstore[{self.extra}]'" if self.extra else f"pip install {dependency}"
                raise MissingExtraError(
                    f"{self.class_name} needs {dependency}, which is not installed: {hint}"
                ) from error
        module = importlib.import_module(self.module)
        return cast(Callable[..., Provider], getattr(module, self.class_name))


PROVIDERS: dict[str, ProviderEntry] = {
    "memory": ProviderEntry("tieredstore.providers.memory", "MemoryProvider"),
    "file": ProviderEntry("tieredstore.providers.posix", "PosixProvider"),
    "s3": ProviderEntry("tieredstore.providers.s3", "S3Provider", ("aiobotocore", "botocore", "aiohttp"), "s3"),
}
FSSPEC_ENTRY = ProviderEntry("tieredstore.providers.fsspec", "FsspecProvider", ("fsspec",))


def url_scheme(url: str) -> str:
    """The scheme of ``url``; ``file`` for a plain path."""
    if "://" not in url:
        return "file"
    return url.split("://", 1)[0].lower()


def open_provider(url: str, **options: Any) -> Provider:
    """The provider for ``url``, built with ``options`` (e.g. S3 credentials, fsspec storage options)."""
    if not isinstance(url, str) or not url:
        raise ConfigError("a storage URL is required, e.g. file:///var/lib/tieredstore or s3://bucket/prefix")
    scheme = url_scheme(url)
    if scheme.startswith(FSSPEC_PREFIX):
        return FSSPEC_ENTRY.load()(url[len(FSSPEC_PREFIX) :], **options)
    entry = PROVIDERS.get(scheme, FSSPEC_ENTRY)
    if entry.module != FSSPEC_ENTRY.module and options and scheme != "s3":
        raise ConfigError(f"the {scheme}:// provider takes no options, got {sorted(options)}")
    return entry.load()(url, **options)


_SECRET_WORDS = ("secret", "password", "passwd", "token", "key", "credential", "signature", "sig")


def redact_url(url: str) -> str:
    """``url`` without user info and without query parameters that look like credentials, for logs."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    query = [
        (name, value)
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
        if not any(word in name.lower() for word in _SECRET_WORDS)
    ]
    return urlunsplit((parts.scheme, host, parts.path, urlencode(query), parts.fragment))
