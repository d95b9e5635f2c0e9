"""A stored message's properties: ``name\\x01value\\x02`` pairs in UTF-8, the names RocketMQ gives meaning
to, and Java's ``String.hashCode`` that the consume queue's tag code is.
"""

from __future__ import annotations

from collections.abc import Mapping

from tieredstore.errors import InvalidPropertyError

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit wrap-around), signed."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tag_hash(tags: str | None) -> int:
    """The consume-queue tag code: Java hashCode of the TAGS property, sign-extended; 0 without tags."""
    return java_string_hash(tags) if tags else 0


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """``name\\x01value\\x02`` pairs in the mapping's order."""
    parts = []
    for name, value in properties.items():
        for text in (name, value):
            if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
                raise InvalidPropertyError(
                    f"property {name!r} contains a separator byte (0x01 or 0x02), which the format reserves"
                )
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError as exc:
        # Lone surrogates are legal in a Python str but have no UTF-8 form; say so instead of a codec error.
        raise InvalidPropertyError(f"properties are not encodable as UTF-8: {exc.reason}") from exc


def decode_properties(raw: bytes) -> dict[str, str]:
    """Parse ``name\\x01value\\x02`` pairs; tolerant of a missing final separator as RocketMQ is."""
    result: dict[str, str] = {}
    if not raw:
        return result
    text = raw.decode("utf-8", errors="replace")
    for pair in text.split(PROPERTY_SEPARATOR):
        if not pair:
            continue
        name, sep, value = pair.partition(NAME_VALUE_SEPARATOR)
        if sep:
            result[name] = value
    return result
