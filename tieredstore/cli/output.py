"""One output abstraction for every command: rich tables for people, stable JSON for scripts."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

OutputFormat = Literal["text", "json"]
PIPED_WIDTH = 240


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "value") and hasattr(value, "name"):  # enums
        return value.value
    return value


class Output:
    """Where a command's results go; chosen once at the root command by ``--output``."""

    def __init__(self, fmt: OutputFormat = "text") -> None:
        self.format = fmt
        self.console = Console(soft_wrap=True)
        if not self.console.is_terminal and "COLUMNS" not in os.environ:
            # Piped into a file or another program: 80 columns would fold every table row.
            self.console.width = PIPED_WIDTH
        self.err = Console(stderr=True, soft_wrap=True)

    def progress(self, enabled: bool, *columns: ProgressColumn | str) -> Progress:
        """A progress bar on stderr (stdout stays the result): description, bar, done/total, ``columns``, elapsed."""
        return Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            *columns,
            TimeElapsedColumn(),
            console=self.err,
            disable=not enabled,
            transient=False,
        )

    @property
    def is_json(self) -> bool:
        return self.format == "json"

    def table(
        self,
        title: str,
        columns: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
        *,
        formatters: Mapping[str, Callable[[Any], str]] | None = None,
    ) -> None:
        """A list of records: a table in text mode, ``{"title":..., "rows": [...]}`` in JSON.

        ``formatters`` render a column's values for people (times, sizes); JSON keeps the raw values.
        """
        if self.is_json:
            self.json({"title": title, "rows": [dict(r) for r in rows]})
            return
        self.console.print(self.render_table(title, columns, rows, formatters=formatters))

    def render_table(
        self,
        title: str,
        columns: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
        *,
        formatters: Mapping[str, Callable[[Any], str]] | None = None,
    ) -> Table:
        """The rich table ``table`` prints in text mode (for live views that redraw it)."""
        render = formatters or {}
        table = Table(title=title)
        for column in columns:
            # Fold, never truncate: a shortened offset or topic name would be a wrong answer.
            table.add_column(column, overflow="fold")
        for row in rows:
            cells = []
            for column in columns:
                value = row.get(column)
                if value is None:
                    cells.append("")
                elif column in render:
                    cells.append(render[column](value))
                else:
                    cells.append(str(value))
            table.add_row(*(Text(cell) for cell in cells))
        return table

    def record(self, title: str, values: Mapping[str, Any]) -> None:
        """One record: ``key: value`` lines in text mode, the object in JSON."""
        if self.is_json:
            self.json(dict(values))
            return
        self.console.print(f"[bold]{title}[/bold]")
        for key, value in values.items():
            self.console.print(f"  {key}: {value}", markup=False, highlight=False)

    def json(self, value: Any) -> None:
        sys.stdout.write(json.dumps(_jsonable(value), sort_keys=True) + "\n")
        sys.stdout.flush()

    def line(self, text: str) -> None:
        if self.is_json:
            return
        self.console.print(text, markup=False, highlight=False)

    def note(self, text: str) -> None:
        """Progress and remarks for people; on stderr so JSON on stdout stays clean."""
        self.err.print(text, markup=False, highlight=False)
