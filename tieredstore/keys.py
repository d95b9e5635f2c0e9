"""Keys and codecs: the keyring the configuration names, how each new segment is framed, and which key
wraps what.

The keyring maps key ids to key-encryption keys (AES-256), read from a TOML file's ``[keys]`` table and
from an environment variable of ``id=base64`` pairs; the material never leaves this module except into a
``Keyring``, whose repr shows ids only. Every error names a key id or a file, never key material. Ids
listed in ``kms_keys`` are AWS KMS keys instead, reached with the ``[s3]`` settings (``providers.kms``).

Metadata records which key id wraps each live segment's and uploaded index file's data key
(``key_id``): ``key_usage`` counts them, ``require_keys`` refuses an archiver whose keyring lacks one,
and ``rotate_keys`` re-wraps them under another key without rewriting any data.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import os
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tieredstore.config import ColdSettings, EncryptionSettings, TieredStoreConfig
from tieredstore.errors import ConfigError, NotFoundError
from tieredstore.formats.naming import FileType, topic_of_path
from tieredstore.metadata import (
    LIVE_SEGMENT_STATUSES,
    IndexFileRecord,
    IndexFileStatus,
    MetadataStore,
    SegmentUpdate,
)
from tieredstore.providers.base import Provider, SegmentId
from tieredstore.providers.codec import (
    DATA_KEY_BYTES,
    Codecs,
    Compression,
    Keyring,
    WriteCodec,
    check_cryptography,
    check_zstandard,
)
from tieredstore.providers.kms import KmsKeys, check_botocore
from tieredstore.providers.s3_options import S3Options


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


def load_keyring(settings: EncryptionSettings, s3: S3Options | None = None) -> Keyring:
    """The keyring the settings name (the environment's keys win over the file's of the same id); its KMS
    keys, if any, are reached as ``s3`` says (endpoint, region, credentials), else by botocore's defaults."""
    keys: dict[str, bytes] = {}
    if settings.keyring_file is not None:
        keys.update(_file_keys(settings.keyring_file))
    if settings.keyring_env is not None:
        keys.update(_environment_keys(settings.keyring_env))
    ids = sorted({*keys, *settings.kms_keys})
    if settings.active_key is not None and settings.active_key not in ids:
        raise ConfigError(
            f"encryption.active_key {settings.active_key!r} is not in the keyring"
            + (f" (it holds {', '.join(ids)})" if ids else ": set encryption.keyring_file, keyring_env or kms_keys")
        )
    kms = KmsKeys(settings.kms_keys, s3) if settings.kms_keys else None
    return Keyring(keys, settings.active_key, kms)


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
    keyring = load_keyring(config.encryption, S3Options(**config.s3_options()))
    cold = config.cold
    compressions = {cold.compression, *cold.topic_compression.values()}
    if Compression.ZSTD in compressions:
        check_zstandard()
    if keyring.ids:
        check_cryptography()
    if keyring.kms_ids:
        check_botocore()
    return Codecs(keyring, write_policy(cold, encrypt=keyring.active is not None))


# ---- which key wraps what ------------------------------------------------------------------------------

# How many segment keys an error names before it says how many more there are.
NAMED_IN_ERRORS = 3


@dataclass(frozen=True, slots=True)
class WrappedFile:
    """A live encrypted segment or uploaded index file as metadata records it: the key id wrapping its data key."""

    segment_id: SegmentId
    key_id: str
    index_file: str | None = None  # the index-file row's name; None for a segment row


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """One key id: whether the keyring holds it, whether it is active, and how many live files it wraps."""

    key_id: str
    in_keyring: bool
    active: bool
    segments: int
    index_files: int


def _uploaded_index_files(metadata: MetadataStore) -> list[IndexFileRecord]:
    return [row for row in metadata.list_index_files(statuses=[IndexFileStatus.UPLOAD]) if row.key_id is not None]


def _index_segment_id(name: str) -> SegmentId:
    # An index file's row is named <index path>/<20-digit file id>, its object is that INDEX segment.
    path, _, file_id = name.rpartition("/")
    return SegmentId(FileType.INDEX, path, int(file_id))


def wrapped_files(metadata: MetadataStore, outside: Iterable[str]) -> list[WrappedFile]:
    """Every live encrypted segment and uploaded index file whose data key a key not in ``outside`` wraps."""
    known = set(outside)
    files = [
        WrappedFile(SegmentId(FileType(row.file_type.value), row.path, row.base_offset), row.key_id)
        for row in metadata.list_segments_wrapped_outside(known)
        if row.key_id is not None
    ]
    files.extend(
        WrappedFile(_index_segment_id(row.name), row.key_id, row.name)
        for row in _uploaded_index_files(metadata)
        if row.key_id is not None and row.key_id not in known
    )
    return files


def key_usage(keyring: Keyring, metadata: MetadataStore) -> list[KeyUsage]:
    """Each key id of the keyring or of metadata, by id, with how many live files it wraps."""
    segments = metadata.count_segments_by_key()
    index_files = Counter(row.key_id for row in _uploaded_index_files(metadata) if row.key_id is not None)
    ids = sorted({*keyring.ids, *segments, *index_files})
    return [
        KeyUsage(key_id, key_id in keyring, key_id == keyring.active, segments.get(key_id, 0), index_files[key_id])
        for key_id in ids
    ]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def require_keys(keyring: Keyring, metadata: MetadataStore) -> None:
    """ConfigError, in one line, when a live segment or uploaded index file is wrapped by a key the keyring
    lacks: an archiver started so would fail on its first read or recovery of one of them."""
    missing = wrapped_files(metadata, keyring.ids)
    if not missing:
        return
    segments = sum(1 for file in missing if file.index_file is None)
    named = ", ".join(file.segment_id.key for file in missing[:NAMED_IN_ERRORS])
    more = f" and {len(missing) - NAMED_IN_ERRORS} more" if len(missing) > NAMED_IN_ERRORS else ""
    key_ids = sorted({file.key_id for file in missing})
    keys = f"key {key_ids[0]}, which wraps" if len(key_ids) == 1 else f"keys {', '.join(key_ids)}, which wrap"
    raise ConfigError(
        f"the keyring lacks {keys} {_plural(segments, 'live segment')} and "
        f"{_plural(len(missing) - segments, 'uploaded index file')} ({named}{more}): add "
        f"{'it' if len(key_ids) == 1 else 'them'} to encryption.keyring_file or keyring_env "
        "(see docs/operations/keys.md)"
    )


@dataclass
class RotationReport:
    """What ``rotate_keys`` did: files re-wrapped under ``key_id``, and files with nothing to re-wrap (started
    but not written yet, or removed by retention meanwhile)."""

    key_id: str
    segments: int = 0
    index_files: int = 0
    not_stored: int = 0
    seconds: float = 0.0


Progress = Callable[[int, int], None]


def rotation_target(keyring: Keyring, key_id: str | None) -> str:
    """The key a rotation wraps under: ``key_id``, else the active key; ConfigError unless the keyring holds it."""
    target = key_id or keyring.active
    if target is None:
        raise ConfigError("no key to rotate to: give --to ID or set encryption.active_key")
    if target not in keyring:
        holds = ", ".join(keyring.ids) or "no key"
        raise ConfigError(f"key {target!r} is not in the keyring (it holds {holds}): nothing was re-wrapped")
    return target


async def rotate_keys(
    provider: Provider,
    metadata: MetadataStore,
    *,
    key_id: str | None = None,
    progress: Progress | None = None,
    concurrency: int = 16,
) -> RotationReport:
    """Re-wrap every live encrypted segment's and uploaded index file's data key under ``key_id`` (the
    keyring's active key by default), replacing only their ``.codec`` objects, and record it in metadata.

    Files already under it are not touched, so a rotation cut short is finished by running it again. Safe
    beside a running archiver, which writes only new segments' descriptors. ``progress`` is told (files
    done, files in all) as each file is re-wrapped.
    """
    started = time.perf_counter()
    keyring = provider.codecs.keyring
    target = rotation_target(keyring, key_id)
    files = await asyncio.to_thread(wrapped_files, metadata, [target])
    report = RotationReport(target)
    limit = asyncio.Semaphore(concurrency)
    done = 0

    async def one(file: WrappedFile) -> None:
        nonlocal done
        async with limit:
            sid = file.segment_id
            # Checked again just before: retention may have removed it since the listing, and a descriptor
            # written after that would be left behind in storage.
            if not await asyncio.to_thread(_still_live, metadata, file):
                wrapped: str | None = None
            else:
                wrapped = await provider.segment(sid.file_type, sid.path, sid.base_offset).rewrap(keyring, target)
            if wrapped is None:
                report.not_stored += 1  # started, nothing written yet: its first commit wraps under the active key
            else:
                await asyncio.to_thread(_record_key_id, metadata, file, wrapped)
                if file.index_file is None:
                    report.segments += 1
                else:
                    report.index_files += 1
        done += 1
        if progress is not None:
            progress(done, len(files))

    tasks = [asyncio.ensure_future(one(file)) for file in files]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        # The first failure is the one reported, as it is (not in a group); the rest stop with it.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    report.seconds = time.perf_counter() - started
    return report


def _still_live(metadata: MetadataStore, file: WrappedFile) -> bool:
    try:
        if file.index_file is not None:
            return metadata.get_index_file(file.index_file).status is IndexFileStatus.UPLOAD
        sid = file.segment_id
        return metadata.get_segment(sid.path, sid.file_type.value, sid.base_offset).status in LIVE_SEGMENT_STATUSES
    except NotFoundError:
        return False


def _record_key_id(metadata: MetadataStore, file: WrappedFile, key_id: str) -> None:
    # A row removed meanwhile (retention, orphan removal) has nothing left to record.
    with contextlib.suppress(NotFoundError):
        if file.index_file is not None:
            metadata.update_index_file(file.index_file, key_id=key_id)
        else:
            sid = file.segment_id
            metadata.update_segment(SegmentUpdate(sid.path, sid.file_type.value, sid.base_offset, key_id=key_id))
