"""Writing a commit's rows as the table's Parquet data files, in a thread beside the decoding of the next rows.

``Table.append`` takes a commit's rows as one Arrow table and first copies all of it to split it by day. Here
the sync hands each decoded batch to a ``DataFileWriter``, whose thread splits it by partition only when it
spans several (a batch of one day, as nearly every batch of a live topic is, goes whole) and appends it to
that partition's open file. A file encodes a row group whenever the table's
``write.parquet.row-group-size-bytes`` of Arrow (Iceberg's 128 MiB by default) or its
``write.parquet.row-group-limit`` rows wait, and the rest when it is closed, which the sync does in its
committer thread while it decodes the next batch; Parquet encoding, zstd and the upload run in Arrow's C++
code, which releases the GIL. Row groups stay as large as Iceberg's default: each repeats its dictionaries,
which are most of a file whose bodies repeat.

The files are written through the table's FileIO under its data folder, named as pyiceberg names them, with
the table's Parquet properties; ``finish`` closes them and gives pyiceberg ``DataFile``s with the statistics
its own writer computes, for the caller to commit in one snapshot. Rows keep the order they were handed in:
a split by day keeps each day's rows in order.
"""

from __future__ import annotations

import itertools
import queue
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tieredstore.errors import StorageError
from tieredstore.table.schema import parquet_schema, sort_order

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.partitioning import PartitionKey
    from pyiceberg.table import Table

# Stores a closed file's bytes at its path (a URL under the cold URL), raising StorageError when it cannot.
Upload: TypeAlias = Callable[[str, bytes], None]

# Decoded batches waiting for the thread: a few, so memory stays bounded when writing is the slower side.
QUEUE_BATCHES = 4

_FINISH = object()  # no more rows: close the files
_ABORT = object()  # the sync failed: drop the files (they are orphans either way)


@dataclass(slots=True)
class _OpenFile:
    """One partition's data file being written, and the batches waiting for its next row group."""

    path: str
    partition_key: PartitionKey | None
    stream: Any  # the FileIO's output stream (pyarrow's NativeFile)
    writer: pq.ParquetWriter
    row_bytes: int  # the table's write.parquet.row-group-size-bytes, in Arrow bytes
    row_limit: int  # the table's write.parquet.row-group-limit
    upload: Upload | None  # the stream is a buffer this PUTs when the file is closed
    footer: list[pq.FileMetaData] = field(default_factory=list)  # filled by the writer when it closes
    pending: list[pa.RecordBatch] = field(default_factory=list)
    pending_bytes: int = 0
    pending_rows: int = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.pending_bytes += batch.nbytes
        self.pending_rows += batch.num_rows
        if self.pending_bytes >= self.row_bytes or self.pending_rows >= self.row_limit:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            # pyarrow starts a new row group at every write: what waited is one (or several of row_limit rows).
            self.writer.write_table(pa.Table.from_batches(self.pending), row_group_size=self.row_limit)
            self.pending, self.pending_bytes, self.pending_rows = [], 0, 0

    def close(self) -> int:
        """Write the footer and close the stream (storing the file, when it is uploaded whole); its size."""
        self.flush()
        self.writer.close()
        size = int(self.stream.tell())  # what was written: no HEAD request on S3
        if self.upload is not None:
            self.upload(self.path, self.stream.getvalue().to_pybytes())
        self.stream.close()
        return size


class DataFileWriter:
    """Parquet data files of ``table`` for the batches ``add`` is given, written by a thread of its own.

    With ``upload``, each file is encoded into memory and given to it whole when closed (one PUT through our
    own S3 client, as the archive's objects are sent); without, it is streamed through the table's FileIO.
    ``finish`` waits for the thread and gives the files' ``DataFile``s; ``abort`` stops it when the sync fails
    (the files written so far are then referenced by no snapshot: ``orphans`` removes them). An error of the
    thread is raised by the next ``add`` or by ``finish``, an ``OSError`` of the storage as ``StorageError``.
    """

    def __init__(self, table: Table, upload: Upload | None = None) -> None:
        from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs, compute_statistics_plan, parquet_path_to_id_mapping
        from pyiceberg.table import TableProperties
        from pyiceberg.table.locations import load_location_provider
        from pyiceberg.utils.properties import property_as_int

        metadata = table.metadata
        self._topic = table.name()[-1]
        self._io: FileIO = table.io
        self._upload = upload
        self._schema = metadata.schema()
        self._spec = metadata.spec()
        self._spec_id = metadata.default_spec_id
        self._format_version = metadata.format_version
        self._file_schema = parquet_schema(self._schema)
        # The table's write properties, read as pyiceberg's own writer reads them.
        # The row-group size pyiceberg warns it does not implement is implemented here: not passed on.
        parquet_properties = {
            name: value
            for name, value in metadata.properties.items()
            if name != TableProperties.PARQUET_ROW_GROUP_SIZE_BYTES
        }
        self._writer_options = _get_parquet_writer_kwargs(parquet_properties)
        self._statistics_plan = compute_statistics_plan(self._schema, metadata.properties)
        self._column_ids = parquet_path_to_id_mapping(self._schema)
        self._row_bytes: int = (
            property_as_int(metadata.properties, TableProperties.PARQUET_ROW_GROUP_SIZE_BYTES)
            or TableProperties.PARQUET_ROW_GROUP_SIZE_BYTES_DEFAULT
        )
        self._row_limit: int = (
            property_as_int(metadata.properties, TableProperties.PARQUET_ROW_GROUP_LIMIT)
            or TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT
        )
        self._locations = load_location_provider(metadata.location, metadata.properties)
        # Rows are written in (queue_id, queue_offset) order: the files say so when the table's order is that.
        declared = metadata.sort_order()
        self._sort_order_id = declared.order_id if declared.fields == sort_order(self._schema).fields else None
        self._write_uuid = uuid.uuid4()
        self._file_numbers = itertools.count()
        self._open: dict[tuple[Any, ...], _OpenFile] = {}
        self._data_files: list[DataFile] = []
        self._failure: BaseException | None = None
        self._queue: queue.Queue[object] = queue.Queue(maxsize=QUEUE_BATCHES)
        self._thread = threading.Thread(target=self._run, name="table-data-files", daemon=True)
        self._thread.start()

    def add(self, batch: pa.RecordBatch) -> None:
        """Queue ``batch`` (``ARROW_SCHEMA``'s columns) for writing; waits while the thread is behind."""
        self._raise_failure()
        self._queue.put(batch)

    def finish(self) -> list[DataFile]:
        """Close every file and give their ``DataFile``s (none when no rows were added)."""
        self._queue.put(_FINISH)
        self._thread.join()
        self._raise_failure()
        return self._data_files

    def abort(self) -> None:
        """Stop the thread and drop what it wrote; safe after ``finish`` and after a failure."""
        if self._thread.is_alive():
            self._queue.put(_ABORT)
            self._thread.join()

    def _raise_failure(self) -> None:
        if isinstance(self._failure, OSError):
            # pyarrow's file systems raise plain OSErrors: the cold tier refused or could not be reached.
            raise StorageError(f"table {self._topic}: writing its files failed: {self._failure}") from self._failure
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _FINISH or item is _ABORT:
                break
            if self._failure is not None:
                continue  # keep taking batches, so that the sync's next add sees the failure instead of waiting
            try:
                self._write(item)
            except BaseException as error:  # noqa: BLE001  (raised again in the sync's thread)
                self._failure = error
        try:
            if item is _FINISH and self._failure is None:
                self._data_files = [self._data_file(open_file) for open_file in self._open.values()]
        except BaseException as error:  # noqa: BLE001  (raised again by finish)
            self._failure = error
        finally:
            self._drop_unclosed()

    def _drop_unclosed(self) -> None:
        for open_file in self._open.values():
            if not open_file.stream.closed:
                try:
                    open_file.writer.close()  # the footer of the row groups written, without those waiting
                    open_file.stream.close()
                except OSError:
                    pass  # an unfinished file is an orphan whatever its state
        self._open.clear()

    def _write(self, batch: pa.RecordBatch) -> None:
        rows = pa.RecordBatch.from_arrays(batch.columns, schema=self._file_schema)
        for key, part in self._partitions(rows):
            open_file = self._open.get(key)
            if open_file is None:
                open_file = self._open[key] = self._new_file(key)
            open_file.add(part)

    def _partitions(self, batch: pa.RecordBatch) -> Iterator[tuple[tuple[Any, ...], pa.RecordBatch]]:
        """``batch`` split by partition key, each part's rows in their order; whole when one key covers it."""
        values = [
            spec_field.transform.pyarrow_transform(self._schema.find_type(spec_field.source_id))(
                batch.column(self._schema.find_column_name(spec_field.source_id))
            )
            for spec_field in self._spec.fields
        ]
        if all(column.null_count == 0 and _single_value(column) for column in values):
            yield tuple(column[0].as_py() for column in values), batch
            return
        keys = pa.table({str(position): column for position, column in enumerate(values)})
        for key in keys.group_by(keys.column_names, use_threads=False).aggregate([]).to_pylist():
            mask = None
            for name, column in zip(keys.column_names, values, strict=True):
                value = key[name]
                match = pc.is_null(column) if value is None else pc.equal(column, pa.scalar(value, column.type))
                mask = match if mask is None else pc.and_(mask, match)
            yield tuple(key[name] for name in keys.column_names), batch.filter(mask)

    def _new_file(self, key: tuple[Any, ...]) -> _OpenFile:
        from pyiceberg.partitioning import PartitionFieldValue, PartitionKey

        partition_key = (
            PartitionKey(
                field_values=[
                    PartitionFieldValue(field=spec_field, value=value)
                    for spec_field, value in zip(self._spec.fields, key, strict=True)
                ],
                partition_spec=self._spec,
                schema=self._schema,
            )
            if self._spec.fields
            else None
        )
        name = f"00000-{next(self._file_numbers)}-{self._write_uuid}.parquet"
        path = self._locations.new_data_location(data_file_name=name, partition_key=partition_key)
        if self._upload is not None:
            stream: Any = pa.BufferOutputStream()
        else:
            stream = self._io.new_output(path).create(overwrite=True)  # a new uuid's name: no existence check
        footer: list[pq.FileMetaData] = []
        try:
            writer = pq.ParquetWriter(
                stream,
                self._file_schema,
                metadata_collector=footer,
                store_decimal_as_integer=True,
                **self._writer_options,
            )
        except BaseException:
            stream.close()
            raise
        return _OpenFile(path, partition_key, stream, writer, self._row_bytes, self._row_limit, self._upload, footer)

    def _data_file(self, open_file: _OpenFile) -> DataFile:
        from pyiceberg.io.pyarrow import data_file_statistics_from_parquet_metadata
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.typedef import Record

        size = open_file.close()
        statistics = data_file_statistics_from_parquet_metadata(
            open_file.footer[0], self._statistics_plan, self._column_ids
        )
        return DataFile.from_args(
            _table_format_version=self._format_version,
            content=DataFileContent.DATA,
            file_path=open_file.path,
            file_format=FileFormat.PARQUET,
            partition=open_file.partition_key.partition if open_file.partition_key is not None else Record(),
            file_size_in_bytes=size,
            sort_order_id=self._sort_order_id,
            spec_id=self._spec_id,
            equality_ids=None,
            key_metadata=None,
            **statistics.to_serialized_dict(),
        )


def _single_value(column: pa.Array) -> bool:
    if len(column) == 0:
        return False
    bounds = pc.min_max(column)
    return bool(bounds["min"] == bounds["max"])
