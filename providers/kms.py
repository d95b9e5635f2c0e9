"""AWS KMS keys as key-encryption keys: a segment's data key wrapped by KMS ``Encrypt``, unwrapped by ``Decrypt``.

``KmsKeys`` maps key ids of our keyring to KMS key ids, ARNs or aliases, and reaches KMS with the ``[s3]``
settings' endpoint, region and credentials (the same account serves both). Its botocore client is sync,
created on first use, and called only from worker threads (``providers.chunks`` wraps and unwraps there).
KMS failures are translated here: a key KMS refuses or does not know is a MissingKeyError naming our key
id, a blob it will not decrypt under that key a WrongKeyError, an unreachable endpoint a
StorageUnavailableError (retried by the archiver). No credential or key material reaches a message or repr.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from tieredstore.errors import MissingExtraError, MissingKeyError, StorageUnavailableError, WrongKeyError
from tieredstore.providers.s3_options import S3Options

# Bound to every wrapped data key: a blob KMS encrypted for another purpose does not decrypt as one.
ENCRYPTION_CONTEXT = {"tieredstore": "data-key"}

_WRONG_KEY_CODES = frozenset({"InvalidCiphertextException", "IncorrectKeyException"})
_UNAVAILABLE_CODES = frozenset(
    {
        "DependencyTimeoutException",
        "KMSInternalException",
        "KeyUnavailableException",
        "LimitExceededException",
        "ServiceUnavailable",
        "ThrottlingException",
        "Throttling",
    }
)


def _botocore() -> Any:
    try:
        import botocore.config
        import botocore.exceptions
        import botocore.session
    except ImportError as error:
        raise MissingExtraError("KMS keys need botocore: pip install 'tieredstore[s3]'") from error
    return botocore


def check_botocore() -> None:
    """MissingExtraError now, rather than at the first wrap, when KMS cannot be reached."""
    _botocore()


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class KmsKeys:
    """Key ids of the keyring that are KMS keys, and the client that wraps and unwraps data keys with them."""

    def __init__(self, keys: Mapping[str, str], options: S3Options | None = None) -> None:
        self._keys = dict(keys)
        self._options = options or S3Options()
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def ids(self) -> list[str]:
        return sorted(self._keys)

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __repr__(self) -> str:
        return f"KmsKeys(ids={self.ids!r})"

    def wrap(self, key_id: str, data_key: bytes, where: str) -> bytes:
        """``data_key`` encrypted by the KMS key behind ``key_id``: the blob that ``unwrap`` takes back."""
        return bytes(self._call(key_id, where, "encrypt", Plaintext=data_key)["CiphertextBlob"])

    def unwrap(self, key_id: str, wrapped: bytes, where: str) -> bytes:
        return bytes(self._call(key_id, where, "decrypt", CiphertextBlob=wrapped)["Plaintext"])

    def _client_now(self) -> Any:
        with self._lock:
            if self._client is None:
                botocore = _botocore()
                options = self._options
                self._client = botocore.session.get_session().create_client(
                    "kms",
                    **options.connection_arguments(),
                    config=botocore.config.Config(
                        connect_timeout=options.connect_timeout,
                        read_timeout=options.read_timeout,
                        max_pool_connections=options.max_pool_connections,
                        retries={"total_max_attempts": options.max_attempts, "mode": "standard"},
                    ),
                )
            return self._client

    def _call(self, key_id: str, where: str, operation: str, **arguments: bytes) -> Any:
        """KMS ``operation`` on the key behind ``key_id`` with our encryption context, its failures translated."""
        if _in_event_loop():
            # A network call there would stall every queue the loop serves: a programming error, not an outage.
            raise RuntimeError("KMS is called from worker threads only (asyncio.to_thread), never on the event loop")
        botocore = _botocore()
        exceptions = botocore.exceptions
        what = f"{where}: KMS key {key_id!r}"
        try:
            call = getattr(self._client_now(), operation)
            return call(KeyId=self._keys[key_id], EncryptionContext=ENCRYPTION_CONTEXT, **arguments)
        except exceptions.ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if code in _WRONG_KEY_CODES:
                raise WrongKeyError(f"{what} does not unwrap its data key ({code}: wrong key)") from error
            if code in _UNAVAILABLE_CODES or status >= 500 or status == 429:
                raise StorageUnavailableError(f"{what}: KMS unavailable ({code or 'error'}, HTTP {status})") from error
            raise MissingKeyError(
                f"{what} cannot be used: KMS answered {code or 'an error'} (HTTP {status})"
            ) from error
        except (exceptions.NoCredentialsError, exceptions.PartialCredentialsError) as error:
            raise MissingKeyError(f"{what} cannot be used: no usable credentials for KMS were found") from error
        except (exceptions.ConnectionError, exceptions.HTTPClientError, ConnectionError, TimeoutError) as error:
            raise StorageUnavailableError(f"{what}: KMS unreachable ({type(error).__name__})") from error
        except exceptions.BotoCoreError as error:
            raise MissingKeyError(f"{what} cannot be used: {type(error).__name__}") from error
