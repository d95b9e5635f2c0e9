"""Keys and codecs from the configuration: the keyring, and how each new segment is framed.

The keyring maps key ids to key-encryption keys (AES-256), read from a TOML file's ``[keys]`` table and
from an environment variable of ``id=base64`` pairs; the material never leaves this module except into a
``Keyring``, whose repr shows ids only. Every error names a key id or a file, never key material.
"""

from __future__ import annotations

import base64
import binascii
import os
import tomllib
from collections.abc import Callable
from pathlib import Path

from tieredstore.config import ColdSettings, EncryptionSettings, TieredStoreConfig
from tieredstore.errors import ConfigError
from tieredstore.formats.naming import topic_of_path
from tieredstore.providers.base import SegmentId
from tieredstore.providers.codec import (
    DATA_KEY_BYTES,
    Codecs,
    Compression,
    Keyring,
    WriteCodec,
    check_cryptography,
    check_zstandard,
)


def _material(key_id: str, text: object, origin: str) -> bytes:
    if not isinstance(text, str):
        raise ConfigError(f"key {key_id!r} in {origin} must be a base64 string")
    try:
        material = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as error:
        raise ConfigError(f"key {key_id!r} in {origin} is not valid base64") from error
    if len(material) != DATA_KEY_BYTES:
        raise ConfigError(f"key {key_id!r} in {origin} is {len(material)} bytes; AES-256 keys are {DATA_KEY_BYTES}")
    return material


def _file_keys(path: Path) -> dict[str, bytes]:
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError as error:
        raise ConfigError(f"keyring file {path} does not exist") from error
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        # The parser's message may quote the line, and the line holds a key: say where, not what.
        raise ConfigError(f"keyring file {path} is not valid TOML") from error
    except OSError as error:
        raise ConfigError(f"keyring file {path} cannot be read: {error.strerror}") from error
    table = document.get("keys")
    if not isinstance(table, dict):
        raise ConfigError(f"keyring file {path} has no [keys] table of key id = base64 key")
    return {str(key_id): _material(str(key_id), text, f"keyring file {path}") for key_id, text in table.items()}


def _environment_keys(name: str) -> dict[str, bytes]:
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(f"encryption.keyring_env names ${name}, which is not set")
    keys: dict[str, bytes] = {}
    for pair in filter(None, (part.strip() for part in value.split(","))):
        key_id, separator, text = pair.partition("=")
        if not separator or not key_id.strip():
            raise ConfigError(f"${name} must hold id=base64 pairs separated by commas")
        keys[key_id.strip()] = _material(key_id.strip(), text, f"${name}")
    return keys


def load_keyring(settings: EncryptionSettings) -> Keyring:
    """The keyring the settings name (the environment's keys win over the file's of the same id)."""
    keys: dict[str, bytes] = {}
    if settings.keyring_file is not None:
        keys.update(_file_keys(settings.keyring_file))
    if settings.keyring_env is not None:
        keys.update(_environment_keys(settings.keyring_env))
    if settings.active_key is not None and settings.active_key not in keys:
        raise ConfigError(
            f"encryption.active_key {settings.active_key!r} is not in the keyring"
            + (f" (it holds {', '.join(sorted(keys))})" if keys else ": set encryption.keyring_file or keyring_env")
        )
    return Keyring(keys, settings.active_key)


def write_policy(cold: ColdSettings, encrypt: bool) -> Callable[[SegmentId], WriteCodec | None]:
    """How each new segment is framed: its topic's compression (the key index takes the default)."""

    def policy(segment: SegmentId) -> WriteCodec | None:
        topic = topic_of_path(segment.path)
        compression = cold.topic_compression.get(topic, cold.compression) if topic else cold.compression
        codec = WriteCodec(compression, cold.compression_level, encrypt)
        return codec if codec.framed else None

    return policy


def cold_codecs(config: TieredStoreConfig) -> Codecs:
    """The codecs of the configured cold tier; the optional libraries they need are checked here, at start."""
    keyring = load_keyring(config.encryption)
    cold = config.cold
    compressions = {cold.compression, *cold.topic_compression.values()}
    if Compression.ZSTD in compressions:
        check_zstandard()
    if keyring.ids:
        check_cryptography()
    return Codecs(keyring, write_policy(cold, encrypt=keyring.active is not None))
