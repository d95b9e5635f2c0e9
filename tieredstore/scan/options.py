"""Options of a scan: parsed once, validated, secrets kept out of every repr.

Spark hands a data source a case-insensitive dict of strings. ``ScanOptions.parse`` turns it into one
frozen object; an unknown or malformed option is a ConfigError naming the known ones, so a typo such
as ``cold_uri`` fails at ``load()`` instead of scanning the wrong place. ``ScanOptions.from_config``
builds the same object from a node's ``TieredStoreConfig`` (the table sync and the archiver).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from tieredstore.basics import MIB
from tieredstore.config import EncryptionSettings, TableSettings, TieredStoreConfig
from tieredstore.errors import ConfigError
from tieredstore.formats.naming import validate_topic
from tieredstore.metadata.engine import parse_url, safe_url
from tieredstore.providers.registry import redact_url, url_scheme
from tieredstore.runtime import provider_options

DEFAULT_MAX_PARTITION_BYTES = 128 * MIB
DEFAULT_READ_BLOCK_BYTES = 16 * MIB
DEFAULT_BATCH_ROWS = 8192
DEFAULT_PLANNING_CONCURRENCY = 32
METADATA_NONE = "none"

_S3_TEXT_OPTIONS = ("endpoint_url", "region", "addressing_style", "sse", "sse_kms_key_id")
_S3_SECRET_OPTIONS = ("access_key_id", "secret_access_key", "session_token")
_S3_NUMBER_OPTIONS: dict[str, type[int] | type[float]] = {
    "max_attempts": int,
    "max_pool_connections": int,
    "connect_timeout": float,
    "read_timeout": float,
}
_SCAN_OPTIONS = (
    "path",
    "topics",
    "cold_url",
    "metadata_url",
    "metadata",
    "cluster",
    "broker",
    "max_partition_bytes",
    "read_block_bytes",
    "batch_rows",
    "planning_concurrency",
    "on_corrupt",
    "table",
    "table_namespace",
    "catalog_uri",
    "catalog_properties",
)
# A REST catalog's credentials, by where the planning process finds them (a variable, a file): never the secret.
CATALOG_SECRET_OPTIONS = {
    "catalog_token_env": "token",
    "catalog_token_file": "token",
    "catalog_credential_env": "credential",
    "catalog_credential_file": "credential",
}
# Where the keyring is, as in [encryption]: a path and a variable name travel to executors, never key material.
_KEYRING_OPTIONS = ("keyring_file", "keyring_env")
_KMS_OPTION = "kms_keys"
KNOWN_OPTIONS = frozenset(
    _SCAN_OPTIONS
    + _KEYRING_OPTIONS
    + tuple(CATALOG_SECRET_OPTIONS)
    + (_KMS_OPTION,)
    + _S3_TEXT_OPTIONS
    + _S3_SECRET_OPTIONS
    + tuple(_S3_NUMBER_OPTIONS)
)


class TableMode(enum.StrEnum):
    """Whether a Spark read takes offsets a topic's Iceberg table holds from its Parquet files."""

    AUTO = "auto"  # when the topic has a table; else the archive alone
    TRUE = "true"  # a topic without a table is a ConfigError
    FALSE = "false"  # the archive alone, never opening a catalog


class OnCorrupt(enum.StrEnum):
    """What a task does with a record that does not decode."""

    FAIL = "fail"
    SKIP = "skip"


def _default(name: str) -> str:
    return str(TieredStoreConfig.model_fields[name].default)


def _table_default(name: str) -> str:
    return str(TableSettings.model_fields[name].default)


def _table_mode(options: Mapping[str, str]) -> TableMode:
    text = (options.get("table") or TableMode.AUTO.value).strip().lower()
    try:
        return TableMode(text)
    except ValueError as error:
        raise ConfigError(f"option table must be auto, true or false, not {text!r}") from error


def _positive_int(options: Mapping[str, str], name: str, default: int) -> int:
    text = options.get(name)
    if text is None:
        return default
    try:
        value = int(str(text).strip())
    except ValueError as error:
        raise ConfigError(f"option {name} must be a whole number, not {text!r}") from error
    if value <= 0:
        raise ConfigError(f"option {name} must be positive, not {value}")
    return value


def _topics(options: Mapping[str, str]) -> tuple[str, ...]:
    given = [options.get(name) for name in ("path", "topics")]
    texts = [text for text in given if text]
    if len(texts) != 1:
        raise ConfigError(
            "name the topics once: spark.read.format('tieredstore').load('orders,payments') "
            "or .option('topics', 'orders,payments')"
        )
    names = [name.strip() for name in texts[0].split(",") if name.strip()]
    if not names:
        raise ConfigError("no topic given; load('orders') or load('orders,payments')")
    return tuple(dict.fromkeys(validate_topic(name) for name in names))


def _namespace(options: Mapping[str, str]) -> str:
    text = options.get("table_namespace") or _table_default("namespace")
    try:
        return TableSettings(namespace=text).namespace
    except pydantic.ValidationError as error:
        raise ConfigError(f"option table_namespace must be letters, digits and _, not {text!r}") from error


def _provider_options(options: Mapping[str, str], cold_url: str) -> dict[str, Any]:
    names = _S3_TEXT_OPTIONS + _S3_SECRET_OPTIONS + tuple(_S3_NUMBER_OPTIONS)
    given = {name: options[name] for name in names if options.get(name) not in (None, "")}
    if not given:
        return {}
    if url_scheme(cold_url) != "s3":
        raise ConfigError(f"S3 options {sorted(given)} were given but cold_url {redact_url(cold_url)} is not s3://")
    parsed: dict[str, Any] = {}
    for name, text in given.items():
        kind = _S3_NUMBER_OPTIONS.get(name)
        if kind is None:
            parsed[name] = str(text)
            continue
        try:
            parsed[name] = kind(str(text))
        except ValueError as error:
            raise ConfigError(f"option {name} must be a number, not {text!r}") from error
    return parsed


def _keyring(options: Mapping[str, str]) -> EncryptionSettings:
    given: dict[str, Any] = {
        name: str(options[name]).strip() for name in _KEYRING_OPTIONS if options.get(name) not in (None, "")
    }
    kms_keys = options.get(_KMS_OPTION)
    if kms_keys not in (None, ""):
        # Names of KMS keys, not key material: key id -> KMS key id, ARN or alias, as in [encryption] kms_keys.
        try:
            given["kms_keys"] = json.loads(str(kms_keys))
        except ValueError as error:
            raise ConfigError('option kms_keys must be a JSON object, e.g. {"prod-2026": "alias/x"}') from error
    try:
        return EncryptionSettings.model_validate(given)
    except pydantic.ValidationError as error:
        raise ConfigError(f"options {sorted(given)} do not name a keyring: {error}") from error


def _catalog_properties(options: Mapping[str, str]) -> dict[str, str]:
    text = options.get("catalog_properties")
    if text in (None, ""):
        return {}
    try:
        parsed = json.loads(str(text))
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(isinstance(value, str) for value in parsed.values()):
        raise ConfigError('option catalog_properties must be a JSON object of strings, e.g. {"warehouse": "prod"}')
    secret = sorted(set(parsed) & set(CATALOG_SECRET_OPTIONS.values()))
    if secret:
        raise ConfigError(
            f"option catalog_properties must not carry {secret}: Spark shows options in plans; name the "
            "variable or file that holds it with catalog_token_env/_file or catalog_credential_env/_file"
        )
    return {str(name): value for name, value in parsed.items()}


@dataclass(frozen=True, slots=True)
class ScanOptions:
    """Everything a scan needs, on the driver and in every task. ``provider_options`` holds secrets."""

    topics: tuple[str, ...]
    cold_url: str
    metadata_url: str | None
    cluster: str = _default("cluster")
    broker: str | None = _default("broker")
    provider_options: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    read_block_bytes: int = DEFAULT_READ_BLOCK_BYTES
    batch_rows: int = DEFAULT_BATCH_ROWS
    planning_concurrency: int = DEFAULT_PLANNING_CONCURRENCY
    on_corrupt: OnCorrupt = OnCorrupt.FAIL
    keyring: EncryptionSettings = field(default_factory=EncryptionSettings)
    # Read only by the Spark source's planner (tieredstore.table.read_plan): a sync always reads the archive.
    table: TableMode = TableMode.AUTO
    table_namespace: str = _table_default("namespace")
    catalog_uri: str | None = None
    catalog_properties: dict[str, str] = field(default_factory=dict)  # a REST catalog's, none of them secret
    catalog_secrets: dict[str, str] = field(default_factory=dict)  # option (catalog_token_env ...) -> its value

    @property
    def uses_metadata(self) -> bool:
        """False in the metadata-free mode, which discovers queues and segments by listing ``cold_url``."""
        return self.metadata_url is not None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ScanOptions:
        """Options from Spark's option map (names are case-insensitive there; lower-case here)."""
        lowered = {str(name).lower(): value for name, value in options.items()}
        unknown = sorted(set(lowered) - KNOWN_OPTIONS)
        if unknown:
            raise ConfigError(f"unknown tieredstore option(s) {unknown}; known: {sorted(KNOWN_OPTIONS)}")
        cold_url = lowered.get("cold_url")
        if not cold_url:
            raise ConfigError("option cold_url is required, e.g. s3://bucket/prefix or file:///var/lib/tieredstore")
        metadata_url = lowered.get("metadata_url") or None
        if metadata_url is not None:
            parse_url(metadata_url)
        metadata_mode = (lowered.get("metadata") or "").strip().lower()
        if metadata_mode not in ("", METADATA_NONE):
            raise ConfigError(f"option metadata takes only {METADATA_NONE!r} (list the cold URL instead)")
        if metadata_mode == METADATA_NONE and metadata_url is not None:
            raise ConfigError("give metadata_url or metadata=none, not both")
        if metadata_mode != METADATA_NONE and metadata_url is None:
            raise ConfigError(
                "option metadata_url is required (sqlite:///... or postgresql+psycopg://...); "
                "without a reachable database use option metadata=none, which lists the cold URL (slower to plan)"
            )
        on_corrupt_text = (lowered.get("on_corrupt") or OnCorrupt.FAIL.value).strip().lower()
        try:
            on_corrupt = OnCorrupt(on_corrupt_text)
        except ValueError as error:
            raise ConfigError(f"option on_corrupt must be fail or skip, not {on_corrupt_text!r}") from error
        broker: str | None = lowered.get("broker") or None
        if broker is None and metadata_url is not None:
            broker = _default("broker")
        return cls(
            topics=_topics(lowered),
            cold_url=str(cold_url),
            metadata_url=metadata_url,
            cluster=lowered.get("cluster") or _default("cluster"),
            broker=broker,
            provider_options=_provider_options(lowered, str(cold_url)),
            max_partition_bytes=_positive_int(lowered, "max_partition_bytes", DEFAULT_MAX_PARTITION_BYTES),
            read_block_bytes=_positive_int(lowered, "read_block_bytes", DEFAULT_READ_BLOCK_BYTES),
            batch_rows=_positive_int(lowered, "batch_rows", DEFAULT_BATCH_ROWS),
            planning_concurrency=_positive_int(lowered, "planning_concurrency", DEFAULT_PLANNING_CONCURRENCY),
            on_corrupt=on_corrupt,
            keyring=_keyring(lowered),
            table=_table_mode(lowered),
            table_namespace=_namespace(lowered),
            catalog_uri=lowered.get("catalog_uri") or None,
            catalog_properties=_catalog_properties(lowered),
            catalog_secrets={
                option: str(lowered[option]).strip()
                for option in CATALOG_SECRET_OPTIONS
                if lowered.get(option) not in (None, "")
            },
        )

    @classmethod
    def from_config(cls, config: TieredStoreConfig, topics: Iterable[str]) -> ScanOptions:
        """Options to scan ``topics`` of the archive ``config`` describes: its metadata database, cold URL
        with its S3 settings, cluster, broker and keyring; scan tuning at its defaults."""
        names = tuple(dict.fromkeys(validate_topic(topic) for topic in topics))
        if not names:
            raise ConfigError("no topic given to scan")
        return cls(
            topics=names,
            cold_url=config.effective_cold_url,
            metadata_url=config.effective_metadata_url,
            cluster=config.cluster,
            broker=config.broker,
            provider_options=provider_options(config),
            keyring=config.encryption,
            table_namespace=config.table.namespace,
            catalog_uri=config.table.catalog_uri,
        )

    def __repr__(self) -> str:
        metadata = "none (listing)" if self.metadata_url is None else safe_url(self.metadata_url)
        return (
            f"ScanOptions(topics={list(self.topics)}, cold_url={redact_url(self.cold_url)!r}, metadata={metadata!r}, "
            f"cluster={self.cluster!r}, broker={self.broker!r}, max_partition_bytes={self.max_partition_bytes}, "
            f"on_corrupt={self.on_corrupt.value}, table={self.table.value}{self._keyring_shown()})"
        )

    def _keyring_shown(self) -> str:
        file, env = self.keyring.keyring_file, self.keyring.keyring_env
        shown = ([f"keyring_file={str(file)!r}"] if file else []) + ([f"keyring_env={env!r}"] if env else [])
        shown += [f"kms_keys={sorted(self.keyring.kms_keys)!r}"] if self.keyring.kms_keys else []
        return "".join(f", {part}" for part in shown)

    __str__ = __repr__
