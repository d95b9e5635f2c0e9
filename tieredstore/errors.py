"""The one exception tree of tieredstore; every layer raises from here.

    TieredStoreError
    ├── ConfigError (ValueError)                 bad config file, env or flag
    │   ├── StoreLockedError                     the hot store is open by another writer
    │   └── ArchiverRunningError                 a command that changes cold storage beside a running archiver
    ├── ValidationError (ValueError)             bad input from a caller
    │   ├── InvalidTopicError                    topic name breaks RocketMQ's rule
    │   ├── InvalidQueueError                    queue id out of range
    │   ├── MessageTooLargeError                 body above max_message_size
    │   ├── InvalidPropertyError                 property name/value holds a separator byte
    │   └── ReadOnlyError                        a write through a handle opened read-only
    ├── NotFoundError (LookupError)              a topic, queue, segment or message that does not exist
    ├── IntegrityError                           bytes that do not decode: bad magic, length or CRC
    │   ├── CorruptRecordError                   names where the bad record is
    │   ├── DecryptionError                      a cold frame that fails authentication: wrong key or changed bytes
    │   │   └── WrongKeyError                    the keyring's key of a segment's key id does not unwrap its data key
    │   ├── MissingKeyError                      the keyring lacks the key that wraps a segment's data key
    │   └── IntegrityFailure [cli.app]           a command's checks found problems it already printed
    ├── StorageError (OSError)                   the cold tier failed
    │   ├── StorageUnavailableError              unreachable / outage; retryable
    │   │   └── CommitTimeoutError (TimeoutError) a commit attempt abandoned by the watchdog; retried
    │   ├── StorageAccessError (PermissionError) credentials or permissions; not retried
    │   ├── PathEscapeError (PermissionError)    a logical path that would leave the provider's root
    │   ├── SegmentNotFoundError (FileNotFoundError)
    │   ├── CommitConflictError                  a chunk already exists with other bytes (fenced writer)
    │   ├── ConditionalWritesUnsupportedError    the endpoint ignores If-None-Match: no fencing there
    │   └── SizeUnknownError                     the real size cannot be known right now (never -1)
    ├── StoreFullError (OSError)                 the hot store is above its disk watermark
    ├── MetadataError
    │   ├── MetadataUnavailableError             database unreachable or not answering; retryable
    │   ├── MetadataCorruptError (IntegrityError) the database file is damaged
    │   ├── SchemaVersionError                   database unmigrated or at an unknown revision
    │   ├── ConcurrentUpdateError                optimistic check lost to another writer
    │   └── LeaseLostError                       another archiver owns the queue now
    └── MissingExtraError (ImportError)          a URL scheme whose optional dependency is not installed

Signals caught in the module that raises them, so none reaches a caller; they are not ``TieredStoreError``:

    Exception
    ├── DirectRequestUnusable [providers.s3_direct]  the signed direct request no longer reaches the bucket
    ├── _PreconditionFailed [providers.s3]           the conditional create found an object there
    ├── _Abandoned [restore.engine]                  a write refused because an earlier one failed
    ├── _Corrupt [scan.reading]                      a record that does not decode, before its location is known
    └── _Conflict [table.sync]                       another syncer committed to the table first: plan again

A name in brackets is defined in that module of tieredstore, not here; tests/packaging/test_public_api.py
checks that this drawing names every exception class of the package with its real parents.
Leaves inherit the matching built-in so callers can catch ``FileNotFoundError`` or
``PermissionError`` without knowing this module. Messages never carry credentials.
"""

from __future__ import annotations


class TieredStoreError(Exception):
    """Base of every error tieredstore raises on purpose."""


class ConfigError(TieredStoreError, ValueError):
    """A config file, environment variable or flag is malformed or out of range."""


class StoreLockedError(ConfigError):
    """The hot store is open by another writer (its lock file is held)."""


class ArchiverRunningError(ConfigError):
    """A command that changes cold storage found an archiver running on the same metadata (its SQLite lock
    file held, or a live heartbeat)."""


class ValidationError(TieredStoreError, ValueError):
    """Input from a caller breaks a rule; nothing was written."""


class InvalidTopicError(ValidationError):
    """A topic name that RocketMQ's rule forbids (this also rules out path traversal)."""


class InvalidQueueError(ValidationError):
    """A queue id outside 0..max_queues_per_topic-1."""


class MessageTooLargeError(ValidationError):
    """A message body above max_message_size."""


class InvalidPropertyError(ValidationError):
    """A property name or value containing the separator bytes 0x01 / 0x02."""


class ReadOnlyError(ValidationError):
    """A write (append, commit, repair) through a cold queue opened read-only; nothing was written."""


class NotFoundError(TieredStoreError, LookupError):
    """A topic, queue, segment or message that does not exist."""


class IntegrityError(TieredStoreError):
    """Bytes that do not decode as what they claim to be."""


class CorruptRecordError(IntegrityError):
    """A record whose magic, size or CRC is wrong, with its location."""

    def __init__(self, message: str, *, location: str | None = None, offset: int | None = None) -> None:
        self.reason = message
        self.location = location
        self.offset = offset
        where = ""
        if location is not None:
            where = f" in {location}"
        if offset is not None:
            where += f" at offset {offset}"
        super().__init__(f"{message}{where}")


class DecryptionError(IntegrityError):
    """A frame of cold storage that does not authenticate or decode: a wrong key or changed bytes."""


class WrongKeyError(DecryptionError):
    """The keyring holds a key of the id that wraps a segment's data key, but other material: it does not unwrap."""


class MissingKeyError(IntegrityError):
    """The keyring holds no key-encryption key of the id that wraps a segment's data key."""


class StorageError(TieredStoreError, OSError):
    """The cold tier failed to do what was asked."""


class StorageUnavailableError(StorageError):
    """The storage cannot be reached now (network, 5xx, throttling); a retry may succeed."""


class CommitTimeoutError(StorageUnavailableError, TimeoutError):
    """A commit attempt took longer than ``archiver.commit_timeout`` and was abandoned; its bytes stay buffered."""


class StorageAccessError(StorageError, PermissionError):
    """Credentials or permissions were refused; retrying will not help."""


class PathEscapeError(StorageError, PermissionError):
    """A logical path that would resolve outside the provider's root."""


class SegmentNotFoundError(StorageError, FileNotFoundError):
    """A segment that the provider does not hold."""


class CommitConflictError(StorageError):
    """A chunk at this position already exists with different bytes; nothing was overwritten."""


class ConditionalWritesUnsupportedError(StorageError):
    """The storage accepted a second conditional create of one key: it cannot refuse to overwrite
    committed bytes, which fencing rests on, so nothing is archived there unless configured for it."""


class SizeUnknownError(StorageError):
    """The real size of a segment cannot be learned right now; distinct from a size of 0."""


class StoreFullError(TieredStoreError, OSError):
    """The hot store's disk is above its high watermark; the put was refused, nothing was written."""


class MetadataError(TieredStoreError):
    """The metadata store failed or refused."""


class MetadataUnavailableError(MetadataError):
    """The metadata database cannot be reached or stopped answering (refused, lost, timed out); a retry may succeed."""


class MetadataCorruptError(MetadataError, IntegrityError):
    """The metadata database's file is not a database, or its pages are damaged (SQLite)."""


class SchemaVersionError(MetadataError):
    """The database schema is not the one this version of tieredstore knows."""


class ConcurrentUpdateError(MetadataError):
    """Another writer changed the row first (optimistic concurrency check failed)."""


class LeaseLostError(MetadataError):
    """This archiver no longer holds the lease on a queue; it must stop writing it."""


class MissingExtraError(TieredStoreError, ImportError):
    """A feature whose optional dependency is not installed; the message says what to install."""
