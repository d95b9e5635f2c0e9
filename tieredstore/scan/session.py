"""One event loop and one provider per Python worker thread, kept from one partition to the next.

Spark reuses a Python worker for the tasks that follow, and building a provider's S3 clients costs tens
of milliseconds of CPU (the async client and the sync one used for reads), more than decoding a few
thousand rows. So the loop and the provider outlive a partition: they serve the next partition with the
same cold URL and provider options. Other options replace them; a partition that fails drops them, so
the next one starts afresh; what is still open is closed when the process exits. A session still in use
(a partition's batches not all read yet) is closed only when its last partition is done with it.

Framed segments are read with the keyring the options name (a file, an environment variable), loaded here,
where the partition runs: only where it is travels with the options, and a keyring file that changes (a key
added for a rotation) opens a new session.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tieredstore.errors import ConfigError
from tieredstore.keys import load_keyring
from tieredstore.providers.base import Provider
from tieredstore.providers.codec import Codecs, check_cryptography
from tieredstore.providers.registry import open_provider
from tieredstore.providers.s3_options import S3Options
from tieredstore.scan.options import ScanOptions


def scan_codecs(options: ScanOptions) -> Codecs:
    """The codecs framed segments are read with: the keyring ``options`` name, loaded in this process."""
    try:
        # KMS keys are reached as the cold tier's S3 options say (endpoint, region, credentials).
        s3 = S3Options(**options.provider_options) if options.keyring.kms_keys else None
        keyring = load_keyring(options.keyring, s3)
    except ConfigError as error:
        # A worker on another host may lack the file or the variable the driver has: say which host.
        raise ConfigError(f"tieredstore keyring on {socket.gethostname()}: {error}") from error
    if keyring.ids:
        check_cryptography()
    return Codecs(keyring)


def open_scan_provider(options: ScanOptions) -> Provider:
    """The provider of ``options.cold_url``, reading framed segments with the keyring the options name."""
    codecs = scan_codecs(options)
    provider = open_provider(options.cold_url, **options.provider_options)
    provider.codecs = codecs
    return provider


class ReadSession:
    """An event loop and a provider opened on it, with how many partitions are reading through them."""

    def __init__(self, key: str, options: ScanOptions) -> None:
        self.key = key
        self.runner = asyncio.Runner()
        self.provider: Provider = open_scan_provider(options)
        self.users = 0
        self.retired = False
        self.closed = False

    def retire(self) -> None:
        """No new partition takes this session; it closes once no partition uses it."""
        self.retired = True
        if not self.users:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _open_sessions.discard(self)
        try:
            self.runner.run(self.provider.close())
        finally:
            self.runner.close()


_local = threading.local()
_open_sessions: set[ReadSession] = set()


def _keyring_file_stamp(options: ScanOptions) -> tuple[int, int] | None:
    path = options.keyring.keyring_file
    if path is None:
        return None
    try:
        status = os.stat(path)
    except OSError:
        return None  # opening the session says what is wrong with the file
    return status.st_mtime_ns, status.st_size


def _key(options: ScanOptions) -> str:
    return repr(
        (
            options.cold_url,
            sorted(options.provider_options.items()),
            options.keyring.keyring_file,
            options.keyring.keyring_env,
            _keyring_file_stamp(options),
        )
    )


@contextmanager
def read_session(options: ScanOptions) -> Iterator[ReadSession]:
    """The session of this thread for ``options``: the one already open when its options are the same."""
    key = _key(options)
    current: ReadSession | None = getattr(_local, "session", None)
    if current is not None and current.key == key:
        session = current
    else:
        if current is not None:
            current.retire()
        session = _local.session = ReadSession(key, options)
        _open_sessions.add(session)
    session.users += 1
    try:
        yield session
    except Exception:
        # A failed partition may have left the provider mid-request: the next partition opens a new one.
        if getattr(_local, "session", None) is session:
            _local.session = None
        session.retired = True
        raise
    finally:
        session.users -= 1
        if session.retired and not session.users:
            session.close()


@atexit.register
def _close_open_sessions() -> None:
    for session in list(_open_sessions):
        session.close()
