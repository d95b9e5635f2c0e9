"""How to reach S3: ``S3Options`` (from settings or an ``s3://`` URL's query) and the socket options of its
connections, apart from the provider that uses them."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qsl, urlsplit

from tieredstore.errors import ConfigError
from tieredstore.formats.naming import FileType
from tieredstore.providers.paths import check_logical_path
from tieredstore.providers.s3_choices import STANDARD, ConditionalWrites, check_conditional_writes, check_storage_class
from tieredstore.tuning import receive_buffer_granted as receive_buffer_granted  # its earlier home
from tieredstore.tuning import receive_buffer_socket_options

log = logging.getLogger(__name__)
T = TypeVar("T")

AddressingStyle = Literal["auto", "path", "virtual"]
ServerSideEncryption = Literal["AES256", "aws:kms"]

_OPTION_QUERY_KEYS = frozenset(
    {
        "endpoint_url",
        "region",
        "addressing_style",
        "sse",
        "sse_kms_key_id",
        "max_attempts",
        "connect_timeout",
        "read_timeout",
        "max_pool_connections",
        "conditional_writes",
        "storage_class",
        "index_storage_class",
    }
)
# URL parameters of older versions, still accepted (and ignored, with a warning) so that their URLs work.
_REMOVED_QUERY_KEYS = {
    "receive_buffer_bytes": "GET connections ask for the buffer a chunk needs where the kernel grants it",
}
_warned_removed: set[str] = set()
_CREDENTIAL_QUERY_KEYS = frozenset(
    {"access_key_id", "secret_access_key", "session_token", "aws_access_key_id", "aws_secret_access_key"}
)


@dataclass(frozen=True, slots=True)
class S3Options:
    """How to reach S3. Credentials are excluded from ``repr`` and equality output is never logged.

    ``max_pool_connections`` bounds the connections one provider holds open to the endpoint: calls beyond
    it wait for a free connection. It should cover every call in flight at once on one provider, which in
    a runtime is the archiver's pending commits and the readers' fetches together, so the default is 32
    rather than botocore's 10; connections are opened only as calls need them.

    ``conditional_writes``, ``storage_class`` and ``index_storage_class``: see ``s3_choices``.
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    addressing_style: AddressingStyle = "auto"
    sse: ServerSideEncryption | None = None
    sse_kms_key_id: str | None = None
    max_attempts: int = 5
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    retry_initial_delay: float = 0.1
    retry_max_delay: float = 5.0
    list_page_size: int = 1000
    max_pool_connections: int = 32
    conditional_writes: ConditionalWrites = "required"
    storage_class: str = STANDARD
    index_storage_class: str = STANDARD

    def __post_init__(self) -> None:
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ConfigError(f"addressing_style must be auto, path or virtual, not {self.addressing_style!r}")
        if self.sse not in (None, "AES256", "aws:kms"):
            raise ConfigError(f"sse must be AES256 or aws:kms, not {self.sse!r}")
        if self.sse_kms_key_id is not None and self.sse != "aws:kms":
            raise ConfigError("sse_kms_key_id needs sse='aws:kms'")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ConfigError("give both access_key_id and secret_access_key, or neither")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be at least 1, not {self.max_attempts}")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise ConfigError("connect_timeout and read_timeout must be positive")
        if self.max_pool_connections < 1:
            raise ConfigError(f"max_pool_connections must be at least 1, not {self.max_pool_connections}")
        if not 1 <= self.list_page_size <= 1000:
            raise ConfigError(f"list_page_size must be within 1..1000, not {self.list_page_size}")
        check_conditional_writes(self.conditional_writes)
        check_storage_class(self.storage_class, "storage_class")
        check_storage_class(self.index_storage_class, "index_storage_class")

    @classmethod
    def from_query(cls, query: str, **overrides: Any) -> S3Options:
        """Options from a URL query (``?region=eu-west-1&sse=AES256``) then keyword overrides.

        Credentials are refused in a URL: URLs end up in logs and metadata.
        """
        values: dict[str, Any] = {}
        for name, value in parse_qsl(query, keep_blank_values=True):
            if name in _CREDENTIAL_QUERY_KEYS:
                raise ConfigError(f"credentials must not be given in the URL (query parameter {name!r})")
            if name in _REMOVED_QUERY_KEYS:
                _warn_removed(name)
                continue
            if name not in _OPTION_QUERY_KEYS:
                raise ConfigError(f"unknown S3 URL parameter {name!r}; known: {sorted(_OPTION_QUERY_KEYS)}")
            values[name] = value
        for name in ("max_attempts", "max_pool_connections"):
            if name in values:
                values[name] = _parse_number(name, values[name], int)
        for name in ("connect_timeout", "read_timeout"):
            if name in values:
                values[name] = _parse_number(name, values[name], float)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"unknown S3 options {unknown}; known: {sorted(known)}")
        values.update(overrides)
        return cls(**values)

    def connection_arguments(self) -> dict[str, str | None]:
        """Where and as whom a botocore client connects (``create_client`` keywords): secrets, never to log."""
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "aws_session_token": self.session_token,
        }

    def storage_class_arguments(self, file_type: FileType | None) -> dict[str, str]:
        """The PutObject argument that stores a chunk of ``file_type`` in its class; none for STANDARD
        (S3's own default) and for objects that are no chunk (markers, probes)."""
        if file_type is None:
            return {}
        storage_class = self.storage_class if file_type is FileType.COMMIT_LOG else self.index_storage_class
        return {} if storage_class == STANDARD else {"StorageClass": storage_class}

    def encryption_arguments(self) -> dict[str, str]:
        """The PutObject arguments that ask for server-side encryption."""
        arguments: dict[str, str] = {}
        if self.sse is not None:
            arguments["ServerSideEncryption"] = self.sse
        if self.sse_kms_key_id is not None:
            arguments["SSEKMSKeyId"] = self.sse_kms_key_id
        return arguments


def _warn_removed(name: str) -> None:
    if name not in _warned_removed:
        _warned_removed.add(name)
        log.warning("S3 URL parameter %s is no longer a setting and is ignored: %s", name, _REMOVED_QUERY_KEYS[name])


def ask_for_receive_buffer(client: Any) -> bool:
    """Have the new connections of a botocore client ask for the receive buffer a GET needs; whether they will.

    A GET's worker thread takes the GIL for each piece of the response it reads off the socket. Beside a
    reader serving from the cache it waits for the GIL, and while it waits, the kernel's receive buffer
    fills and the server stops sending: a buffer that holds a whole chunk keeps the transfer going
    (``tieredstore.tuning.receive_buffer_socket_options`` says when the kernel grants one). The client's
    HTTP session keeps its socket options in a list that its connection pools share (botocore's
    ``URLLib3Session``); the option is added to it.
    """
    wanted = receive_buffer_socket_options()
    if not wanted:
        return False
    options = getattr(getattr(getattr(client, "_endpoint", None), "http_session", None), "_socket_options", None)
    if not isinstance(options, list):
        return False  # a botocore whose session keeps them otherwise: the kernel's buffer, as before
    options.extend(wanted)
    return True


def _parse_number(name: str, text: str, kind: Callable[[str], T]) -> T:
    try:
        return kind(text)
    except ValueError as error:
        raise ConfigError(f"S3 URL parameter {name} must be a number, not {text!r}") from error


def parse_s3_url(url: str) -> tuple[str, str, str]:
    """``(bucket, prefix, query)`` of ``s3://bucket/prefix?query``; ConfigError for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "s3":
        raise ConfigError(f"the S3 provider takes s3:// URLs, not {parts.scheme or 'plain'} ones")
    if "@" in parts.netloc:
        raise ConfigError("credentials must not be given in the URL; pass them as options")
    bucket = parts.netloc
    if not bucket:
        raise ConfigError("an s3:// URL needs a bucket: s3://bucket/prefix")
    prefix = parts.path.strip("/")
    if prefix:
        check_logical_path(prefix)
    return bucket, prefix, parts.query
