"""Settings of the cold tier: the S3 connection, segment sizes and rolling, compression and encryption."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

import pydantic
from pydantic import Field, SecretStr

from tieredstore.basics import GIB, MIB
from tieredstore.config.section import Section, home_expanded
from tieredstore.errors import ConfigError
from tieredstore.providers.codec import Compression
from tieredstore.providers.s3_choices import STANDARD, ConditionalWrites, check_storage_class


class S3Settings(Section):
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


class SegmentSettings(Section):
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


class ColdSettings(Section):
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


class EncryptionSettings(Section):
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
        return None if value is None else home_expanded(value)
