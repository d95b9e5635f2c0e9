"""The frame codec and the keyring, and what framed segments do at the provider level beyond the
conformance suite: frames split, retried, cut and raced, on POSIX and on S3 (moto over HTTP)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tieredstore.config import EncryptionSettings
from tieredstore.errors import (
    CommitConflictError,
    ConfigError,
    DecryptionError,
    IntegrityError,
    MissingKeyError,
    StorageUnavailableError,
)
from tieredstore.keys import load_keyring
from tieredstore.providers.base import FileSegment, Provider
from tieredstore.providers.chunked_provider import ChunkedProvider
from tieredstore.providers.chunks import ChunkedSegment, ObjectStore, chunk_name
from tieredstore.providers.codec import (
    DESCRIPTOR_NAME,
    HEADER_SIZE,
    MAX_FRAME,
    TAG_BYTES,
    Codecs,
    Compression,
    Keyring,
    SegmentFormat,
    WriteCodec,
    is_frame,
    new_format,
    parse_descriptor,
    read_header,
)
from tieredstore.providers.posix import PosixProvider
from tieredstore.providers.s3 import S3Provider
from tieredstore.providers.testing import COMMIT_LOG, QUEUE, FaultPlan, FaultyProvider, committed, payload

KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 132))
WHERE = "cluster/broker/Topic/0/COMMIT_LOG/cfcd208400000000000000000000"


def flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(out)


def encrypted(compression: Compression = Compression.ZSTD, key: bytes = KEY_A) -> SegmentFormat:
    return new_format(WriteCodec(compression, 3, encrypt=True), Keyring({"a": key}, active="a"))


def renderings(secret: bytes) -> list[str]:
    """How key material could show in text: raw, hex, base64, Python's bytes repr."""
    return [secret.decode("latin-1"), secret.hex(), base64.b64encode(secret).decode(), repr(secret)[2:-1]]


def assert_no_material(text: str, *secrets: bytes) -> None:
    for secret in secrets:
        for shown in renderings(secret):
            assert shown not in text, f"key material shown in {text!r}"


def chain_text(error: BaseException) -> str:
    """Every message of an exception and its causes, as a traceback would print them."""
    parts: list[str] = []
    current: BaseException | None = error
    while current is not None:
        parts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


# ---- frames ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("compression", "encrypt"), list(itertools.product([Compression.NONE, Compression.ZSTD], [False, True]))
)
@pytest.mark.parametrize("size", [0, 1, MAX_FRAME])
def test_every_flag_combination_round_trips_at_every_size(compression: Compression, encrypt: bool, size: int) -> None:
    fmt = new_format(WriteCodec(compression, 3, encrypt), Keyring({"a": KEY_A}, active="a"))
    data = payload(size, 7)
    frame = fmt.encode(data, WHERE, 4096)
    length, flags, _nonce = read_header(frame, WHERE)
    assert is_frame(frame) and length == size
    assert flags == (compression is Compression.ZSTD) | (2 if encrypt else 0)
    assert fmt.decode(frame, WHERE, 4096) == data
    assert asyncio.run(fmt.decode_async(frame, WHERE, 4096)) == data


def test_encryption_costs_the_header_and_the_tag_per_frame() -> None:
    assert (HEADER_SIZE, TAG_BYTES) == (28, 16)
    for size in (0, 1, 1000, MAX_FRAME):
        frame = encrypted(Compression.NONE).encode(payload(size, 1), WHERE, 0)
        assert len(frame) == size + 28 + 16


def test_a_frame_moved_to_another_start_or_segment_or_key_fails_authentication() -> None:
    fmt = encrypted()
    frame = fmt.encode(b"a commit's bytes", WHERE, 100)
    assert fmt.decode(frame, WHERE, 100) == b"a commit's bytes"
    with pytest.raises(DecryptionError, match="at 200 fails authentication"):
        fmt.decode(frame, WHERE, 200)
    with pytest.raises(DecryptionError):
        fmt.decode(frame, WHERE.replace("Topic", "Other"), 100)
    with pytest.raises(DecryptionError):  # another segment's data key, wrapped by the same key
        encrypted().decode(frame, WHERE, 100)
    with pytest.raises(DecryptionError, match="without a data key"):
        SegmentFormat(Compression.ZSTD).decode(frame, WHERE, 100)
    plain = SegmentFormat(Compression.ZSTD).encode(b"a commit's bytes", WHERE, 100)
    with pytest.raises(DecryptionError, match="unencrypted frame"):  # a frame swapped in from a plain segment
        fmt.decode(plain, WHERE, 100)


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.ZSTD])
def test_any_flipped_bit_in_an_encrypted_frame_is_refused(compression: Compression) -> None:
    fmt = encrypted(compression)
    frame = fmt.encode(payload(40, 3), WHERE, 0)
    for bit in range(len(frame) * 8):
        damaged = flip(frame, bit)
        with pytest.raises(IntegrityError) as refused:
            fmt.decode(damaged, WHERE, 0)
        try:
            read_header(damaged, WHERE)
        except IntegrityError:
            continue  # a header this version cannot read is refused before anything is decrypted
        assert isinstance(refused.value, DecryptionError), (bit, refused.value)


def test_a_flipped_bit_in_a_compressed_frame_is_refused_or_changes_nothing() -> None:
    fmt = SegmentFormat(Compression.ZSTD)
    for data in (b"x", b"hello world " * 40, payload(300, 5)):
        frame = fmt.encode(data, WHERE, 0)
        harmless = []
        for bit in range(len(frame) * 8):
            try:
                decoded = fmt.decode(flip(frame, bit), WHERE, 0)
            except IntegrityError:
                continue
            assert decoded == data, bit  # never other bytes
            harmless.append(bit // 8)
        # Every bit of our header is checked; zstd has a few that change no content (its header's unused
        # bit and checksum flag, a one-byte raw block read as run-length), and no check can see those.
        assert min(harmless, default=HEADER_SIZE) >= HEADER_SIZE, harmless
        assert len(harmless) <= 3, harmless


# ---- keys and descriptors ------------------------------------------------------------------------------


def test_a_data_key_wrapped_by_other_material_of_the_same_id_does_not_unwrap() -> None:
    fmt = encrypted()
    descriptor = fmt.descriptor()
    assert parse_descriptor(descriptor, Keyring({"a": KEY_A}), WHERE).data_key == fmt.data_key
    with pytest.raises(DecryptionError, match="key 'a' does not unwrap") as refused:
        parse_descriptor(descriptor, Keyring({"a": KEY_B}), WHERE)
    assert_no_material(chain_text(refused.value), KEY_A, KEY_B)


def test_a_missing_key_id_is_named() -> None:
    fmt = encrypted()
    with pytest.raises(MissingKeyError, match="key 'a', which the keyring does not hold") as refused:
        parse_descriptor(fmt.descriptor(), Keyring({"other": KEY_B}), WHERE)
    assert WHERE in str(refused.value)
    with pytest.raises(MissingKeyError, match="'gone'"):
        Keyring({"a": KEY_A}).wrap(bytes(32), "gone")


def test_keys_never_show_in_reprs_or_errors() -> None:
    keyring = Keyring({"a": KEY_A, "b": KEY_B}, active="a")
    fmt = new_format(WriteCodec(encrypt=True), keyring)
    assert fmt.data_key is not None and fmt.wrapped_key is not None
    secrets = (KEY_A, KEY_B, fmt.data_key, fmt.wrapped_key.wrapped)
    texts = [repr(keyring), str(keyring), repr(fmt), str(fmt), repr(fmt.wrapped_key), repr(Codecs(keyring))]
    assert "'a'" in repr(keyring) and "'b'" in repr(keyring)
    failures: list[Callable[[], object]] = [
        lambda: Keyring({"short": KEY_A[:31]}),
        lambda: Keyring({"a": KEY_A}, active="b"),
        lambda: Keyring({"a": KEY_B}).unwrap(fmt.wrapped_key, WHERE),  # type: ignore[union-attr]
        lambda: Keyring({"b": KEY_B}).unwrap(fmt.wrapped_key, WHERE),  # type: ignore[union-attr]
        lambda: parse_descriptor(fmt.descriptor()[:-3], keyring, WHERE),
        lambda: Keyring({"c": KEY_B}).wrap(fmt.data_key, "a"),  # type: ignore[arg-type]
    ]
    for failing in failures:
        with pytest.raises((ConfigError, IntegrityError)) as refused:
            failing()
        texts.append(chain_text(refused.value))
    for text in texts:
        assert_no_material(text, *secrets)


def keyfile(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "keyring.toml"
    path.write_text(body)
    return path


SHORT = base64.b64encode(KEY_A[:16]).decode()
GOOD = base64.b64encode(KEY_A).decode()
NOT_BASE64 = "c2VjcmV0LWtleS1tYXRlcmlhbA!!" + GOOD[:10]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("bad base64 in the file", "key 'k1' in keyring file .* is not valid base64"),
        ("wrong length in the file", "key 'k1' in keyring file .* is 16 bytes; AES-256 keys are 32"),
        ("a key line that is not TOML", "keyring file .* is not valid TOML"),
        ("missing file", "keyring file .* does not exist"),
        ("missing env var", r"encryption.keyring_env names \$CODEC_TEST_KEYS, which is not set"),
        ("bad base64 in the env var", r"key 'k2' in \$CODEC_TEST_KEYS is not valid base64"),
        ("wrong length in the env var", r"key 'k2' in \$CODEC_TEST_KEYS is 16 bytes"),
        ("active key not in the keyring", "encryption.active_key 'k9' is not in the keyring .it holds k1."),
    ],
)
def test_keyring_errors_are_one_line_config_errors_without_material(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, expected: str
) -> None:
    monkeypatch.delenv("CODEC_TEST_KEYS", raising=False)
    settings: dict[str, Any] = {}
    if case == "bad base64 in the file":
        settings["keyring_file"] = keyfile(tmp_path, f'[keys]\nk1 = "{NOT_BASE64}"\n')
    elif case == "wrong length in the file":
        settings["keyring_file"] = keyfile(tmp_path, f'[keys]\nk1 = "{SHORT}"\n')
    elif case == "a key line that is not TOML":
        settings["keyring_file"] = keyfile(tmp_path, f"[keys]\nk1 = {GOOD}\n")
    elif case == "missing file":
        settings["keyring_file"] = tmp_path / "nowhere.toml"
    elif case == "missing env var":
        settings["keyring_env"] = "CODEC_TEST_KEYS"
    elif case.endswith("in the env var"):
        monkeypatch.setenv("CODEC_TEST_KEYS", f"k1={GOOD},k2={NOT_BASE64 if 'base64' in case else SHORT}")
        settings["keyring_env"] = "CODEC_TEST_KEYS"
    else:
        settings = {"keyring_file": keyfile(tmp_path, f'[keys]\nk1 = "{GOOD}"\n'), "active_key": "k9"}
    with pytest.raises(ConfigError, match=expected) as refused:
        load_keyring(EncryptionSettings(**settings))
    assert "\n" not in str(refused.value)
    for text in (GOOD, SHORT, NOT_BASE64, NOT_BASE64[:16]):
        assert text not in chain_text(refused.value)
    assert_no_material(chain_text(refused.value), KEY_A, KEY_A[:16])


def test_a_keyring_from_file_and_environment_wraps_and_unwraps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEC_TEST_KEYS", f" k2 = {base64.b64encode(KEY_B).decode()} ,")
    keyring = load_keyring(
        EncryptionSettings(
            keyring_file=keyfile(tmp_path, f'[keys]\nk1 = "{GOOD}"\n'), keyring_env="CODEC_TEST_KEYS", active_key="k2"
        )
    )
    assert (keyring.ids, keyring.active) == (["k1", "k2"], "k2")
    wrapped = keyring.wrap(bytes(range(32)))
    assert wrapped.key_id == "k2"
    assert Keyring({"k2": KEY_B}).unwrap(wrapped, WHERE) == bytes(range(32))


# ---- framed segments at the provider level -----------------------------------------------------------

KEYRING = Keyring({"a": KEY_A}, active="a")
ENCRYPTING = Codecs(KEYRING, lambda _segment: WriteCodec(Compression.ZSTD, 3, encrypt=True))
COMPRESSING = Codecs(Keyring(), lambda _segment: WriteCodec(Compression.ZSTD, 3))
OpenProvider = Callable[[Codecs], Provider]


@pytest.fixture(params=["posix", "s3"])
async def open_provider(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenProvider]:
    """Opens providers on one fresh root with the given codecs; all closed at the end."""
    opened: list[Provider] = []
    if request.param == "s3":
        url = request.getfixturevalue("s3_bucket_url")
        options = request.getfixturevalue("s3_options")

    def open_one(codecs: Codecs) -> Provider:
        provider: Provider = (
            PosixProvider(f"file://{tmp_path}/cold") if request.param == "posix" else S3Provider(url, **options)
        )
        provider.codecs = codecs
        opened.append(provider)
        return provider

    yield open_one
    for provider in opened:
        await provider.close()


def objects(provider: Provider) -> ObjectStore:
    """Where the provider keeps a framed segment's objects (POSIX: files in the segment's folder)."""
    return provider.store if isinstance(provider, ChunkedProvider) else provider.objects  # type: ignore[attr-defined]


async def stored_frames(provider: Provider, key: str) -> dict[str, bytes]:
    """Every object of a segment's folder but the creation marker, by name, as stored."""
    store = objects(provider)
    names = [info.name for info in await store.list_files(key) if info.name != ".created"]
    return {name: await store.get_range(f"{key}/{name}", 0, 1 << 40) for name in names}


async def test_a_commit_larger_than_a_frame_is_split_into_frames(open_provider: OpenProvider) -> None:
    data = payload(2 * MAX_FRAME + 100, 11)
    segment = await committed(open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, 0), data)
    frames = await stored_frames(open_provider(ENCRYPTING), segment.key)
    assert sorted(frames) == sorted([DESCRIPTOR_NAME, chunk_name(0), chunk_name(MAX_FRAME), chunk_name(2 * MAX_FRAME)])
    assert [read_header(frames[chunk_name(s)], WHERE)[0] for s in (0, MAX_FRAME, 2 * MAX_FRAME)] == [
        MAX_FRAME,
        MAX_FRAME,
        100,
    ]
    reader = open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, 0)
    assert await reader.correct_commit_position() == len(data)
    for start, length in ((MAX_FRAME - 10, 20), (0, len(data)), (2 * MAX_FRAME + 50, 50)):
        assert await reader.read(start, length) == data[start : start + length]


@pytest.mark.parametrize("outage", [False, True], ids=["size-known", "size-unknown"])
async def test_a_retried_commit_whose_first_attempt_landed_is_not_written_twice(
    open_provider: OpenProvider, outage: bool
) -> None:
    provider = open_provider(ENCRYPTING)
    plan = FaultPlan(fail_after_landing=1, size_unknown=outage)
    segment = FaultyProvider(provider, plan).segment(COMMIT_LOG, QUEUE, 0)
    first, second = payload(500, 1), payload(300, 2)
    with pytest.raises(StorageUnavailableError):
        await committed(segment, first)
    plan.size_unknown = False
    # Known size: counted as committed at once. Unknown: still buffered, and the retry (a new nonce, so
    # other stored bytes) finds the landed frame holding the same logical bytes and writes only the rest.
    assert segment.commit_position == (0 if outage else 500)
    segment.append(second)
    await segment.commit()
    assert segment.commit_position == 800
    frames = await stored_frames(provider, segment.key)
    assert sorted(frames) == [DESCRIPTOR_NAME, chunk_name(0), chunk_name(500)]
    assert [read_header(frames[chunk_name(s)], WHERE)[0] for s in (0, 500)] == [500, 300]
    reader = open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, 0)
    assert await reader.correct_commit_position() == 800
    assert await reader.read(0, 800) == first + second


async def test_truncating_inside_a_frame_keeps_its_head_sealed(open_provider: OpenProvider) -> None:
    parts = [payload(100, 1), payload(100, 2), payload(100, 3)]
    segment = await committed(open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, 0), *parts)
    await segment.truncate(150)
    frames = await stored_frames(open_provider(ENCRYPTING), segment.key)
    assert sorted(frames) == [DESCRIPTOR_NAME, chunk_name(0), chunk_name(100)]
    length, flags, _nonce = read_header(frames[chunk_name(100)], WHERE)
    assert (length, flags) == (50, 3)  # the head re-sealed: still compressed and encrypted
    restarted = open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, 0)
    assert await restarted.correct_commit_position() == 150
    assert await restarted.read(0, 300) == parts[0] + parts[1][:50]
    await committed(restarted, b"after the cut")
    fresh = open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, 0)
    assert await fresh.correct_commit_position() == 163
    assert await fresh.read(140, 100) == parts[1][40:50] + b"after the cut"


async def test_a_reader_without_keys_reads_a_compressed_segment_but_not_an_encrypted_one(
    open_provider: OpenProvider,
) -> None:
    data = b"compressible " * 200
    await committed(open_provider(COMPRESSING).segment(COMMIT_LOG, QUEUE, 0), data)
    await committed(open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, 1000), data)
    plain_reader = open_provider(Codecs())
    compressed = plain_reader.segment(COMMIT_LOG, QUEUE, 0)
    assert await compressed.correct_commit_position() == len(data)
    assert await compressed.read(0, len(data)) == data
    frames = await stored_frames(plain_reader, compressed.key)
    assert len(frames[chunk_name(0)]) < len(data) // 10
    sealed = plain_reader.segment(COMMIT_LOG, QUEUE, 1000)
    # Its size needs no key (verify's size check, scrub); its bytes do.
    assert await sealed.correct_commit_position() == len(data)
    with pytest.raises(MissingKeyError, match="wrapped by key 'a'"):
        await sealed.read(0, 10)


async def test_the_stored_key_id_is_read_without_the_key_and_is_none_unless_encrypted(
    open_provider: OpenProvider,
) -> None:
    data = b"compressible " * 200
    await committed(open_provider(Codecs()).segment(COMMIT_LOG, QUEUE, 0), data)
    await committed(open_provider(COMPRESSING).segment(COMMIT_LOG, QUEUE, 1000), data)
    await committed(open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, 2000), data)
    # A reader holding no key at all still learns which key wraps a segment (db rebuild, keys list).
    keyless = open_provider(Codecs())
    found = [await keyless.segment(COMMIT_LOG, QUEUE, base).stored_key_id() for base in (0, 1000, 2000, 3000)]
    assert found == [None, None, "a", None]


def framed_format(segment: FileSegment) -> SegmentFormat:
    # POSIX: the chunked segment sits behind the file's handle.
    chunked = getattr(segment, "_chunked", None) or segment
    assert isinstance(chunked, ChunkedSegment) and chunked.framed_format is not None
    return chunked.framed_format


async def test_racing_first_commits_share_one_descriptor(open_provider: OpenProvider) -> None:
    data = payload(2000, 4)
    for base_offset in range(4):  # a few races: either handle may write the descriptor first
        handles = [open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, base_offset) for _ in range(2)]
        for handle in handles:
            handle.append(data)
        await asyncio.gather(*(handle.commit() for handle in handles))
        formats = [framed_format(handle) for handle in handles]
        assert formats[0].data_key == formats[1].data_key  # both sealed under the one data key written
        frames = await stored_frames(open_provider(ENCRYPTING), handles[0].key)
        assert sorted(frames) == [DESCRIPTOR_NAME, chunk_name(0)]
        assert parse_descriptor(frames[DESCRIPTOR_NAME], KEYRING, WHERE).data_key == formats[0].data_key
        reader = open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, base_offset)
        assert await reader.correct_commit_position() == 2000
        assert await reader.read(0, 2000) == data


async def test_racing_first_commits_of_other_bytes_leave_one_writer_s_bytes(open_provider: OpenProvider) -> None:
    handles = [open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, 0) for _ in range(2)]
    parts = [payload(700, 1), payload(700, 2)]
    for handle, part in zip(handles, parts, strict=True):
        handle.append(part)
    outcomes = await asyncio.gather(*(handle.commit() for handle in handles), return_exceptions=True)
    assert sorted(type(outcome).__name__ for outcome in outcomes) == ["CommitConflictError", "NoneType"]
    winner = parts[outcomes.index(None)]
    assert not any(isinstance(o, Exception) and not isinstance(o, CommitConflictError) for o in outcomes)
    reader = open_provider(ENCRYPTING).segment(COMMIT_LOG, QUEUE, 0)
    assert await reader.correct_commit_position() == 700
    assert await reader.read(0, 700) == winner


# In a child process: a shared compression context crashes the interpreter, which would end the test run.
_CONCURRENT_ENCODES = """
import os, threading
from tieredstore.providers.codec import Compression, SegmentFormat
fmt = SegmentFormat(Compression.ZSTD)
data = b"".join(b'{"n": %d, "x": "%s"}' % (i, os.urandom(8).hex().encode()) for i in range(150_000))[: 4 << 20]
failures = []
def encode_many():
    for _ in range(8):
        if fmt.decode(fmt.encode(data, "k", 0), "k", 0) != data:
            failures.append(1)
threads = [threading.Thread(target=encode_many) for _ in range(4)]
for thread in threads: thread.start()
for thread in threads: thread.join()
raise SystemExit(len(failures))
"""


def test_large_frames_encoded_in_several_threads_at_once_round_trip() -> None:
    # Frames of 64 KiB and more are encoded in worker threads, several queues' commits at once.
    done = subprocess.run([sys.executable, "-c", _CONCURRENT_ENCODES], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
