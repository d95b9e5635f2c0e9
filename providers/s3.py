"""The S3 provider (``s3://bucket/prefix``): chunked segments on botocore, one pair of clients per provider.

Segments follow the chunk scheme of ``tieredstore.providers.chunks``: every commit is one PUT with
``If-None-Match: *``; a 412 is resolved by comparing the chunk that is there with ours (with
``conditional_writes="unsupported"``, a plain PUT read back after it). Commit-log chunks are stored in
``storage_class``, consume-queue and index chunks in ``index_storage_class`` (both STANDARD unless
set: small objects pay a minimum billable size in the IA classes). Calls are
retried with exponential backoff (tenacity) on 5xx, throttling and connection errors, at most
``max_attempts`` times, then StorageUnavailableError; access errors (401/403, bad keys, missing
bucket) are raised as StorageAccessError at once. Every botocore/aiohttp error is translated in one
place, ``translate_s3_errors``, with its cause chained.

**Two clients.** Object transfers (GET and PUT) go through a sync botocore client in worker threads (the
provider's own, as many as its connections, so that transfers waiting on the network never hold the
event loop's default executor that the callers' other blocking work runs in):
socket reads and writes release the GIL, and so do the digests of a body (our CRC32, SigV4's payload
SHA-256 over plain http), which run in the transferring thread instead of on the event loop. A 4 MiB
GET costs about half the CPU it costs through aiohttp, which hands the body to the event loop piece by
piece (7.6 against 16 ms, measured on moto). How each GET and PUT is made is one transport's
(``s3_transport``): once the sync client has made one, later ones are signed and sent with its parts
but without its per-call machinery (``s3_direct``), answering as the client would, with the client
as their fallback. Listings and deletes go through the aiobotocore
client on the event loop. Both clients share one configuration, and the retries and error translation below.

Integrity is checked end to end: every PUT carries a CRC32 of its body (``x-amz-checksum-crc32``,
which S3 verifies before storing anything) and every GET asks for the object's stored checksum and
compares it with the bytes received, in the transferring thread (botocore's sync body does it as it
reads, where it can; otherwise we do). botocore's own "when_supported" checksumming is switched off
because it would hash every body a second time. Over TLS
the payload is sent unsigned beside its signed CRC32 header (what botocore itself does for uploads
over https); over plain http botocore still signs the payload's SHA-256, as raw boto3 does.

Credentials come from S3Options or, when absent, botocore's usual chain (environment, profile,
instance role). They never appear in ``repr``, ``str``, log lines, error messages or ``url``.

The aiobotocore client is created on first use and bound to the event loop that was running then;
use one provider per event loop, and ``await provider.close()`` in that loop (it closes both clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar, cast

import aiohttp
import botocore.config
import botocore.credentials
import botocore.exceptions
import botocore.session
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_exponential_jitter

from tieredstore.errors import (
    ConfigError,
    SegmentNotFoundError,
    StorageAccessError,
    StorageError,
    StorageUnavailableError,
)
from tieredstore.formats.naming import FileType
from tieredstore.providers.base import StoredObject
from tieredstore.providers.chunked_provider import ChunkedProvider
from tieredstore.providers.chunks import ObjectInfo, ObjectStore, epoch_ms
from tieredstore.providers.s3_direct import capture_sent_url
from tieredstore.providers.s3_options import S3Options, ask_for_receive_buffer, parse_s3_url
from tieredstore.providers.s3_transport import (
    FallbackTransport,
    ask_for_checksums,
    check_response_checksum,
    checksum_arguments,
    client_error_code,
    crc32_base64,
)

__all__ = ["S3ObjectStore", "S3Options", "S3Provider", "check_response_checksum", "translate_s3_errors"]

log = logging.getLogger(__name__)
T = TypeVar("T")


_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "AccountProblem",
        "AllAccessDisabled",
        "AuthorizationHeaderMalformed",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "KMS.DisabledException",
        "KMS.NotFoundException",
        "NoSuchBucket",
        "SignatureDoesNotMatch",
        "TokenRefreshRequired",
    }
)
_RETRYABLE_CODES = frozenset(
    {
        "ConditionalRequestConflict",  # two conditional writes raced; the retry sees a 412
        "InternalError",
        "OperationAborted",
        "RequestTimeout",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_PRECONDITION_CODES = frozenset({"PreconditionFailed", "412"})
# Retrying these is safe: the request never reached S3 or its outcome is resolved by the 412 check.
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ConnectionError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.IncompleteReadError,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    ConnectionError,
)


_SESSIONS = threading.local()
_SYNC_SESSION: list[botocore.session.Session] = []
_SYNC_SESSION_LOCK = threading.Lock()


def _sync_session() -> botocore.session.Session:
    """The process's botocore session for sync clients (made once: loading S3's model costs ~180 ms)."""
    with _SYNC_SESSION_LOCK:
        if not _SYNC_SESSION:
            _SYNC_SESSION.append(botocore.session.get_session())
        return _SYNC_SESSION[0]


def _thread_session() -> AioSession:
    """One botocore session per thread: loading S3's service model costs ~180 ms, so a Spark task or a
    restarted provider reuses it; botocore does not promise a session is safe across threads."""
    session: AioSession | None = getattr(_SESSIONS, "session", None)
    if session is None:
        session = get_session()
        _SESSIONS.session = session
    return session


class _PreconditionFailed(Exception):
    """The conditional create found an object there; handled inside this module only."""


@contextlib.contextmanager
def translate_s3_errors(what: str) -> Iterator[None]:
    """Map botocore/aiohttp failures to the tieredstore.errors tree, cause chained; ``what`` names the call."""
    try:
        yield
    except StorageError:
        raise
    except botocore.exceptions.ClientError as error:
        code, status = client_error_code(error)
        detail = f"{what}: {code or 'error'} (HTTP {status})"
        if code in _PRECONDITION_CODES or status == 412:
            raise _PreconditionFailed(detail) from error
        if code in _ACCESS_CODES or status in (401, 403):
            raise StorageAccessError(detail) from error
        if code in _NOT_FOUND_CODES or status == 404:
            raise SegmentNotFoundError(detail) from error
        if code in _RETRYABLE_CODES or status >= 500 or status == 429:
            raise StorageUnavailableError(detail) from error
        raise StorageError(detail) from error
    except (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError) as error:
        raise StorageAccessError(f"{what}: no usable S3 credentials were found") from error
    except _CONNECTION_ERRORS as error:
        raise StorageUnavailableError(f"{what}: {type(error).__name__}") from error
    except botocore.exceptions.BotoCoreError as error:
        raise StorageError(f"{what}: {type(error).__name__}") from error


class S3ObjectStore(ObjectStore):
    """The chunk scheme's object operations on one bucket and prefix, with retries."""

    def __init__(self, provider: S3Provider) -> None:
        self._provider = provider
        self._bucket = provider.bucket
        self._prefix = provider.prefix
        self._options = provider.options
        self.conditional_create = provider.options.conditional_writes == "required"
        # How each GET and PUT goes: direct once learned from a client call, else the client's (s3_transport).
        self.transport = FallbackTransport(self._bucket, provider.credentials)

    def _key(self, key: str) -> str:
        return f"{self._prefix}/{key}" if self._prefix else key

    def _folder(self, folder: str) -> str:
        full = self._key(folder) if folder else self._prefix
        return f"{full}/" if full else ""

    def _retrying(self) -> AsyncRetrying:
        options = self._options
        return AsyncRetrying(
            stop=stop_after_attempt(options.max_attempts),
            wait=wait_exponential_jitter(
                multiplier=options.retry_initial_delay,
                max=options.retry_max_delay,
                jitter=options.retry_initial_delay,
            ),
            retry=retry_if_exception_type(StorageUnavailableError),
            before_sleep=_log_retry,
            reraise=True,
        )

    async def _call(self, what: str, operation: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``operation(client)`` with translation and bounded retries on retryable failures."""
        async for attempt in self._retrying():
            with attempt:
                client = await self._provider.client()
                with translate_s3_errors(what):
                    return await operation(client)
        raise AssertionError("tenacity ends with a result or an exception")  # pragma: no cover

    async def _call_in_thread(self, what: str, operation: Callable[[Any], T]) -> T:
        """Run ``operation(sync_client)`` in a worker thread, translated and retried as ``_call`` does."""
        async for attempt in self._retrying():
            with attempt:
                client = self._provider.created_sync_client
                if client is None:
                    # Building a botocore client takes tens of milliseconds of CPU: not on the event loop.
                    client = await asyncio.to_thread(self._provider.sync_client)
                with translate_s3_errors(what):
                    return await self._provider.in_transfer_thread(operation, client)
        raise AssertionError("tenacity ends with a result or an exception")  # pragma: no cover

    async def _list(
        self, folder: str, *, max_keys: int | None = None, recursive: bool = False
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """The listing entries (``Contents``) and folder names directly in ``folder``, or, ``recursive``,
        every entry under it (no folders)."""
        prefix = self._folder(folder)
        files: list[dict[str, Any]] = []
        folders: list[str] = []
        token: str | None = None
        while True:
            arguments: dict[str, Any] = {
                "Bucket": self._bucket,
                "Prefix": prefix,
                "MaxKeys": max_keys or self._options.list_page_size,
            }
            if not recursive:
                arguments["Delimiter"] = "/"
            if token is not None:
                arguments["ContinuationToken"] = token

            async def list_page(client: Any, arguments: dict[str, Any] = arguments) -> dict[str, Any]:
                return cast(dict[str, Any], await client.list_objects_v2(**arguments))

            page = await self._call(f"list {self._where(prefix)}", list_page)
            files += page.get("Contents", [])
            folders += [item["Prefix"][len(prefix) :].rstrip("/") for item in page.get("CommonPrefixes", [])]
            token = page.get("NextContinuationToken")
            if max_keys is not None or not page.get("IsTruncated") or token is None:
                return files, folders

    def _where(self, key: str) -> str:
        return f"s3://{self._bucket}/{key}"

    async def list_files(self, folder: str) -> list[ObjectInfo]:
        prefix = self._folder(folder)
        return [ObjectInfo(item["Key"][len(prefix) :], int(item["Size"])) for item in (await self._list(folder))[0]]

    async def list_tree(self, folder: str) -> list[StoredObject]:
        strip = len(self._prefix) + 1 if self._prefix else 0
        entries = (await self._list(folder, recursive=True))[0]
        return [
            StoredObject(item["Key"][strip:], int(item["Size"]), epoch_ms(item["LastModified"])) for item in entries
        ]

    async def list_folders(self, folder: str) -> list[str]:
        return (await self._list(folder))[1]

    async def folder_exists(self, folder: str) -> bool:
        files, folders = await self._list(folder, max_keys=1)
        return bool(files or folders)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        full = self._key(key)

        what = f"get {self._where(full)}"

        def get(client: Any) -> bytes:
            # In a worker thread, on the sync client: its socket reads and our checksum run without the
            # GIL, where aiohttp would hand a body to the event loop piece by piece (twice the CPU). The
            # sync client asks S3 for the stored checksum itself (ask_for_checksums), so that botocore
            # leaves the body alone and ours (zlib-ng's CRC-32, ~17x binascii's on 4 MiB) checks it.
            return self.transport.get_range(client, full, start, length, what)

        return await self._call_in_thread(what, get)

    async def put_if_absent(self, key: str, data: bytes | bytearray, *, file_type: FileType | None = None) -> bool:
        if not self.conditional_create:
            # The endpoint would ignore the condition: a plain PUT, which the segment reads back.
            await self.put(key, data, file_type=file_type)
            return True
        full = self._key(key)
        try:
            await self._put_object(f"conditional put {self._where(full)}", full, data, file_type, IfNoneMatch="*")
        except _PreconditionFailed:
            return False
        return True

    async def put(self, key: str, data: bytes | bytearray, *, file_type: FileType | None = None) -> None:
        full = self._key(key)
        await self._put_object(f"put {self._where(full)}", full, data, file_type)

    async def _put_object(
        self, what: str, full: str, data: bytes | bytearray, file_type: FileType | None, **conditions: str
    ) -> None:
        """PUT ``data`` with our CRC32 of it, on the sync client in a worker thread: the CRC32 and, over
        plain http, the SigV4 payload hash are computed there, off the event loop, as the body is sent."""
        # How the object is stored: server-side encryption and the storage class of its segment type.
        stored_as = {**self._options.encryption_arguments(), **self._options.storage_class_arguments(file_type)}
        checksum: list[str] = []  # computed on the first attempt, reused by retries

        def put(client: Any) -> None:
            if not checksum:
                checksum.append(crc32_base64(data))
            self.transport.put(client, full, data, {**conditions, **stored_as, **checksum_arguments(checksum[0])})

        await self._call_in_thread(what, put)

    async def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            full = self._key(key)

            async def delete(client: Any, full: str = full) -> None:
                await client.delete_object(Bucket=self._bucket, Key=full)

            await self._call(f"delete {self._where(full)}", delete)

    async def close(self) -> None:
        self.transport.forget()  # its direct path sends on the client closed here: learn anew
        await self._provider.close_client()


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    delay = state.next_action.sleep if state.next_action is not None else 0.0
    log.warning("S3 call failed, retrying in %.2fs (attempt %d): %s", delay, state.attempt_number, error)


class S3Provider(ChunkedProvider):
    """Segments as chunk objects under ``s3://bucket/prefix``."""

    scheme: ClassVar[str] = "s3"

    def __init__(self, url: str, options: S3Options | None = None, **option_overrides: Any) -> None:
        bucket, prefix, query = parse_s3_url(url)
        if options is not None and (query or option_overrides):
            raise ConfigError("pass S3Options or URL parameters and keyword options, not both")
        self.options = options if options is not None else S3Options.from_query(query, **option_overrides)
        self.bucket = bucket
        self.prefix = prefix
        super().__init__(f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}")
        self._store = S3ObjectStore(self)
        self._client: Any = None
        self._client_stack: contextlib.AsyncExitStack | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._client_lock: asyncio.Lock | None = None
        self._sync_client: Any = None
        self._sync_client_lock = threading.Lock()
        self._transfers: ThreadPoolExecutor | None = None

    @property
    def store(self) -> ObjectStore:
        return self._store

    async def client(self) -> Any:
        """The aiobotocore S3 client, created on first use in the running event loop."""
        loop = asyncio.get_running_loop()
        if self._client_loop is not loop:
            if self._client_loop is not None and not self._client_loop.is_closed():
                raise RuntimeError(
                    f"{self!r} is bound to the event loop it was first used in; use one provider per loop"
                )
            # The old loop is gone and its connections with it; start over in this one.
            self._client, self._client_stack = None, None
            self._client_loop, self._client_lock = loop, asyncio.Lock()
        assert self._client_lock is not None
        async with self._client_lock:
            if self._client is None:
                self._client_stack = contextlib.AsyncExitStack()
                self._client = await self._client_stack.enter_async_context(self._create_client())
        return self._client

    def sync_client(self) -> Any:
        """A sync botocore client for object reads, used from worker threads (botocore clients are
        thread-safe); created on first use, with the same configuration as ``client``."""
        with self._sync_client_lock:
            if self._sync_client is None:
                self._sync_client = self._create_sync_client()
            return self._sync_client

    async def prepare(self) -> None:
        """Build the sync client now, in a worker thread: tens of milliseconds of CPU that the first read
        or commit would otherwise spend (a store opening prepares its provider)."""
        await asyncio.to_thread(self.sync_client)

    async def in_transfer_thread(self, operation: Callable[[Any], T], client: Any) -> T:
        """``operation(client)`` in one of this provider's transfer threads, with the caller's context.

        Transfers have threads of their own, as many as the client has connections: in the event loop's
        default executor (a few threads per core) the commits and reads in flight would take every thread,
        so that further transfers, the batch reads and the metadata commits feeding them would queue behind
        the PUTs and GETs waiting on the network.
        """
        with self._sync_client_lock:
            if self._transfers is None:
                self._transfers = ThreadPoolExecutor(
                    max_workers=self.options.max_pool_connections, thread_name_prefix="s3-transfer"
                )
            transfers = self._transfers
        call = functools.partial(contextvars.copy_context().run, operation, client)
        return await asyncio.get_running_loop().run_in_executor(transfers, call)

    @property
    def created_sync_client(self) -> Any:
        """The sync client if it was created already, else None (``sync_client`` creates it)."""
        return self._sync_client

    def _create_sync_client(self) -> Any:
        options = self.options
        client = _sync_session().create_client(
            "s3",
            endpoint_url=options.endpoint_url,
            region_name=options.region,
            aws_access_key_id=options.access_key_id,
            aws_secret_access_key=options.secret_access_key,
            aws_session_token=options.session_token,
            config=botocore.config.Config(**self._config_arguments()),
        )
        ask_for_receive_buffer(client)
        client.meta.events.register("before-sign.s3.GetObject", ask_for_checksums)
        client.meta.events.register("before-send.s3.GetObject", capture_sent_url)
        client.meta.events.register("before-send.s3.PutObject", capture_sent_url)
        return client

    def credentials(self) -> Any:
        """The botocore credentials the sync client signs with: the options' keys, else botocore's chain."""
        options = self.options
        if options.access_key_id is not None and options.secret_access_key is not None:
            return botocore.credentials.Credentials(
                options.access_key_id, options.secret_access_key, options.session_token
            )
        return _sync_session().get_credentials()

    def client_config(self) -> AioConfig:
        """The botocore configuration of this provider's client."""
        return AioConfig(**self._config_arguments())

    def _config_arguments(self) -> dict[str, Any]:
        options = self.options
        s3: dict[str, Any] = {"addressing_style": options.addressing_style}
        if options.endpoint_url is None or options.endpoint_url.lower().startswith("https:"):
            # botocore only skips the payload's SHA-256 over TLS when it computed the checksum itself;
            # ours is computed beforehand, so say so explicitly. Plain http keeps the signed payload.
            s3["payload_signing_enabled"] = False
        return {
            "region_name": options.region,
            "connect_timeout": options.connect_timeout,
            "read_timeout": options.read_timeout,
            "max_pool_connections": options.max_pool_connections,
            # tenacity owns retries, so botocore makes exactly one attempt per call.
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            # Checksums are computed and verified by S3ObjectStore, off the event loop.
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
            "s3": s3,
        }

    def _create_client(self) -> Any:
        options = self.options
        config = self.client_config()
        return _thread_session().create_client(
            "s3",
            endpoint_url=options.endpoint_url,
            region_name=options.region,
            aws_access_key_id=options.access_key_id,
            aws_secret_access_key=options.secret_access_key,
            aws_session_token=options.session_token,
            config=config,
        )

    async def close_client(self) -> None:
        with self._sync_client_lock:
            sync_client, self._sync_client = self._sync_client, None
            transfers, self._transfers = self._transfers, None
        if transfers is not None:
            transfers.shutdown(wait=False)  # idle by now; a thread still sending finishes on its own
        if sync_client is not None:
            sync_client.close()
        stack, loop = self._client_stack, self._client_loop
        self._client, self._client_stack = None, None
        if stack is not None and loop is asyncio.get_running_loop():
            await stack.aclose()

    def __repr__(self) -> str:
        return f"S3Provider({self.url!r}, {self.options!r})"
