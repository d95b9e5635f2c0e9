"""The whole configuration, TieredStoreConfig, and load_config: the file, then the environment, then flags."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import pydantic
from pydantic import Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from tieredstore.config.archiver import ArchiverSettings, IndexSettings
from tieredstore.config.cold import ColdSettings, EncryptionSettings, S3Settings, SegmentSettings
from tieredstore.config.hot import HotSettings
from tieredstore.config.read import ReadSettings
from tieredstore.config.section import home_expanded
from tieredstore.config.table import TableSettings
from tieredstore.errors import ConfigError

DEFAULT_DATA_DIR = Path("tieredstore-data")
CONFIG_ENV = "TIEREDSTORE_CONFIG"


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
        return home_expanded(value)

    @pydantic.field_validator("cold_url")
    @classmethod
    def _expand_home_in_a_path(cls, value: str | None) -> str | None:
        if value is None or not value.startswith("~"):
            return value  # a URL, or a path without ~
        return str(home_expanded(Path(value)))

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
