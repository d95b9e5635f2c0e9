"""Planning a read through a topic's Iceberg table: its Parquet files below each queue's table offset, the
archive from there on.

For each queue the table holds offsets [first archived, table offset) (``tieredstore.table.offsets``); the
archive holds [first archived, archived offset). A read through the table takes the first range from the
table's data files and the rest, [table offset, archived offset), from the archive, so it returns exactly
the rows the archive alone would: offsets retention has trimmed from the archive are dropped from the
table's rows too, and queues the table does not hold come wholly from the archive. The table's offsets and
files are read from one snapshot, so a sync committing meanwhile changes neither.

The pushed filters become a pyiceberg expression (queue ids, queue offsets, store times), so the table's
partitions (days) and each file's column bounds prune files; every row is checked again when it is read
(``tieredstore.table.read_files``). A file larger than ``max_partition_bytes`` is read as several partitions
of whole row groups.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from tieredstore.errors import ConfigError, MissingExtraError, TieredStoreError
from tieredstore.providers.registry import url_scheme
from tieredstore.scan.filters import ScanFilter
from tieredstore.scan.layout import QueueLayout
from tieredstore.scan.options import CATALOG_SECRET_OPTIONS, ScanOptions, TableMode
from tieredstore.scan.planning import PartitionPlan, plan_queues, plan_scan, queue_layouts
from tieredstore.scan.session import open_scan_provider
from tieredstore.table.catalog import first_line, open_catalog_at, s3_file_io_properties
from tieredstore.table.offsets import read_offsets

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

QueueRange = tuple[int, int, int]  # (queue_id, start, end): the offsets a file's rows are taken from


@dataclass(frozen=True, slots=True)
class TableFilePlan:
    """One task's work from a topic's table: one Parquet file, or row groups [first, end) of it.

    Rows are kept when their offset lies in their queue's range of ``queue_ranges`` and ``scan_filter``
    matches them. Holds no credentials: it is pickled to executors and shown by Spark.
    """

    topic: str
    path: str
    size: int
    row_groups: tuple[int, int] | None  # None: every row group
    queue_ranges: tuple[QueueRange, ...]
    scan_filter: ScanFilter

    def __str__(self) -> str:
        groups = "" if self.row_groups is None else f" row groups [{self.row_groups[0]}, {self.row_groups[1]})"
        return f"{self.topic} table file {self.path}{groups}"


ReadPlan: TypeAlias = PartitionPlan | TableFilePlan


def row_group_ranges(split_offsets: Sequence[int] | None, file_size: int, budget: int) -> list[tuple[int, int] | None]:
    """Row groups of a file cut into ranges of about ``budget`` bytes (whole groups), by where each group starts;
    ``[None]`` (the whole file) when it is within the budget or its groups are not known."""
    if not split_offsets or len(split_offsets) < 2 or file_size <= budget:
        return [None]
    ends = [*split_offsets[1:], file_size]
    ranges: list[tuple[int, int] | None] = []
    first = 0
    for index, end in enumerate(ends):
        if end - split_offsets[first] >= budget or index == len(ends) - 1:
            ranges.append((first, index + 1))
            first = index + 1
    return ranges


def table_ranges(layouts: Sequence[QueueLayout], offsets: dict[int, int], scan_filter: ScanFilter) -> list[QueueRange]:
    """Each queue's offsets to read from the table: what it holds that is still archived and the filter allows."""
    ranges = []
    for layout in layouts:
        start = max(layout.min_offset, scan_filter.queue_offset_start)
        end = min(offsets.get(layout.queue_id, 0), layout.max_offset)
        if scan_filter.queue_offset_end is not None:
            end = min(end, scan_filter.queue_offset_end)
        if start < end:
            ranges.append((layout.queue_id, start, end))
    return ranges


def iceberg_filter(scan_filter: ScanFilter, ranges: Sequence[QueueRange]) -> BooleanExpression:
    """What pyiceberg prunes partitions and files by: the queues and offsets taken from the table, and the
    store-time range (whole milliseconds, as the rows are re-checked)."""
    from pyiceberg.expressions import And, GreaterThanOrEqual, In, LessThan, Reference
    from pyiceberg.expressions.literals import literal

    # Keyword arguments: what pyiceberg's pydantic models declare (and what mypy checks).
    def at_least(column: str, value: int) -> BooleanExpression:
        return GreaterThanOrEqual(term=Reference(column), value=literal(value))

    def below(column: str, value: int) -> BooleanExpression:
        return LessThan(term=Reference(column), value=literal(value))

    expression: BooleanExpression = And(
        In(term=Reference("queue_id"), values={literal(queue_id) for queue_id, _, _ in ranges}),
        And(
            at_least("queue_offset", min(start for _, start, _ in ranges)),
            below("queue_offset", max(end for _, _, end in ranges)),
        ),
    )
    if scan_filter.time_start_ms is not None:
        expression = And(expression, at_least("store_timestamp", scan_filter.time_start_ms * 1000))
    if scan_filter.time_end_ms is not None:
        expression = And(expression, below("store_timestamp", scan_filter.time_end_ms * 1000))
    return expression


def _no_table(options: ScanOptions, reason: str) -> dict[str, Table]:
    if options.table is TableMode.TRUE:
        raise ConfigError(f"option table=true but {reason}; sync it (tieredstore table sync) or use table=auto")
    log.info("reading the archive alone: %s", reason)
    return {}


def open_tables(options: ScanOptions, topics: Sequence[str]) -> dict[str, Table]:
    """The table of each of ``topics`` that has one, by topic; with table=true, ConfigError for one without."""
    if options.table is TableMode.FALSE or not topics:
        return {}
    if options.metadata_url is None and options.catalog_uri is None:
        return _no_table(options, "no catalog is given (metadata_url holds its SQL catalog; or give catalog_uri)")
    try:
        catalog = open_catalog_at(
            options.metadata_url,
            options.catalog_uri,
            io_properties(options),
            create_tables=False,
            rest_properties=rest_properties(options),
        )
        tables = {topic: _load(catalog, options.table_namespace, topic) for topic in topics}
    except ConfigError:
        raise
    except (TieredStoreError, MissingExtraError) as error:
        return _no_table(options, f"the Iceberg catalog cannot be read: {error}")
    except Exception as error:  # noqa: BLE001  (SQLAlchemy's when the catalog's tables were never created, a REST client's)
        return _no_table(options, f"the Iceberg catalog cannot be read: {first_line(error)}")
    missing = [topic for topic, table in tables.items() if table is None]
    if missing:
        namespace = options.table_namespace
        _no_table(options, f"topic(s) {missing} have no Iceberg table in namespace {namespace!r}")
    return {topic: table for topic, table in tables.items() if table is not None}


def rest_properties(options: ScanOptions) -> dict[str, str]:
    """A REST catalog's properties of a read: its options', and the credentials from the variables or files
    they name, read where the read is planned (Spark's Python worker on the driver)."""
    properties = dict(options.catalog_properties)
    for option, where in options.catalog_secrets.items():
        if option.endswith("_env"):
            value = os.environ.get(where, "").strip()
            if not value:
                raise ConfigError(f"option {option} names {where}, which is not set where the read is planned")
        else:
            try:
                value = Path(where).read_text(encoding="utf-8").strip()
            except OSError as error:
                raise ConfigError(f"option {option}: cannot read {where}: {error.strerror}") from error
        properties[CATALOG_SECRET_OPTIONS[option]] = value
    return properties


def io_properties(options: ScanOptions) -> dict[str, str]:
    """pyiceberg FileIO properties of a read's cold URL and S3 options (secrets: never put in a plan)."""
    return s3_file_io_properties(options.provider_options) if url_scheme(options.cold_url) == "s3" else {}


def _load(catalog: Catalog, namespace: str, topic: str) -> Table | None:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table((namespace, topic))
    except NoSuchTableError:
        return None


def _file_plans(
    table: Table, topic: str, ranges: list[QueueRange], scan_filter: ScanFilter, budget: int
) -> list[TableFilePlan] | None:
    """The partitions of the table's files for ``ranges``; None when a file has deletes to apply (which
    this reader does not apply: the archive is read instead)."""
    snapshot = table.current_snapshot()
    if not ranges or snapshot is None:
        return []
    scan = table.scan(row_filter=iceberg_filter(scan_filter, ranges), snapshot_id=snapshot.snapshot_id)
    plans = []
    for task in scan.plan_files():
        if task.delete_files:
            log.warning("table %s: %s has delete files; reading the archive instead", topic, task.file.file_path)
            return None
        data = task.file
        for groups in row_group_ranges(data.split_offsets, data.file_size_in_bytes, budget):
            plans.append(
                TableFilePlan(topic, data.file_path, data.file_size_in_bytes, groups, tuple(ranges), scan_filter)
            )
    return plans


async def plan_read(options: ScanOptions, scan_filter: ScanFilter | None = None) -> list[ReadPlan]:
    """Every partition of a read: table files where ``options.table`` and the topic's table allow, the archive
    for the rest. Runs on the driver."""
    scan_filter = scan_filter or ScanFilter()
    topics = [topic for topic in options.topics if scan_filter.allows_topic(topic)]
    tables = await asyncio.to_thread(open_tables, options, topics)
    if not tables:
        return list(await plan_scan(options, scan_filter))
    async with open_scan_provider(options) as provider:
        layouts = await queue_layouts(provider, options, scan_filter)
        table_plans: list[ReadPlan] = []
        from_table: dict[tuple[str, int], int] = {}
        for topic, table in tables.items():
            own = [layout for layout in layouts if layout.topic == topic]
            offsets = read_offsets(table)
            ranges = table_ranges(own, offsets, scan_filter)
            files = await asyncio.to_thread(_file_plans, table, topic, ranges, scan_filter, options.max_partition_bytes)
            if files is None:
                continue
            table_plans.extend(files)
            from_table.update({(topic, queue_id): end for queue_id, _, end in ranges})

        def rest(layout: QueueLayout) -> ScanFilter:
            # The archive from where the table's rows end (the filter's own start if that is later).
            start = max(scan_filter.queue_offset_start, from_table.get((layout.topic, layout.queue_id), 0))
            return dataclasses.replace(scan_filter, queue_offset_start=start)

        archive_plans = await plan_queues(provider, options, layouts, rest)
    log.info(
        "planned %d table partitions and %d archive partitions for %s", len(table_plans), len(archive_plans), options
    )
    return table_plans + list(archive_plans)


def plan_read_partitions(options: ScanOptions, scan_filter: ScanFilter | None = None) -> list[ReadPlan]:
    """``plan_read`` in an event loop of its own (the Spark planning worker has none)."""
    return asyncio.run(plan_read(options, scan_filter))
