"""Compressed and encrypted frames: how a cold segment stores its bytes when a codec is on.

A framed segment is a folder (on every provider, POSIX included) holding a descriptor object ``.codec``
and chunk objects named by their *logical* start, each one frame of the bytes one commit wrote:

    magic b"\\xf5TSF" (4) · version 1 (1) · flags (1) · reserved (2) · logical length (8, big-endian)
    · nonce (12; zeros without encryption) · payload

The payload is the commit's bytes, zstd-compressed (with zstd's content checksum) when flag 1 is set, then
AES-256-GCM-sealed under the segment's data key when flag 2 is set; the header, the segment key and the
chunk's start are the associated data, so a frame moved to another place fails authentication. Positions
stay logical: the consume queue, PHYSICALOFFSET and every API keep speaking of uncompressed bytes.

The first byte 0xf5 cannot start an unframed chunk (a record's TOTALSIZE, a consume-queue offset and an
index file's first timestamp are all non-negative), so a reader that finds it knows what it holds.

``.codec`` is JSON: the compression and, for an encrypted segment, the id of the key-encryption key and the
data key it wraps (RFC 3394 key wrap under a local key, or an AWS KMS ``Encrypt`` blob: ``providers.kms``).
Re-wrapping a data key under another key-encryption key replaces this one small object and leaves the data
as it is.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import json
import os
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tieredstore.errors import (
    ConfigError,
    DecryptionError,
    IntegrityError,
    MissingExtraError,
    MissingKeyError,
    WrongKeyError,
)

if TYPE_CHECKING:
    # Types only: base imports this module for Codecs.
    from tieredstore.providers.base import SegmentId
    from tieredstore.providers.kms import KmsKeys

MAGIC = b"\xf5TSF"
VERSION = 1
HEADER = struct.Struct(">4sBBH Q 12s")
HEADER_SIZE = HEADER.size
DESCRIPTOR_NAME = ".codec"
DATA_KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12
TAG_BYTES = 16
# A frame holds at most this many logical bytes: the default group commit is one frame, and a read never
# has to fetch and decode more than this to serve a few bytes.
MAX_FRAME = 4 * 1024 * 1024

# Frames at least this large are encoded and decoded in a worker thread; smaller ones cost less than the hand-off.
OFFLOAD_BYTES = 64 * 1024

_ZSTD = 1
_AES_GCM = 2
_KNOWN_FLAGS = _ZSTD | _AES_GCM


class Compression(enum.StrEnum):
    NONE = "none"
    ZSTD = "zstd"


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError as error:
        raise MissingExtraError(
            "zstd frames need the zstandard package: pip install 'tieredstore[compression]'"
        ) from error
    return zstandard


def _aead() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers import aead
    except ImportError as error:
        raise MissingExtraError(
            "encrypted frames need the cryptography package: pip install 'tieredstore[encryption]'"
        ) from error
    return aead


def _keywrap() -> Any:
    try:
        from cryptography.hazmat.primitives import keywrap
    except ImportError as error:
        raise MissingExtraError(
            "encrypted segments need the cryptography package: pip install 'tieredstore[encryption]'"
        ) from error
    return keywrap


def check_zstandard() -> None:
    """MissingExtraError now, rather than at the first commit, when zstd frames cannot be written."""
    _zstandard()


def check_cryptography() -> None:
    """MissingExtraError now, rather than at the first read, when frames cannot be sealed or opened."""
    _aead()
    _keywrap()


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A segment's data key as stored: wrapped under the key-encryption key ``key_id``."""

    key_id: str
    wrapped: bytes = field(repr=False)


class Keyring:
    """Key-encryption keys by id, and which one wraps new data keys. Never shows key material.

    A key is local (32 bytes of AES-256, RFC 3394 key wrap) or, through ``kms``, an AWS KMS key; the wrapped
    data key is stored the same way for both, so rotation moves segments between them either way. A KMS key
    makes a network call: wrap and unwrap only from worker threads.
    """

    def __init__(
        self, keys: Mapping[str, bytes] | None = None, active: str | None = None, kms: KmsKeys | None = None
    ) -> None:
        self._keys = dict(keys or {})
        self._kms = kms
        for key_id, material in self._keys.items():
            if not key_id or len(material) != DATA_KEY_BYTES:
                raise ConfigError(f"key {key_id!r} of the keyring must be {DATA_KEY_BYTES} bytes (AES-256)")
            if kms is not None and key_id in kms:
                raise ConfigError(f"key {key_id!r} is both a local key and a KMS key: give it one of them")
        if active is not None and active not in self:
            raise ConfigError(f"the active key {active!r} is not in the keyring (it holds {self.ids or 'no key'})")
        self.active = active

    @property
    def ids(self) -> list[str]:
        return sorted([*self._keys, *(self._kms.ids if self._kms is not None else [])])

    @property
    def kms_ids(self) -> list[str]:
        return self._kms.ids if self._kms is not None else []

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys or (self._kms is not None and key_id in self._kms)

    def __repr__(self) -> str:
        return f"Keyring(ids={self.ids!r}, active={self.active!r}, kms={self.kms_ids!r})"

    def wrap(self, data_key: bytes, key_id: str | None = None, where: str = "a new data key") -> WrappedKey:
        """``data_key`` wrapped under ``key_id`` (the active key by default)."""
        chosen = key_id or self.active
        if chosen is None:
            raise ConfigError("no active key-encryption key: set [encryption] active_key")
        if self._kms is not None and chosen in self._kms:
            return WrappedKey(chosen, self._kms.wrap(chosen, data_key, where))
        if chosen not in self._keys:
            raise MissingKeyError(f"the keyring holds no key {chosen!r}")
        return WrappedKey(chosen, _keywrap().aes_key_wrap(self._keys[chosen], data_key))

    def unwrap(self, wrapped: WrappedKey, where: str) -> bytes:
        if self._kms is not None and wrapped.key_id in self._kms:
            return self._kms.unwrap(wrapped.key_id, wrapped.wrapped, where)
        material = self._keys.get(wrapped.key_id)
        if material is None:
            raise MissingKeyError(
                f"{where}: its data key is wrapped by key {wrapped.key_id!r}, which the keyring does not hold"
            )
        keywrap = _keywrap()
        try:
            return bytes(keywrap.aes_key_unwrap(material, wrapped.wrapped))
        except keywrap.InvalidUnwrap as error:
            raise WrongKeyError(f"{where}: key {wrapped.key_id!r} does not unwrap its data key (wrong key)") from error


@dataclass(frozen=True, slots=True)
class WriteCodec:
    """How new framed segments are written: the compression, its level, and whether to encrypt."""

    compression: Compression = Compression.ZSTD
    level: int = 3
    encrypt: bool = False

    @property
    def framed(self) -> bool:
        return self.compression is not Compression.NONE or self.encrypt


@dataclass(frozen=True, slots=True)
class SegmentFormat:
    """What one framed segment's ``.codec`` says, with its data key unwrapped (when it has one)."""

    compression: Compression
    wrapped_key: WrappedKey | None = None
    data_key: bytes | None = field(default=None, repr=False)
    level: int = 3

    def descriptor(self) -> bytes:
        body: dict[str, Any] = {"format": VERSION, "compression": self.compression.value}
        if self.wrapped_key is not None:
            body["encryption"] = {
                "algorithm": "AES-256-GCM",
                "key_id": self.wrapped_key.key_id,
                "wrapped_key": base64.b64encode(self.wrapped_key.wrapped).decode(),
            }
        return json.dumps(body, sort_keys=True).encode()

    def rewrapped(self, keyring: Keyring, key_id: str | None = None, where: str = "a data key") -> SegmentFormat:
        """The same format with its data key wrapped under ``key_id`` (the active key by default)."""
        if self.data_key is None:
            return self
        wrapped = keyring.wrap(self.data_key, key_id, where)
        return SegmentFormat(self.compression, wrapped, self.data_key, self.level)

    def encode(self, data: bytes | bytearray | memoryview, where: str, start: int) -> bytes:
        flags = 0
        payload: bytes | bytearray | memoryview = data
        if self.compression is Compression.ZSTD:
            flags |= _ZSTD
            payload = _compressor(self.level).compress(data)
        nonce = bytes(NONCE_BYTES)
        if self.data_key is not None:
            flags |= _AES_GCM
            nonce = os.urandom(NONCE_BYTES)
        header = HEADER.pack(MAGIC, VERSION, flags, 0, len(data), nonce)
        if self.data_key is not None:
            aad = _associated_data(header, where, start)
            payload = _aead().AESGCM(self.data_key).encrypt(nonce, bytes(payload), aad)
        return header + payload

    async def encode_async(self, data: bytes | bytearray | memoryview, where: str, start: int) -> bytes:
        """``encode`` in a worker thread for a large frame: zstd and AES-GCM run there without the GIL,
        and the event loop keeps serving other queues meanwhile."""
        if len(data) < OFFLOAD_BYTES:
            return self.encode(data, where, start)
        return await asyncio.to_thread(self.encode, data, where, start)

    async def decode_async(self, frame: bytes, where: str, start: int) -> bytes:
        """``decode`` in a worker thread for a large frame (see ``encode_async``)."""
        if len(frame) < OFFLOAD_BYTES:
            return self.decode(frame, where, start)
        return await asyncio.to_thread(self.decode, frame, where, start)

    def decode(self, frame: bytes, where: str, start: int) -> bytes:
        """The logical bytes of one stored frame; IntegrityError or DecryptionError, never wrong bytes."""
        length, flags, nonce = read_header(frame, where)
        payload: bytes = frame[HEADER_SIZE:]
        if flags & _AES_GCM:
            if self.data_key is None:
                raise DecryptionError(f"{where}: an encrypted frame in a segment without a data key")
            aead = _aead()
            try:
                payload = aead.AESGCM(self.data_key).decrypt(
                    nonce, payload, _associated_data(frame[:HEADER_SIZE], where, start)
                )
            except Exception as error:  # cryptography's InvalidTag: changed bytes or another key
                raise DecryptionError(
                    f"{where}: frame at {start} fails authentication (changed bytes or wrong key)"
                ) from error
        elif self.data_key is not None:
            raise DecryptionError(f"{where}: an unencrypted frame at {start} in an encrypted segment")
        if flags & _ZSTD:
            zstandard = _zstandard()
            try:
                # Every frame records its content size; one without it would be decompressed into a
                # buffer of whatever size the header claims.
                if zstandard.frame_content_size(payload) != length:
                    raise IntegrityError(f"{where}: frame at {start} does not record its {length} bytes")
                payload = zstandard.ZstdDecompressor().decompress(payload, max_output_size=length)
            except zstandard.ZstdError as error:
                raise IntegrityError(f"{where}: frame at {start} does not decompress: {error}") from error
        if len(payload) != length:
            raise IntegrityError(f"{where}: frame at {start} holds {len(payload)} bytes, its header says {length}")
        return payload


_compressors = threading.local()


def _compressor(level: int) -> Any:
    # One compressor per level and thread: a zstd compression context is not safe to share between the
    # worker threads that encode frames at once, and building one for each frame allocates it anew.
    by_level: dict[int, Any] | None = getattr(_compressors, "by_level", None)
    if by_level is None:
        by_level = _compressors.by_level = {}
    compressor = by_level.get(level)
    if compressor is None:
        compressor = by_level[level] = _zstandard().ZstdCompressor(level=level, write_checksum=True)
    return compressor


def _associated_data(header: bytes, where: str, start: int) -> bytes:
    return header + where.encode() + start.to_bytes(8, "big")


def is_frame(data: bytes) -> bool:
    return data[:4] == MAGIC


def read_header(frame: bytes, where: str) -> tuple[int, int, bytes]:
    """A frame's logical length, flags and nonce; IntegrityError when ``frame`` does not start with a header."""
    if len(frame) < HEADER_SIZE:
        raise IntegrityError(f"{where}: a frame of {len(frame)} bytes is shorter than its header")
    magic, version, flags, reserved, length, nonce = HEADER.unpack_from(frame)
    if magic != MAGIC:
        raise IntegrityError(f"{where}: a chunk of a framed segment does not start with a frame header")
    if version != VERSION or flags & ~_KNOWN_FLAGS or reserved:
        raise IntegrityError(
            f"{where}: frame version {version} flags {flags:#x} reserved {reserved:#x} are unknown to this version"
        )
    # Checked because no checksum covers them without encryption: a changed bit there is damage too.
    if not flags & _AES_GCM and nonce != bytes(NONCE_BYTES):
        raise IntegrityError(f"{where}: an unencrypted frame with a nonce")
    # No frame is written longer; trusting a damaged length would size zstd's output buffer by it.
    if length > MAX_FRAME:
        raise IntegrityError(f"{where}: a frame header claims {length} bytes, more than a frame holds")
    return length, flags, nonce


def new_format(codec: WriteCodec, keyring: Keyring, where: str = "a new data key") -> SegmentFormat:
    """The format of a segment about to be written with ``codec``: a fresh data key when it encrypts."""
    if not codec.encrypt:
        return SegmentFormat(codec.compression, level=codec.level)
    data_key = os.urandom(DATA_KEY_BYTES)
    return SegmentFormat(codec.compression, keyring.wrap(data_key, where=where), data_key, codec.level)


def parse_descriptor(data: bytes, keyring: Keyring, where: str) -> SegmentFormat:
    """The format a ``.codec`` object describes, its data key unwrapped through ``keyring``."""
    try:
        body = json.loads(data)
        if body["format"] != VERSION:
            raise IntegrityError(f"{where}: codec descriptor format {body['format']} is unknown to this version")
        compression = Compression(body["compression"])
        encryption = body.get("encryption")
        if encryption is None:
            return SegmentFormat(compression)
        wrapped = WrappedKey(str(encryption["key_id"]), base64.b64decode(encryption["wrapped_key"], validate=True))
    # RecursionError: JSON nested deeper than the parser's stack, which only damage produces.
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise IntegrityError(f"{where}: codec descriptor does not parse: {error}") from error
    return SegmentFormat(compression, wrapped, keyring.unwrap(wrapped, where))


def descriptor_key_id(data: bytes) -> str | None:
    """Which key-encryption key a ``.codec`` object names, without unwrapping anything."""
    try:
        encryption = json.loads(data).get("encryption")
    except (ValueError, AttributeError, RecursionError):
        return None
    return str(encryption["key_id"]) if isinstance(encryption, dict) and "key_id" in encryption else None


@dataclass
class Codecs:
    """A provider's codec settings: the keyring readers unwrap with, and what new segments are written as.

    ``policy`` says, per segment about to be written, how (None: unframed, as before codecs existed).
    """

    keyring: Keyring = field(default_factory=Keyring)
    policy: Callable[[SegmentId], WriteCodec | None] = field(default=lambda _segment: None)

    def for_segment(self, segment_id: SegmentId) -> WriteCodec | None:
        codec = self.policy(segment_id)
        return codec if codec is not None and codec.framed else None
