"""How one object GET or PUT of the S3 provider is made, in a worker thread: the ``Transport`` interface, its
two ways (``ClientTransport``: the sync botocore client's calls; ``DirectTransport``: SigV4 requests without
a client call, ``s3_direct``) and ``FallbackTransport``, the rule that chooses between them.

Whichever way a request goes, its answer means the same: a GET returns the bytes checked against the
length and the stored checksum S3 sent beside them (``b""`` where the object ends before the range), and
any failure is raised as botocore raises it, for the provider to translate and retry. Every PUT carries
our CRC32 of its body, which S3 verifies before storing anything.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

import botocore.exceptions
from botocore.httpchecksum import StreamingChecksumBody

from tieredstore.errors import StorageUnavailableError
from tieredstore.formats.checksum import crc32
from tieredstore.providers.s3_direct import DirectRequests, DirectRequestUnusable, last_sent_url

log = logging.getLogger(__name__)
T = TypeVar("T")

_RANGE_CODES = frozenset({"InvalidRange", "416"})


def crc32_base64(data: bytes | bytearray) -> str:
    """Our CRC32 of ``data`` as S3 writes it in a checksum header (big-endian, base64)."""
    return base64.b64encode(crc32(data).to_bytes(4, "big")).decode("ascii")


def _sha1(data: bytes | bytearray) -> str:
    return base64.b64encode(hashlib.sha1(data, usedforsecurity=False).digest()).decode("ascii")


def _sha256(data: bytes | bytearray) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode("ascii")


# The stored checksums a GET can verify without optional native code, as botocore verifies them; others
# (CRC32C, CRC64NVME) are skipped as botocore skips them without awscrt.
_RESPONSE_CHECKSUMS: tuple[tuple[str, Callable[[bytes | bytearray], str]], ...] = (
    ("ChecksumCRC32", crc32_base64),
    ("ChecksumSHA256", _sha256),
    ("ChecksumSHA1", _sha1),
)


_CHECKSUM_HEADERS = tuple((name, f"x-amz-checksum-{name[8:].lower()}") for name, _ in _RESPONSE_CHECKSUMS)


def _stored_checksum(response: Mapping[str, Any]) -> tuple[str, Callable[[bytes | bytearray], str], str] | None:
    """(name, digest, value) of the full-object checksum S3 returned that we can compute, if any.

    S3 returns a checksum only when the bytes asked for are the whole object (or part) it was stored with;
    a composite checksum (``...-N``) describes parts, not these bytes, and is skipped.
    """
    for name, function in _RESPONSE_CHECKSUMS:
        expected = response.get(name)
        if expected and "-" not in expected:
            return name, function, expected
    return None


def _checksum_mismatch(name: str, what: str) -> StorageUnavailableError:
    # Damaged on the way: StorageUnavailableError, so the read is retried.
    return StorageUnavailableError(f"{what}: the bytes received do not match their stored {name[8:]} checksum")


def _check_received(data: bytes, response: Mapping[str, Any], what: str, *, checked: bool = False) -> None:
    """Raise StorageUnavailableError unless ``data`` is as long as the response said and matches its
    stored checksum (``checked``: botocore compared it already as it read)."""
    expected = response.get("ContentLength")
    if expected is not None and len(data) != expected:
        raise StorageUnavailableError(f"{what}: {len(data)} bytes received of {expected}")
    if not checked:
        check_response_checksum(response, data, what)


def _header_fields(headers: Mapping[str, str]) -> dict[str, Any]:
    """A direct GET's response headers as the fields ``_check_received`` reads from a client's answer."""
    fields: dict[str, Any] = {name: headers.get(header) for name, header in _CHECKSUM_HEADERS}
    length = headers.get("content-length")
    if length is not None:
        fields["ContentLength"] = int(length)
    return fields


def check_response_checksum(response: Mapping[str, Any], data: bytes, what: str) -> None:
    """Compare ``data`` with the full-object checksum S3 returned beside it, if it returned one we can compute."""
    stored = _stored_checksum(response)
    if stored is not None and stored[1](data) != stored[2]:
        raise _checksum_mismatch(stored[0], what)


def client_error_code(error: botocore.exceptions.ClientError) -> tuple[str, int]:
    response = cast(Mapping[str, Any], error.response)
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def ask_for_checksums(request: Any, **_: Any) -> None:
    """Have S3 return an object's stored checksums with a GET (``x-amz-checksum-mode``, signed with the rest).

    Sent as a header rather than as ``ChecksumMode``, which would also make botocore wrap the body and
    compute the CRC itself, with ``binascii`` at ~1.2 ms per 4 MiB chunk; ``check_response_checksum``
    then does it with ours.
    """
    request.headers["x-amz-checksum-mode"] = "ENABLED"


# The PutObject arguments we pass, as the headers botocore sends them in (a direct PUT sends them itself).
_PUT_HEADERS = {
    "IfNoneMatch": "If-None-Match",
    "ServerSideEncryption": "x-amz-server-side-encryption",
    "SSEKMSKeyId": "x-amz-server-side-encryption-aws-kms-key-id",
    "StorageClass": "x-amz-storage-class",
    "ChecksumAlgorithm": "x-amz-sdk-checksum-algorithm",
    "ChecksumCRC32": "x-amz-checksum-crc32",
}


def put_headers(arguments: Mapping[str, str]) -> dict[str, str]:
    return {_PUT_HEADERS[name]: value for name, value in arguments.items()}


def checksum_arguments(crc32: str) -> dict[str, str]:
    """PutObject arguments that send our CRC32 for S3 to verify and store (so later GETs can be checked)."""
    return {"ChecksumAlgorithm": "CRC32", "ChecksumCRC32": crc32}


class Transport(Protocol):
    """One way of making an object GET or PUT, called in a worker thread with the provider's sync client."""

    def get_range(self, client: Any, key: str, start: int, length: int, what: str) -> bytes:
        """Bytes [start, start + length) of ``key``, checked; ``b""`` if the object ends before ``start``."""
        ...

    def put(self, client: Any, key: str, data: bytes | bytearray, arguments: Mapping[str, str]) -> None:
        """Store ``data`` at ``key``; ``arguments`` as PutObject takes them (conditions, checksum, storage)."""
        ...


class ClientTransport:
    """Requests made by the sync botocore client's own calls."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket

    def get_range(self, client: Any, key: str, start: int, length: int, what: str) -> bytes:
        try:
            response = client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")
        except botocore.exceptions.ClientError as error:
            if client_error_code(error)[0] in _RANGE_CODES:
                return b""  # the object ends before ``start``
            raise
        with contextlib.closing(response["Body"]) as body:
            try:
                data = cast(bytes, body.read())
            except botocore.exceptions.FlexibleChecksumError as error:
                stored = _stored_checksum(response)
                raise _checksum_mismatch(stored[0] if stored else "Checksum", what) from error
        _check_received(data, response, what, checked=isinstance(body, StreamingChecksumBody))
        return data

    def put(self, client: Any, key: str, data: bytes | bytearray, arguments: Mapping[str, str]) -> None:
        client.put_object(Bucket=self.bucket, Key=key, Body=data, **arguments)


class DirectTransport:
    """Requests signed and sent with the client's parts but without its per-call machinery (``s3_direct``)."""

    def __init__(self, requests: DirectRequests) -> None:
        self.requests = requests

    def get_range(self, client: Any, key: str, start: int, length: int, what: str) -> bytes:
        answer = self.requests.get(key, start, length)
        if answer is None:
            return b""  # the object ends before ``start``
        data, headers = answer
        _check_received(data, _header_fields(headers), what)
        return data

    def put(self, client: Any, key: str, data: bytes | bytearray, arguments: Mapping[str, str]) -> None:
        self.requests.put(key, data, put_headers(arguments))


class FallbackTransport:
    """Direct requests where they answer as the client would, the client's calls otherwise.

    The first request goes through the client, and the direct path is learned from the URL it sent
    (``DirectRequests.learn``). Later requests go direct; one the direct path cannot make (a redirect, a
    400, a signature refused: ``DirectRequestUnusable``) is made by the client, and when the client
    succeeds the direct path is given up for good, since the client follows answers it does not.
    ``forget`` starts over, for a new client (the direct path sends on the old one's session).
    """

    def __init__(self, bucket: str, credentials: Callable[[], Any]) -> None:
        self.bucket = bucket
        self._credentials = credentials
        self._client = ClientTransport(bucket)
        self._direct: DirectTransport | None = None
        self._learn = True
        self.direct_requests = 0  # requests sent the direct way, answered or not

    def get_range(self, client: Any, key: str, start: int, length: int, what: str) -> bytes:
        return self._make(client, key, lambda way: way.get_range(client, key, start, length, what))

    def put(self, client: Any, key: str, data: bytes | bytearray, arguments: Mapping[str, str]) -> None:
        self._make(client, key, lambda way: way.put(client, key, data, arguments))

    def forget(self) -> None:
        self._direct, self._learn = None, True

    def _make(self, client: Any, key: str, request: Callable[[Transport], T]) -> T:
        direct, unusable = self._direct, None
        if direct is not None:
            self.direct_requests += 1
            try:
                return request(direct)
            except DirectRequestUnusable as error:
                unusable = error
        answer = request(self._client)
        if unusable is not None:
            if self._direct is not None:
                log.info("S3 requests go through the client again after %s from s3://%s/%s", unusable, self.bucket, key)
            self._direct, self._learn = None, False
        elif self._learn:
            self._learn = False
            learned = DirectRequests.learn(client, self._credentials(), key, last_sent_url())
            self._direct = None if learned is None else DirectTransport(learned)
        return answer
