"""The frame decoder and the ``.codec`` descriptor parser fed random and mutated bytes (the decoder
fuzzing of ``test_fuzz_decoders.py``, for framed segments): only IntegrityError or DecryptionError,
never another exception type, never bytes other than the ones framed.

An encrypted frame is authenticated whole (GCM over the payload, its header as associated data); a
compressed one is covered by zstd's content checksum and the logical length in its header. A few
zstd header bits change no content, so a mutated frame may still decode, but only to the original.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.reliability.test_fuzz_decoders import FUZZ, flip
from tieredstore.errors import DecryptionError, IntegrityError
from tieredstore.providers.codec import (
    HEADER,
    MAGIC,
    Compression,
    Keyring,
    SegmentFormat,
    WriteCodec,
    descriptor_key_id,
    new_format,
    parse_descriptor,
)

pytestmark = pytest.mark.timeout(120)

WHERE = "cluster/broker/Topic/0/COMMIT_LOG/cfcd208400000000000000000000"
KEYRING = Keyring({"k1": bytes(range(32)), "k2": bytes(range(1, 33))}, active="k1")
ENCRYPTED = new_format(WriteCodec(Compression.ZSTD, 3, encrypt=True), KEYRING)
SEALED_ONLY = new_format(WriteCodec(Compression.NONE, 3, encrypt=True), KEYRING)
COMPRESSED = SegmentFormat(Compression.ZSTD)
FORMATS = {"zstd+aes": ENCRYPTED, "aes": SEALED_ONLY, "zstd": COMPRESSED}
formats = st.sampled_from(sorted(FORMATS))
# Text compresses into real zstd blocks; random bytes into raw ones: both kinds get mutated.
contents = st.one_of(st.binary(max_size=300), st.text("ab xyz\n", max_size=400).map(str.encode))


def decodes_to_nothing_else(fmt: SegmentFormat, frame: bytes, original: bytes | None, start: int = 0) -> None:
    """Decoding ``frame`` gives ``original`` or raises IntegrityError (DecryptionError included)."""
    try:
        decoded = fmt.decode(frame, WHERE, start)
    except IntegrityError:
        return
    assert original is not None and decoded == original


@FUZZ
@given(formats, st.binary(max_size=400))
@example("zstd", HEADER.pack(MAGIC, 1, 1, 0, 1 << 63, bytes(12)) + b"\x28\xb5\x2f\xfd")
# zstd frames that do not record their content size, whose header claims a huge or the right length
@example("zstd", HEADER.pack(MAGIC, 1, 1, 0, 1 << 40, bytes(12)) + bytes.fromhex("28b52ffd000029000068656c6c6f"))
@example("zstd", HEADER.pack(MAGIC, 1, 1, 0, 5, bytes(12)) + bytes.fromhex("28b52ffd000029000068656c6c6f"))
@example("aes", HEADER.pack(MAGIC, 1, 2, 0, 0, bytes(12)) + bytes(16))
def test_random_bytes_never_decode_as_a_frame(name: str, data: bytes) -> None:
    decodes_to_nothing_else(FORMATS[name], data, None)


@FUZZ
@given(formats, st.binary(max_size=300), st.binary(max_size=300))
def test_a_valid_header_over_a_random_payload_never_decodes(name: str, content: bytes, random_payload: bytes) -> None:
    fmt = FORMATS[name]
    frame = fmt.encode(content, WHERE, 0)
    forged = frame[: HEADER.size] + random_payload
    decodes_to_nothing_else(fmt, forged, content if forged == frame else None)


@FUZZ
@given(formats, contents, st.integers(0, 2**40), st.data())
def test_a_mutated_frame_is_refused_or_decodes_to_its_original_bytes(
    name: str, content: bytes, start: int, data: st.DataObject
) -> None:
    fmt = FORMATS[name]
    frame = fmt.encode(content, WHERE, start)
    assert fmt.decode(frame, WHERE, start) == content
    mutation = data.draw(st.sampled_from(["flip", "flips", "cut", "extend", "splice"]))
    if mutation == "flip":
        mutated = flip(frame, data.draw(st.integers(0, len(frame) * 8 - 1)))
    elif mutation == "flips":
        mutated = frame
        for bit in data.draw(st.lists(st.integers(0, len(frame) * 8 - 1), min_size=2, max_size=8)):
            mutated = flip(mutated, bit)
    elif mutation == "cut":
        mutated = frame[: data.draw(st.integers(0, len(frame) - 1))]
    elif mutation == "extend":
        mutated = frame + data.draw(st.binary(min_size=1, max_size=16))
    else:
        at = data.draw(st.integers(0, len(frame)))
        mutated = frame[:at] + data.draw(st.binary(max_size=16)) + frame[at + 1 :]
    decodes_to_nothing_else(fmt, mutated, content, start)
    if fmt.data_key is not None and mutated != frame:
        with pytest.raises(IntegrityError):  # GCM: no changed byte of an encrypted frame passes
            fmt.decode(mutated, WHERE, start)


@FUZZ
@given(st.binary(max_size=300))
@example(b"[" * 100_000)
@example(b'{"format": 1, "compression": "zstd", "encryption": {"key_id": "k1", "wrapped_key": "AAAA"}}')
@example(b'{"format": 1, "compression": "zstd", "encryption": []}')
@example(b'{"format": 1, "compression": ["zstd"]}')
def test_random_descriptors_are_refused_with_typed_errors(data: bytes) -> None:
    try:
        parsed = parse_descriptor(data, KEYRING, WHERE)
    except IntegrityError:
        pass
    else:
        assert parsed.compression in set(Compression)
    key_id = descriptor_key_id(data)
    assert key_id is None or isinstance(key_id, str)


@FUZZ
@given(st.data())
def test_a_mutated_descriptor_is_refused_or_gives_the_same_data_key(data: st.DataObject) -> None:
    fmt = data.draw(st.sampled_from([ENCRYPTED, SEALED_ONLY, COMPRESSED]))
    descriptor = fmt.descriptor()
    mutated = flip(descriptor, data.draw(st.integers(0, len(descriptor) * 8 - 1)))
    try:
        parsed = parse_descriptor(mutated, KEYRING, WHERE)
    except IntegrityError:
        return
    # A flip that still parses (JSON's insignificant bits, such as a key name's case) keeps the data key
    # or leaves the segment unencrypted, whose frames then fail to decrypt: never another key's bytes.
    assert parsed.data_key in (fmt.data_key, None)
    if parsed.data_key is None and fmt.data_key is not None:
        with pytest.raises(DecryptionError):
            parsed.decode(fmt.encode(b"bytes", WHERE, 0), WHERE, 0)


def test_a_descriptor_naming_an_unknown_version_or_key_is_refused() -> None:
    body = json.loads(ENCRYPTED.descriptor())
    for changed in ({"format": 2}, {"compression": "lz4"}, {"encryption": {"key_id": "k9", "wrapped_key": ""}}):
        with pytest.raises(IntegrityError):
            parse_descriptor(json.dumps(body | changed).encode(), KEYRING, WHERE)
