"""The properties of many records split at once: the ``properties`` map, ``keys``, ``tags`` and ``UNIQ_KEY``.

A record's properties are ``name\\x01value\\x02`` pairs. Row by row they are read as a dict: the text is
decoded (bad UTF-8 replaced), split at every ``\\x02``, each piece split at its first ``\\x01``, pieces
without one dropped, and a repeated name keeps its first place and its last value. Here the same is done
for a whole batch with numpy over the properties bytes laid end to end: the separators are found once,
and names and values become Arrow string columns by one gather each. Bytes that are not ASCII, and a
name repeated within a record, are rare enough to go back to the row-by-row rules
(:func:`parse_properties`), so both ways give the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from tieredstore.formats.message import NAME_VALUE_SEPARATOR, PROPERTY_KEYS, PROPERTY_SEPARATOR
from tieredstore.scan.buffers import Int64Array, gather_ranges, string_array

_NAME_VALUE = ord(NAME_VALUE_SEPARATOR)
_PAIR_END = ord(PROPERTY_SEPARATOR)
# Odd multipliers by a byte's place in a name: a cheap fingerprint to spot a repeated name in a record.
_PLACE_WEIGHTS = np.random.default_rng(31).integers(1, 1 << 62, size=64, dtype=np.uint64) | np.uint64(1)
_RECORD_WEIGHT = np.uint64(0x9E3779B97F4A7C15)


def parse_properties(raw: bytes) -> dict[str, str]:
    """One record's properties as a dict, by the row-by-row rules."""
    properties: dict[str, str] = {}
    if raw:
        for pair in raw.decode("utf-8", errors="replace").split(PROPERTY_SEPARATOR):
            name, separator, value = pair.partition(NAME_VALUE_SEPARATOR)
            if separator:
                properties[name] = value
    return properties


def split_keys(properties: dict[str, str]) -> list[str]:
    """Property KEYS split at spaces, empty keys dropped."""
    return [key for key in properties.get(PROPERTY_KEYS, "").split(" ") if key]


@dataclass(frozen=True, slots=True)
class Pairs:
    """Every name/value pair of a batch of records, in order: where each lies in ``data`` and whose it is."""

    data: npt.NDArray[np.uint8]
    record: Int64Array
    name_start: Int64Array
    name_end: Int64Array
    value_start: Int64Array
    value_end: Int64Array
    records: int

    def counts(self) -> Int64Array:
        return np.bincount(self.record, minlength=self.records).astype(np.int64)

    def names(self) -> pa.Array:
        return string_array(*gather_ranges(self.data, self.name_start, self.name_end - self.name_start))

    def values(self) -> pa.Array:
        return string_array(*gather_ranges(self.data, self.value_start, self.value_end - self.value_start))

    def map_array(self, map_type: pa.DataType) -> pa.Array:
        offsets = np.zeros(self.records + 1, dtype=np.int32)
        np.cumsum(self.counts(), out=offsets[1:])
        return pa.MapArray.from_arrays(pa.array(offsets), self.names(), self.values(), type=map_type)

    def value_of(self, name: str) -> tuple[Int64Array, Int64Array, npt.NDArray[np.bool_]]:
        """Per record: where the value of property ``name`` starts, its length, and whether the record has it."""
        wanted = np.frombuffer(name.encode(), dtype=np.uint8)
        start = np.zeros(self.records, dtype=np.int64)
        length = np.zeros(self.records, dtype=np.int64)
        present = np.zeros(self.records, dtype=np.bool_)
        candidates = np.flatnonzero(self.name_end - self.name_start == len(wanted))
        if len(candidates) and len(wanted):
            spans = self.name_start[candidates][:, None] + np.arange(len(wanted), dtype=np.int64)
            candidates = candidates[(self.data[spans] == wanted).all(axis=1)]
        found = self.record[candidates]
        start[found] = self.value_start[candidates]
        length[found] = self.value_end[candidates] - self.value_start[candidates]
        present[found] = True
        return start, length, present

    def string_of(self, name: str, *, empty_is_null: bool) -> pa.Array:
        """Property ``name`` of every record as a string column: null where absent (or empty, if so asked)."""
        start, length, present = self.value_of(name)
        valid = present & (length > 0) if empty_is_null else None
        return string_array(*gather_ranges(self.data, start, length), valid=valid)

    def keys_array(self, list_type: pa.DataType) -> pa.Array:
        """Property KEYS of every record split at spaces, empty keys dropped (none without KEYS)."""
        start, length, present = self.value_of(PROPERTY_KEYS)
        if not present.any():
            return pa.ListArray.from_arrays(
                pa.array(np.zeros(self.records + 1, np.int32)), pa.array([], pa.string()), type=list_type
            )
        whole = string_array(*gather_ranges(self.data, start, length))
        split = pc.split_pattern(whole, " ")
        keys = split.flatten()
        parents = np.asarray(pc.list_parent_indices(split))
        kept = np.asarray(pc.greater(pc.binary_length(keys), 0), dtype=np.bool_)
        offsets = np.zeros(self.records + 1, dtype=np.int32)
        np.cumsum(np.bincount(parents[kept], minlength=self.records), out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), keys.filter(pa.array(kept)), type=list_type)


def split_pairs(data: npt.NDArray[np.uint8], offsets: Int64Array) -> Pairs | None:
    """The pairs of the records whose properties are ``data[offsets[i]:offsets[i + 1]]``.

    None when the row-by-row rules must decide: a byte that is not ASCII (replaced or multi-byte text) or
    a name that may repeat within a record.
    """
    records = len(offsets) - 1
    if len(data) and int(data.max()) >= 0x80:
        return None
    breaks = np.flatnonzero(data == _PAIR_END)
    # A piece ends at a pair end or at its record's end; at the same place the record's end comes first.
    ends = np.concatenate([offsets[1:], breaks])
    after = np.concatenate([np.zeros(records, dtype=np.int64), np.ones(len(breaks), dtype=np.int64)])
    order = np.lexsort((after, ends))
    ends, after = ends[order], after[order]
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = offsets[0]
        starts[1:] = ends[:-1] + after[:-1]
    record = np.zeros(len(ends), dtype=np.int64)
    np.cumsum(after[:-1] == 0, out=record[1:])
    name_value = np.flatnonzero(data == _NAME_VALUE)
    first = np.searchsorted(name_value, starts)
    separator = name_value[np.minimum(first, len(name_value) - 1)] if len(name_value) else np.zeros_like(starts)
    paired = (first < len(name_value)) & (separator < ends) if len(name_value) else np.zeros(len(ends), np.bool_)
    pairs = Pairs(data, record[paired], starts[paired], separator[paired], separator[paired] + 1, ends[paired], records)
    return None if _may_repeat_a_name(pairs) else pairs


def _may_repeat_a_name(pairs: Pairs) -> bool:
    """Whether two pairs of one record may share a name (a fingerprint match; never misses a repeat)."""
    if len(pairs.record) < 2:
        return False
    lengths = pairs.name_end - pairs.name_start
    total = int(lengths.sum())
    place = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    index = np.repeat(pairs.name_start, lengths) + place
    weighted = pairs.data[index].astype(np.uint64) * _PLACE_WEIGHTS[place % len(_PLACE_WEIGHTS)]
    running = np.zeros(total + 1, dtype=np.uint64)
    np.cumsum(weighted, out=running[1:])
    ends = np.cumsum(lengths)
    fingerprint = running[ends] - running[ends - lengths]
    key = np.sort(fingerprint + pairs.record.astype(np.uint64) * _RECORD_WEIGHT + lengths.astype(np.uint64))
    return bool((key[1:] == key[:-1]).any())
