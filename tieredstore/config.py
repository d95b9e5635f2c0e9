"""Configuration: a TOML file, then ``TIEREDSTORE_*`` environment variables, then flags; frozen after load.

Every knob of DESIGN.md has one field here with its default. Nested sections map to TOML tables and
to environment variables with a double underscore: ``[archiver] group_commit_count = 8`` is the
same as ``TIEREDSTORE_ARCHIVER__GROUP_COMMIT_COUNT=8``. Unknown keys are errors, not silently ignored.
"""

from __future__ import annotations

import enum
import os
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal

import pydantic
import structlog
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from tieredstore.basics import GIB, MIB
from tieredstore.errors import ConfigError
from tieredstore.providers.codec import Compression
from tieredstore.providers.s3_choices import STANDARD, ConditionalWrites, check_storage_class
from tieredstore.topic_filter import check_topic_pattern

log = structlog.get_logger(__name__)

DEFAULT_DATA_DIR = Path("tieredstore-data")
CONFIG_ENV = "TIEREDSTORE_CONFIG"
# Removed keys already warned about: a process loads its configuration more than once (CLI, Spark tasks).
_warned_removed: set[str] = set()


class ReadPolicy(enum.StrEnum):
    """Which tier serves a read (RocketMQ's TieredStorageLevel)."""

    DISABLE = "DISABLE"  # hot only
    NOT_IN_DISK = "NOT_IN_DISK"  # cold only when the hot store no longer has the offset
    NOT_IN_MEM = "NOT_IN_MEM"  # cold when the hot copy is not resident in memory
    FORCE = "FORCE"  # cold always


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # The section's name in TOML, and the keys of older versions with why each went: a file or variable that
    # still sets one loads, the key is ignored and a warning says so once, instead of the deployment failing.
    section: ClassVar[str]
    removed_keys: ClassVar[dict[str, str]] = {}

    @pydantic.model_validator(mode="before")
    @classmethod
    def _drop_removed_keys(cls, values: Any) -> Any:
        if not isinstance(values, dict) or not cls.removed_keys.keys() & values.keys():
            return values
        for key in sorted(cls.removed_keys.keys() & values.keys()):
            name = f"{cls.section}.{key}"
            if name not in _warned_removed:
                _warned_removed.add(name)
                log.warning(f"{name} is ignored and can be removed, it is no longer a setting: {cls.removed_keys[key]}")
        return {k: v for k, v in values.items() if k not in cls.removed_keys}


class S3Settings(_Section):
    """Connection to S3 or an S3-compatible service; credentials are secrets and never printed."""

    section: ClassVar[str] = "s3"
    removed_keys: ClassVar[dict[str, str]] = {
        "receive_buffer_bytes": "GET connections ask for the receive buffer a chunk needs where the kernel grants it",
    }

    endpoint_url: str | None = Field(
        default=None, description="URL of MinIO or another S3-compatible service (default: AWS S3)"
    )
    region: str | None = Field(default=None, description="the bucket's region (default: from the AWS environment)")
    access_key_id: SecretStr | None = Field(
        default=None, description="S3 access key; default: the usual AWS_* environment, profile or instance role"
    )
    secret_access_key: SecretStr | None = Field(default=None, description="goes with access_key_id")
    session_token: SecretStr | None = Field(default=None, description="for temporary credentials only")
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        default="auto", description="bucket in the path or in the host name; path for most S3-compatible services"
    )
    sse: Literal["AES256", "aws:kms"] | None = Field(
        default=None, description="server-side encryption of every chunk written (default: the bucket's own)"
    )
    sse_kms_key_id: str | None = Field(default=None, description='the KMS key ARN, with sse = "aws:kms"')
    max_attempts: int = Field(
        default=5, ge=1, le=50, description="attempts of one S3 request, the first included, before it fails"
    )
    # Connections one provider may hold open: cover the archiver's max_pending_commits plus concurrent readers.
    max_pool_connections: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="connections per provider: at least max_pending_commits plus the concurrent readers",
    )
    conditional_writes: ConditionalWrites = Field(
        default="required",
        description="required: check once before archiving that the endpoint refuses a second If-None-Match "
        "create, and refuse to archive if not; unsupported: an endpoint that ignores it, one archiver only "
        "(no leases), each chunk read back after it is written",
    )
    storage_class: str = Field(default=STANDARD, description="S3 storage class of commit-log chunks")
    index_storage_class: str = Field(
        default=STANDARD, description="S3 storage class of consume-queue and key-index chunks (small objects)"
    )

    @pydantic.field_validator("storage_class", "index_storage_class")
    @classmethod
    def _check_storage_class(cls, value: str) -> str:
        try:
            return check_storage_class(value)
        except ConfigError as error:
            raise ValueError(str(error)) from error


class HotSettings(_Section):
    """The local hot store."""

    section: ClassVar[str] = "hot"

    commit_log_file_size: int = Field(
        default=GIB,
        ge=4096,
        description="bytes of each commit-log file of a new hot store; existing files keep their size on disk",
    )
    consume_queue_units_per_file: int = Field(
        default=300_000, ge=1, description="units (20 bytes each) of each consume-queue file of a new hot store"
    )
    max_message_size: int = Field(default=4 * MIB, ge=1, description="bytes of the largest body a put accepts")
    max_queues_per_topic: int = Field(default=1024, ge=1, description="queue ids a topic may use: 0 to this minus one")
    flush_mode: Literal["async", "sync"] = Field(
        default="async",
        description="sync: a put returns once its bytes are on disk; async: flushed every flush_interval",
    )
    flush_interval: float = Field(
        default=0.5, gt=0, description="seconds between hot-store flushes; the archiver takes only flushed messages"
    )
    hot_retention_hours: float = Field(
        default=72, ge=0, description="hours a hot commit-log file is kept, and then deleted only once archived"
    )
    hot_disk_high_watermark: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description="fraction of the hot store's file system in use above which puts are refused",
    )
    index_slot_count: int = Field(
        default=100_000,
        ge=1,
        le=50_000_000,
        description="hash slots of each hot key-index file (<hot>/index/; RocketMQ's maxHashSlotNum, 5,000,000)",
    )
    index_max_items: int = Field(
        default=400_000,
        ge=2,
        le=50_000_000,
        description="items of each hot key-index file, one key each but item 0 (RocketMQ's maxIndexNum, 20,000,000)",
    )


class SegmentSettings(_Section):
    """Cold segments: sizes and rolling by time."""

    section: ClassVar[str] = "segments"
    removed_keys: ClassVar[dict[str, str]] = {
        "commit_log_rolling_min_size": "segments roll by time whatever their size, so that retention removes "
        "a quiet queue's data too",
    }

    commit_log_max_size: int = Field(
        default=GIB, ge=4096, description="bytes after which a queue's cold commit-log segment rolls to a new one"
    )
    consume_queue_max_size: int = Field(
        default=100 * MIB, ge=20, description="bytes after which a queue's cold consume-queue segment rolls"
    )
    commit_log_rolling_interval: float = Field(
        default=24 * 3600,
        gt=0,
        description="seconds after which a queue's open commit-log and consume-queue segments roll, whatever "
        "their size: cold data is gone at most its topic's retention plus this after it was stored",
    )


class ArchiverSettings(_Section):
    """The dispatcher's group commit and concurrency."""

    section: ClassVar[str] = "archiver"
    removed_keys: ClassVar[dict[str, str]] = {
        "unmap_hot_reads": "batch reads always unmap the hot pages they copy, which bounds the archiver's memory",
        "tune_allocator": "tieredstore run always tunes glibc's allocator, except where a MALLOC_* variable is set",
    }

    group_commit_timeout: float = Field(
        default=30.0, ge=0, description="seconds the oldest pending message of a queue may wait for its batch"
    )
    group_commit_count: int = Field(default=4096, ge=1, description="messages pending in a queue that make it commit")
    group_commit_size: int = Field(
        default=4 * MIB, ge=1, description="bytes of one batch, always at least one message however large"
    )
    max_pending_commits: int = Field(
        default=8,
        ge=1,
        description="batches in memory or in flight, all queues together: slow storage slows the archiver instead",
    )
    scan_interval: float = Field(default=1.0, gt=0, description="seconds between scans of idle queues")
    start_from: str = Field(
        default="earliest",
        description="where a queue seen for the first time starts: earliest | latest | an epoch-ms timestamp",
    )
    shutdown_timeout: float = Field(
        default=30.0, gt=0, description="seconds in-flight commits may take to finish on SIGTERM or SIGINT"
    )
    max_upload_bytes_per_second: int | None = Field(
        default=None,
        gt=0,
        description="cap on the bytes the archiver writes to cold storage a second, all queues and the key index "
        "together (None: no cap); a commit larger than one second's worth still goes, alone",
    )
    commit_timeout: float = Field(
        default=120.0,
        gt=0,
        description="seconds a storage call of a commit may take before it is abandoned and retried from its buffer",
    )
    retry_initial_backoff: float = Field(
        default=0.2, gt=0, description="seconds before a failed commit's first retry; doubled at each failure"
    )
    retry_max_backoff: float = Field(default=30.0, gt=0, description="seconds between retries at the most")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve Prometheus /metrics on this port (0: a free one; none: off)"
    )
    metrics_addr: str = Field(default="127.0.0.1", description="address /metrics binds to; 0.0.0.0 in a container")
    maintain_interval: float = Field(
        default=60.0,
        gt=0,
        description="seconds between maintenance passes: hot and cold retention (rolling segments that are due), "
        "key-index upload",
    )
    leases: bool | None = Field(
        default=None,
        description="split queues among several archivers by lease; default: on for PostgreSQL, off for SQLite",
    )
    owner_id: str | None = Field(
        default=None, max_length=200, description="this archiver's name in leases; default: <hostname>-<pid>-<random>"
    )
    lease_duration: float = Field(default=30.0, gt=0, description="seconds a queue lease lasts unless renewed")
    lease_renew_interval: float = Field(default=10.0, gt=0, description="seconds between lease renewals")
    topics_include: tuple[str, ...] = Field(
        default=("*",),
        min_length=1,
        description="glob patterns (* ? [...], case-sensitive) of the hot topics to archive",
    )
    topics_exclude: tuple[str, ...] = Field(
        default=(),
        description="glob patterns of topics not to archive even if included; what was archived stays readable",
    )
    archive_system_topics: bool = Field(
        default=False,
        description="also archive RocketMQ's system topics (rmq_sys_*, SCHEDULE_TOPIC_XXXX, "
        "RMQ_SYS_TRANS_HALF_TOPIC, ...: tieredstore.topic_filter), excluded by default",
    )

    @pydantic.model_validator(mode="after")
    def _check_lease_timing(self) -> ArchiverSettings:
        # A renewal may fail once and the lease must still be renewed well before it can be taken over.
        if self.lease_renew_interval * 3 > self.lease_duration * (1 + 1e-9):
            raise ValueError(
                f"lease_renew_interval ({self.lease_renew_interval:g}s) must be at most a third of "
                f"lease_duration ({self.lease_duration:g}s)"
            )
        return self

    @pydantic.field_validator("topics_include", "topics_exclude", mode="before")
    @classmethod
    def _require_a_list(cls, value: Any) -> Any:
        # A bare string would otherwise be refused as "not a valid tuple", which names no TOML type.
        if not isinstance(value, list | tuple):
            raise ValueError('must be a list of glob patterns, e.g. ["Orders*", "%DLQ%*"]')
        return value

    @pydantic.field_validator("topics_include", "topics_exclude")
    @classmethod
    def _check_topic_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            check_topic_pattern(pattern)
        return patterns

    @pydantic.field_validator("start_from")
    @classmethod
    def _check_start_from(cls, value: str) -> str:
        if value not in ("earliest", "latest") and not value.isdigit():
            raise ValueError("must be 'earliest', 'latest' or an epoch-millisecond timestamp")
        return value


class ReadSettings(_Section):
    """The fetcher and its read-ahead cache."""

    section: ClassVar[str] = "read"
    removed_keys: ClassVar[dict[str, str]] = {
        "prefetch_handoff": "a reader that starts a prefetch gives its read a turn of the event loop to start",
    }

    read_policy: ReadPolicy = Field(
        default=ReadPolicy.NOT_IN_DISK,
        description="which tier serves a read: DISABLE hot only, NOT_IN_DISK cold once the hot store lost the offset, "
        "NOT_IN_MEM cold when the hot copy is not in memory, FORCE cold always",
    )
    read_ahead_count: int = Field(
        default=4096, ge=1, description="messages a cold miss reads ahead in one window (two more are prefetched)"
    )
    read_ahead_size: int = Field(
        default=16 * MIB, ge=1, description="bytes of one read-ahead window at the most, never below one message"
    )
    read_ahead_cache_bytes: int = Field(
        default=256 * MIB, ge=0, description="bytes the read-ahead cache holds at the most; 0: no cache"
    )
    read_ahead_ttl: float = Field(default=15.0, gt=0, description="seconds a cached window stays after its last read")
    read_ahead_readers: int = Field(
        default=1,
        ge=0,
        description=(
            "how many readers read each cold window through: a cached window is released once its last record "
            "has been served that many times (0: kept until read_ahead_ttl or eviction). Set it to the number of "
            "consumer groups that read the same queues at about the same time"
        ),
    )


class ColdSettings(_Section):
    """How segments are stored in cold storage: compressed per commit (zstd frames), per topic."""

    section: ClassVar[str] = "cold"

    compression: Compression = Field(
        default=Compression.NONE,
        description="how new segments are compressed: zstd (pip install 'tieredstore[compression]') or none; "
        "segments written before keep theirs and stay readable",
    )
    compression_level: int = Field(
        default=3, ge=1, le=22, description="zstd level of new segments (1 fast .. 22 small)"
    )
    topic_compression: dict[str, Compression] = Field(
        default_factory=dict,
        description='per-topic compression that overrides compression, e.g. {Orders = "zstd", Raw = "none"}',
    )


class EncryptionSettings(_Section):
    """Envelope encryption of cold segments: a data key per segment, wrapped by a key from the keyring."""

    section: ClassVar[str] = "encryption"

    keyring_file: Path | None = Field(
        default=None,
        description="a TOML file whose [keys] table maps key ids to base64 AES-256 keys (key-encryption keys)",
    )
    keyring_env: str | None = Field(
        default=None,
        description="the name of an environment variable holding more keys as id=base64 pairs, comma separated",
    )
    active_key: str | None = Field(
        default=None,
        description="the key id that wraps new segments' data keys; set, every new segment is encrypted "
        "(pip install 'tieredstore[encryption]')",
    )
    kms_keys: dict[str, str] = Field(
        default_factory=dict,
        description="key ids that are AWS KMS keys: key id = KMS key id, ARN or alias (kms:Encrypt and kms:Decrypt "
        "on it), reached with [s3]'s endpoint_url, region and credentials; one can be the active_key "
        "(pip install 'tieredstore[s3]')",
    )

    @pydantic.field_validator("keyring_file")
    @classmethod
    def _expand_home(cls, value: Path | None) -> Path | None:
        return None if value is None else _home_expanded(value)


class TableSettings(_Section):
    """The Apache Iceberg table per topic that ``tieredstore table sync`` and the archiver keep (docs/table.md)."""

    section: ClassVar[str] = "table"

    enabled: bool = Field(
        default=False,
        description="the archiver (tieredstore run) syncs every topic's table every commit_interval "
        "(pip install 'tieredstore[table]')",
    )
    commit_interval: float = Field(
        default=60.0, gt=0, description="seconds between the archiver's table syncs: the table's lag at most"
    )
    namespace: str = Field(
        default="tieredstore",
        min_length=1,
        pattern=r"^[A-Za-z0-9_]+$",
        description="the Iceberg namespace of the tables; each table is named after its topic",
    )
    catalog_uri: str | None = Field(
        default=None,
        description="an Iceberg REST catalog (http(s)://…); default: pyiceberg's SQL catalog in the metadata database",
    )
    catalog_properties: dict[str, str] = Field(
        default_factory=dict,
        description="further properties of the REST catalog, as pyiceberg names them (warehouse, prefix, scope, "
        "oauth2-server-uri, header.<name>); its credentials go in catalog_token or catalog_credential",
    )
    catalog_token: SecretStr | None = Field(
        default=None, description="a bearer token for the REST catalog (a secret: never printed)"
    )
    catalog_credential: SecretStr | None = Field(
        default=None,
        description="OAuth2 client credentials client_id:client_secret for the REST catalog (a secret: never printed)",
    )
    location: Literal["cold", "catalog"] = Field(
        default="cold",
        description="where a new table keeps its files: cold, under the cold URL (iceberg/<namespace>/<topic>); "
        "catalog, where the REST catalog assigns (for catalogs that refuse a location chosen by the client)",
    )
    target_file_size: int = Field(
        default=128 * MIB, ge=1 << 20, description="bytes of Arrow data each sync commit and data file aims at"
    )
    orphan_grace: float = Field(
        default=3600.0,
        ge=0,
        description="seconds an unreferenced data, manifest or metadata file under a table must be old before "
        "table sync deletes it (a file younger may belong to a sync about to commit)",
    )
    allow_unencrypted: bool = Field(
        default=False,
        description="sync even with [encryption] active_key set: the table's Parquet files are not encrypted",
    )
    snapshot_max_age: float = Field(
        default=86_400.0,
        ge=0,
        description="seconds a table snapshot is kept: each sync expires older ones (and files only they "
        "referenced), beyond the newest snapshot_retain_last",
    )
    snapshot_retain_last: int = Field(
        default=10, ge=1, description="newest snapshots each sync keeps whatever their age (time travel, readers)"
    )
    compact_interval: float = Field(
        default=3600.0,
        ge=0,
        description="seconds between the archiver's compactions of each table (small sync files merged); 0: never",
    )

    @pydantic.model_validator(mode="after")
    def _rest_settings_need_a_rest_catalog(self) -> TableSettings:
        given = [name for name in _REST_ONLY if getattr(self, name) not in (None, {}, "cold")]
        if given and self.catalog_uri is None:
            raise ValueError(f"{', '.join(given)} apply to a REST catalog: set catalog_uri too")
        return self

    def rest_properties(self) -> dict[str, str]:
        """The REST catalog's properties for pyiceberg, its credentials revealed only here, at the point of use."""
        properties = dict(self.catalog_properties)
        for name, secret in (("token", self.catalog_token), ("credential", self.catalog_credential)):
            if secret is not None:
                properties[name] = secret.get_secret_value()
        return properties


# Settings of [table] that mean nothing to the SQL catalog: given without catalog_uri they are a mistake.
_REST_ONLY = ("catalog_properties", "catalog_token", "catalog_credential", "location")


class IndexSettings(_Section):
    """The key index the archiver writes: RocketMQ IndexFiles (items as maxIndexNum, slots as maxHashSlotNum)."""

    section: ClassVar[str] = "index"

    index_max_items: int = Field(
        default=20_000_000, ge=1, description="items (keys) of each archived key-index file (RocketMQ's maxIndexNum)"
    )
    index_slot_count: int = Field(default=5_000_000, ge=1, description="hash slots of each archived key-index file")
    index_seal_interval: float = Field(
        default=3600.0,
        gt=0,
        description="seconds after which a key-index file is sealed and uploaded even if not full: "
        "readers elsewhere find its keys once uploaded",
    )


class TieredStoreConfig(BaseSettings):
    """Everything tieredstore reads from its environment. Immutable once loaded."""

    model_config = SettingsConfigDict(
        env_prefix="TIEREDSTORE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    data_dir: Path = Field(
        default=DEFAULT_DATA_DIR,
        description="tieredstore's own files: SQLite metadata, key-index files, the default hot store and cold dir",
    )
    hot_dir: Path = Field(
        default_factory=lambda values: values.get("data_dir", DEFAULT_DATA_DIR) / "hot",
        description="the hot store: default <data_dir>/hot; a RocketMQ broker's storePathRootDir to archive "
        "that broker (tieredstore run --hot-mode follower)",
    )
    metadata_url: str | None = Field(
        default=None,
        description="the metadata database: sqlite:///… or postgresql+psycopg://… (needed to run several "
        "archivers); default: sqlite:///<data_dir>/metadata.db",
    )
    cold_url: str | None = Field(
        default=None,
        description="where the archive goes: a directory, s3://bucket/prefix or another fsspec URL; "
        "default: <data_dir>/cold (POSIX)",
    )
    cluster: str = Field(default="DefaultCluster", description="the RocketMQ cluster name the cold paths are under")
    broker: str = Field(default="broker-a", description="the broker name the cold paths are under; one per hot store")
    default_reserve_hours: float = Field(
        default=72,
        ge=0,
        description="hours key-index files are kept at least, however short every topic's retention",
    )
    s3: S3Settings = S3Settings()
    hot: HotSettings = HotSettings()
    segments: SegmentSettings = SegmentSettings()
    archiver: ArchiverSettings = ArchiverSettings()
    read: ReadSettings = ReadSettings()
    index: IndexSettings = IndexSettings()
    cold: ColdSettings = ColdSettings()
    encryption: EncryptionSettings = EncryptionSettings()
    table: TableSettings = TableSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init) beat the environment, which beats the file (passed in as defaults by load_config).
        return (init_settings, env_settings)

    @pydantic.field_validator("data_dir", "hot_dir")
    @classmethod
    def _expand_home(cls, value: Path) -> Path:
        # "~/x" in a TOML file or a variable means the home directory, as it does typed in a shell.
        return _home_expanded(value)

    @pydantic.field_validator("cold_url")
    @classmethod
    def _expand_home_in_a_path(cls, value: str | None) -> str | None:
        if value is None or not value.startswith("~"):
            return value  # a URL, or a path without ~
        return str(_home_expanded(Path(value)))

    @pydantic.model_validator(mode="after")
    def _keep_data_dir_out_of_hot_dir(self) -> TieredStoreConfig:
        # data_dir gets tieredstore's own index/, database and cold files: inside a broker's store they
        # would be written among (or, for index/, into) the files a follower promises never to touch.
        hot, data = self.hot_dir.resolve(), self.data_dir.resolve()
        if data == hot or hot in data.parents:
            raise ValueError(f"data_dir {self.data_dir} must not be hot_dir {self.hot_dir} or inside it")
        return self

    @property
    def effective_metadata_url(self) -> str:
        return self.metadata_url or f"sqlite:///{(self.data_dir / 'metadata.db').resolve()}"

    @property
    def effective_cold_url(self) -> str:
        return self.cold_url or str((self.data_dir / "cold").resolve())

    @property
    def hot_dir_given(self) -> bool:
        """Whether ``hot_dir`` was set (file, environment or flag): a reader then needs a store there."""
        return "hot_dir" in self.model_fields_set

    def s3_options(self) -> dict[str, Any]:
        """Keyword options for an S3 provider, secrets revealed only here, at the point of use."""
        s3 = self.s3
        options: dict[str, Any] = {
            "endpoint_url": s3.endpoint_url,
            "region": s3.region,
            "addressing_style": s3.addressing_style,
            "sse": s3.sse,
            "sse_kms_key_id": s3.sse_kms_key_id,
            "max_attempts": s3.max_attempts,
            "max_pool_connections": s3.max_pool_connections,
            "conditional_writes": s3.conditional_writes,
            "storage_class": s3.storage_class,
            "index_storage_class": s3.index_storage_class,
        }
        for name in ("access_key_id", "secret_access_key", "session_token"):
            secret: SecretStr | None = getattr(s3, name)
            options[name] = secret.get_secret_value() if secret is not None else None
        return {k: v for k, v in options.items() if v is not None}


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _one_line(exc: pydantic.ValidationError, origin: str) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "config"
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        problems.append(f"{where}: {message}")
    return f"invalid configuration ({origin}): " + "; ".join(problems)


def _home_expanded(path: Path) -> Path:
    try:
        return path.expanduser()
    except RuntimeError as exc:  # ~user of no such user, or no home at all
        raise ValueError(f"cannot expand {str(path)!r}: {exc}") from exc


def load_config(path: str | Path | None = None, **flags: Any) -> TieredStoreConfig:
    """Load the file (``path``, else ``$TIEREDSTORE_CONFIG``, else none), the environment, then ``flags``.

    Flags whose value is None are ignored, so a CLI can pass every option it has. Nested flags are
    dicts (``archiver={"group_commit_count": 8}``). Any problem is one ConfigError line.
    """
    file_values: dict[str, Any] = {}
    config_path = path or os.environ.get(CONFIG_ENV)
    origin = "environment and flags"
    if config_path:
        origin = f"{config_path}, environment and flags"
        try:
            with open(config_path, "rb") as handle:
                file_values = tomllib.load(handle)
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {config_path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_path} is not valid TOML: {exc}") from exc
        except UnicodeDecodeError as exc:
            # tomllib decodes the bytes itself and lets this escape; TOML files are UTF-8 by definition.
            raise ConfigError(f"config file {config_path} is not valid TOML: not UTF-8 at byte {exc.start}") from exc
        except OSError as exc:
            raise ConfigError(f"config file {config_path} cannot be read: {exc.strerror}") from exc
    given = {k: v for k, v in flags.items() if v is not None}
    try:
        # model_validate, unlike the constructor, does not read the environment again: it is merged here.
        return TieredStoreConfig.model_validate(_merge(_merge(file_values, _environment_layer()), given))
    except pydantic.ValidationError as exc:
        raise ConfigError(_one_line(exc, origin)) from exc


def _environment_layer() -> dict[str, Any]:
    """TIEREDSTORE_* variables as nested dicts, parsed by pydantic-settings' own env source."""
    try:
        return dict(EnvSettingsSource(TieredStoreConfig)())
    except SettingsError as exc:  # a list-valued variable that is not JSON
        raise ConfigError(
            f"invalid configuration (environment): {exc}; a list is a JSON array, "
            """e.g. TIEREDSTORE_ARCHIVER__TOPICS_EXCLUDE='["test-*"]'"""
        ) from exc
