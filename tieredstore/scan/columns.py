"""Arrow columns of a run of records in the common layout (v1 magic, IPv4 hosts), built for the whole run.

The batch record engine (``tieredstore.formats.records``) gives every record's fixed head and field
positions at once; here they are checked against what the consume queue promised (sizes, body CRC, topic,
queue id, queue offset) and turned into Arrow columns with numpy gathers, not per-row Python objects. Only
the columns a query asked for are built. A record this path does not take (another layout, or one that
fails a check) is left to the row-by-row decoder in ``tieredstore.scan.reading``, which explains it with
the same message as ever.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from tieredstore.formats.arrays import as_values
from tieredstore.formats.message import (
    MAGIC_V1,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
)
from tieredstore.formats.records import Expected, Layout, PackedRun, first_problem, store_timestamps_of
from tieredstore.scan.buffers import ByteArray, Int64Array, gather_ranges, repeated_string, string_array
from tieredstore.scan.properties import Pairs, parse_properties, split_keys, split_pairs
from tieredstore.scan.schema import ARROW_SCHEMA

BoolArray = npt.NDArray[np.bool_]

# In the common layout the hosts part of a head is: born host, STORETIMESTAMP, store host, RECONSUMETIMES.
_STORE_HOST = slice(16, 24)
_RECONSUME_TIMES = slice(24, 28)
_IPV6_BITS = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
# The row-by-row decoder takes records shorter than its 88-byte head and three length bytes itself.
_SHORTEST_COMMON = 88 + 3
# Each byte's two upper-case hex digits as one little-endian 16-bit item: one lookup writes both digits.
_HEX_PAIRS = np.array([int.from_bytes(f"{byte:02X}".encode(), "little") for byte in range(256)], dtype="<u2")


def checked_prefix(run: PackedRun, layout: Layout, topic: str, queue_id: int, queue_offsets: Int64Array) -> int:
    """How many leading records of ``run`` are in the common layout (the others take the row decoder) and are
    what the consume queue promised: the batch record engine's check with Spark's rule."""
    heads = run.heads
    common = (heads["magic"] == MAGIC_V1) & ((heads["sysflag"] & _IPV6_BITS) == 0) & (run.sizes >= _SHORTEST_COMMON)
    taken = len(common) if bool(common.all()) else int(np.argmin(common))
    rule = Expected(topic=_topic_bytes(topic), queue_id=queue_id, queue_offsets=queue_offsets)
    bad = first_problem(run, rule, layout=layout)
    return taken if bad is None else min(bad, taken)


@functools.lru_cache(maxsize=256)
def _topic_bytes(topic: str) -> bytes:
    return topic.encode("utf-8")


class RowProperties:
    """The properties of a run read record by record: the rare case ``split_pairs`` leaves to the row rules."""

    def __init__(self, raws: Sequence[bytes]) -> None:
        self.dicts = [parse_properties(raw) for raw in raws]

    def map_array(self, map_type: pa.DataType) -> pa.Array:
        offsets = np.zeros(len(self.dicts) + 1, dtype=np.int32)
        np.cumsum([len(properties) for properties in self.dicts], out=offsets[1:])
        names = pa.array([name for properties in self.dicts for name in properties], pa.string())
        values = pa.array([value for properties in self.dicts for value in properties.values()], pa.string())
        return pa.MapArray.from_arrays(pa.array(offsets), names, values, type=map_type)

    def string_of(self, name: str, *, empty_is_null: bool) -> pa.Array:
        if empty_is_null:
            return pa.array([properties.get(name) or None for properties in self.dicts], pa.string())
        return pa.array([properties.get(name, "") for properties in self.dicts], pa.string())

    def keys_array(self, list_type: pa.DataType) -> pa.Array:
        return pa.array([split_keys(properties) for properties in self.dicts], list_type)


class RunColumns:
    """The columns of the records of a run, each built when it is first asked for."""

    def __init__(self, run: PackedRun, layout: Layout, topic: str, queue_id: int) -> None:
        self.run = run
        self.layout = layout
        self.topic = topic
        self.queue_id = queue_id
        self.flat: ByteArray = np.frombuffer(run.data, dtype=np.uint8)
        self._properties: Pairs | RowProperties | None = None

    def __len__(self) -> int:
        return len(self.run.starts)

    @property
    def properties(self) -> Pairs | RowProperties:
        if self._properties is None:
            starts = self.run.starts + self.layout.properties_at
            data, offsets = gather_ranges(self.flat, starts, self.layout.properties_length)
            pairs = split_pairs(data, offsets)
            self._properties = (
                pairs
                if pairs is not None
                else RowProperties([data[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(self))])
            )
        return self._properties

    def batch(self, names: Sequence[str]) -> pa.RecordBatch:
        schema = pa.schema([ARROW_SCHEMA.field(name) for name in names])
        return pa.RecordBatch.from_arrays([_BUILDERS[name](self) for name in names], schema=schema)

    def _type(self, name: str) -> pa.DataType:
        return ARROW_SCHEMA.field(name).type

    def _int32(self, values: npt.NDArray[Any]) -> pa.Array:
        return pa.array(values.astype(np.int32), pa.int32())

    def topic_column(self) -> pa.Array:
        return repeated_string(self.topic, len(self))

    def queue_id_column(self) -> pa.Array:
        return pa.array(np.full(len(self), self.queue_id, dtype=np.int32), pa.int32())

    def queue_offset_column(self) -> pa.Array:
        return pa.array(self.run.heads["queue_offset"].astype(np.int64), pa.int64())

    def commitlog_offset_column(self) -> pa.Array:
        return pa.array(self.run.heads["physical_offset"].astype(np.int64), pa.int64())

    def store_timestamp_column(self) -> pa.Array:
        return pa.array(store_timestamps_of(self.run.heads) * 1000, self._type("store_timestamp"))

    def born_timestamp_column(self) -> pa.Array:
        return pa.array(self.run.heads["born_timestamp"].astype(np.int64) * 1000, self._type("born_timestamp"))

    def keys_column(self) -> pa.Array:
        return self.properties.keys_array(self._type("keys"))

    def tags_column(self) -> pa.Array:
        return self.properties.string_of(PROPERTY_TAGS, empty_is_null=True)

    def properties_column(self) -> pa.Array:
        return self.properties.map_array(self._type("properties"))

    def msg_id_column(self) -> pa.Array:
        unique_keys = self.properties.string_of(PROPERTY_UNIQ_KEY, empty_is_null=True)
        if unique_keys.null_count == 0:
            return unique_keys
        if unique_keys.null_count == len(self):
            return self._offset_message_ids()
        return pc.if_else(pc.is_valid(unique_keys), unique_keys, self._offset_message_ids())

    def _offset_message_ids(self) -> pa.Array:
        """The offset message id of each record: store host and commit-log offset, in upper-case hex."""
        heads = self.run.heads
        raw = np.empty((len(self), 16), dtype=np.uint8)
        raw[:, :8] = heads["hosts"][:, _STORE_HOST]
        raw[:, 8:] = heads["physical_offset"].astype(">i8").view(np.uint8).reshape(len(self), 8)
        digits: ByteArray = _HEX_PAIRS[raw].view(np.uint8).reshape(-1)
        return string_array(digits, np.arange(len(self) + 1, dtype=np.int64) * 32)

    def body_column(self) -> pa.Array:
        data, offsets = gather_ranges(self.flat, self.run.starts + self.layout.body_at, self.layout.body_length)
        return string_array(data, offsets, arrow_type=pa.binary())

    def body_crc_column(self) -> pa.Array:
        return self._int32(self.run.heads["body_crc"])

    def reconsume_times_column(self) -> pa.Array:
        return self._int32(as_values(self.run.heads["hosts"][:, _RECONSUME_TIMES], ">i4"))

    def sysflag_column(self) -> pa.Array:
        return self._int32(self.run.heads["sysflag"])


_BUILDERS: dict[str, Callable[[RunColumns], pa.Array]] = {
    name: getattr(RunColumns, f"{name}_column") for name in ARROW_SCHEMA.names
}
