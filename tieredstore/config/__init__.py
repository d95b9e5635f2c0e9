"""Configuration: a TOML file, then ``TIEREDSTORE_*`` environment variables, then flags; frozen after load.

Every knob of DESIGN.md has one field here with its default. Nested sections map to TOML tables and
to environment variables with a double underscore: ``[archiver] group_commit_count = 8`` is the
same as ``TIEREDSTORE_ARCHIVER__GROUP_COMMIT_COUNT=8``. Unknown keys are errors, not silently ignored.
"""

from tieredstore.config.archiver import ArchiverSettings, IndexSettings
from tieredstore.config.cold import ColdSettings, EncryptionSettings, S3Settings, SegmentSettings
from tieredstore.config.hot import HotSettings
from tieredstore.config.read import ReadPolicy, ReadSettings
from tieredstore.config.root import CONFIG_ENV, DEFAULT_DATA_DIR, TieredStoreConfig, load_config
from tieredstore.config.table import TableSettings

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_DATA_DIR",
    "ArchiverSettings",
    "ColdSettings",
    "EncryptionSettings",
    "HotSettings",
    "IndexSettings",
    "ReadPolicy",
    "ReadSettings",
    "S3Settings",
    "SegmentSettings",
    "TableSettings",
    "TieredStoreConfig",
    "load_config",
]
