"""Filter pushdown: which Spark filters prune the scan, as one ScanFilter; the rest go back to Spark.

Pushed filters are taken over completely (Spark does not evaluate them again), so each one is either
exact at partition level (topic, queue_id) or re-checked on every row (queue_offset, store_timestamp).

    topic           =, IN
    queue_id        =, IN, <, <=, >, >=
    queue_offset    =, <, <=, >, >=
    store_timestamp =, <, <=, >, >=
    IS NOT NULL     on every column that is never null (all but tags)

Anything else (NOT, OR, LIKE, filters on other columns) is returned to Spark unchanged.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

from tieredstore.scan.filters import ScanFilter

NON_NULL_COLUMNS = frozenset(
    {
        "topic",
        "queue_id",
        "queue_offset",
        "commitlog_offset",
        "store_timestamp",
        "born_timestamp",
        "keys",
        "properties",
        "msg_id",
        "body",
        "body_crc",
        "reconsume_times",
        "sysflag",
    }
)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MICROSECOND = datetime.timedelta(microseconds=1)


def _narrow_start(current: int | None, value: int) -> int:
    return value if current is None else max(current, value)


def _narrow_end(current: int | None, value: int) -> int:
    return value if current is None else min(current, value)


def _micros(value: Any) -> int | None:
    if not isinstance(value, datetime.datetime) or value.tzinfo is None:
        return None
    return (value - _EPOCH) // _MICROSECOND


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bounds(spark_filter: Filter, number: int) -> tuple[int | None, int | None] | None:
    """(start, end) of the half-open range a comparison allows on an integer axis."""
    if isinstance(spark_filter, EqualTo):
        return number, number + 1
    if isinstance(spark_filter, GreaterThan):
        return number + 1, None
    if isinstance(spark_filter, GreaterThanOrEqual):
        return number, None
    if isinstance(spark_filter, LessThan):
        return None, number
    if isinstance(spark_filter, LessThanOrEqual):
        return None, number + 1
    return None


_COMPARISONS = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


def _apply(scan: ScanFilter, spark_filter: Filter) -> ScanFilter | None:
    """``scan`` narrowed by ``spark_filter``, or None when the filter is not one this source takes."""
    attribute: tuple[str, ...] = getattr(spark_filter, "attribute", ())
    if len(attribute) != 1:
        return None
    column = attribute[0]
    if isinstance(spark_filter, IsNotNull):
        return scan if column in NON_NULL_COLUMNS else None
    value: Any = getattr(spark_filter, "value", None)
    if column == "topic":
        values: list[Any] | None = (
            [value] if isinstance(spark_filter, EqualTo) else list(value) if isinstance(spark_filter, In) else None
        )
        if values is None or not all(isinstance(v, str) for v in values):
            return None
        topics = frozenset(values) if scan.topics is None else scan.topics & frozenset(values)
        return replace(scan, topics=topics)
    if column == "queue_id" and isinstance(spark_filter, In):
        numbers = [_whole(v) for v in value]
        if any(n is None for n in numbers):
            return None
        allowed = frozenset(n for n in numbers if n is not None)
        return replace(scan, queue_ids=allowed if scan.queue_ids is None else scan.queue_ids & allowed)
    if not isinstance(spark_filter, _COMPARISONS):
        return None
    if column in ("queue_id", "queue_offset"):
        number = _whole(value)
        bounds = None if number is None else _bounds(spark_filter, number)
        if bounds is None:
            return None
        start, end = bounds
        if column == "queue_id":
            return replace(
                scan,
                queue_id_start=scan.queue_id_start if start is None else _narrow_start(scan.queue_id_start, start),
                queue_id_end=scan.queue_id_end if end is None else _narrow_end(scan.queue_id_end, end),
            )
        return replace(
            scan,
            queue_offset_start=scan.queue_offset_start if start is None else max(scan.queue_offset_start, start),
            queue_offset_end=scan.queue_offset_end if end is None else _narrow_end(scan.queue_offset_end, end),
        )
    if column == "store_timestamp":
        micros = _micros(value)
        bounds = None if micros is None else _bounds(spark_filter, micros)
        if bounds is None:
            return None
        start, end = bounds
        return replace(
            scan,
            timestamp_start_us=(
                scan.timestamp_start_us if start is None else _narrow_start(scan.timestamp_start_us, start)
            ),
            timestamp_end_us=scan.timestamp_end_us if end is None else _narrow_end(scan.timestamp_end_us, end),
        )
    return None


def push_filters(filters: Iterable[Filter]) -> tuple[ScanFilter, list[Filter]]:
    """The ScanFilter of the filters this source takes, and the others (the same objects) for Spark."""
    scan = ScanFilter()
    unsupported: list[Filter] = []
    for spark_filter in filters:
        narrowed = _apply(scan, spark_filter)
        if narrowed is None:
            unsupported.append(spark_filter)
        else:
            scan = narrowed
    return scan, unsupported
