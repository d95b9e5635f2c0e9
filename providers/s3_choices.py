"""The values of S3 settings that both the configuration and the S3 provider check, without importing botocore.

``conditional_writes``: ``required`` (the default) has the provider check once, before it archives, that
the endpoint refuses a second ``If-None-Match: *`` create of one key; ``unsupported`` is for an endpoint
that ignores the header: plain PUTs, each chunk read back after it is written, one archiver only.

``storage_class`` and ``index_storage_class``: S3's storage classes for PutObject, except the two whose
objects cannot be read without a restore request first, which every read of the archive would need.
"""

from __future__ import annotations

from typing import Literal

from tieredstore.errors import ConfigError

ConditionalWrites = Literal["required", "unsupported"]
CONDITIONAL_WRITES: tuple[ConditionalWrites, ...] = ("required", "unsupported")
UNSUPPORTED_SETTING = 's3.conditional_writes = "unsupported"'

STANDARD = "STANDARD"
STORAGE_CLASSES = frozenset(
    {
        "STANDARD",
        "REDUCED_REDUNDANCY",
        "STANDARD_IA",
        "ONEZONE_IA",
        "INTELLIGENT_TIERING",
        "GLACIER_IR",
        "OUTPOSTS",
        "SNOW",
        "EXPRESS_ONEZONE",
    }
)
# Objects in these classes answer a GET with InvalidObjectState until a RestoreObject has run (hours).
ARCHIVE_STORAGE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})


def check_conditional_writes(value: str) -> ConditionalWrites:
    """``value`` if it is a conditional-writes mode; ConfigError naming the modes otherwise."""
    for mode in CONDITIONAL_WRITES:
        if value == mode:
            return mode
    raise ConfigError(f"conditional_writes must be required or unsupported, not {value!r}")


def check_storage_class(value: str, setting: str | None = None) -> str:
    """``value`` if archived objects can be stored and read in that S3 storage class; ConfigError otherwise,
    naming ``setting`` if given."""
    named = f"{setting} " if setting else ""
    if value in ARCHIVE_STORAGE_CLASSES:
        raise ConfigError(
            f"{named}{value} is refused: objects in it cannot be read until each one is restored, "
            "and every read, verify and restore reads them; GLACIER_IR is the readable archive class"
        )
    if value not in STORAGE_CLASSES:
        known = ", ".join(sorted(STORAGE_CLASSES))
        raise ConfigError(f"{named}{value!r} is not an S3 storage class; one of {known}")
    return value
