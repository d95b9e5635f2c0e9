"""The ``tieredstore`` root command: global options chosen once, typed errors mapped to exit codes.

Exit codes (stable, documented in docs/reference/cli.md):
  0 ok · 1 other tieredstore error · 2 usage · 3 not found · 4 storage unreachable or refused ·
  5 integrity failure (corrupt data, verify found problems) · 6 schema mismatch · 7 bad configuration ·
  8 hot store full · 130 interrupted
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer.exceptions import TyperException

from tieredstore import errors
from tieredstore.cli.output import Output, OutputFormat
from tieredstore.config import TieredStoreConfig, load_config
from tieredstore.logs import configure_logging

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_STORAGE = 4
EXIT_INTEGRITY = 5
EXIT_SCHEMA = 6
EXIT_CONFIG = 7
EXIT_STORE_FULL = 8
EXIT_INTERRUPTED = 130

# Most specific first: the first class an error is an instance of decides the code.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (errors.ConfigError, EXIT_CONFIG),
    (errors.SchemaVersionError, EXIT_SCHEMA),
    (errors.IntegrityError, EXIT_INTEGRITY),
    (errors.StoreFullError, EXIT_STORE_FULL),
    (errors.ValidationError, EXIT_USAGE),
    (errors.NotFoundError, EXIT_NOT_FOUND),
    (errors.SegmentNotFoundError, EXIT_NOT_FOUND),
    (errors.StorageError, EXIT_STORAGE),
    (errors.MetadataUnavailableError, EXIT_STORAGE),
    (errors.MissingExtraError, EXIT_CONFIG),
    (errors.TieredStoreError, EXIT_ERROR),
)


class IntegrityFailure(errors.IntegrityError):
    """Raised by a command (verify) whose checks found problems it already printed."""


@dataclass
class CliState:
    """What the root command resolved, handed to every subcommand through the click context."""

    output: Output
    debug: bool
    config_path: Path | None
    flags: dict[str, Any] = field(default_factory=dict)
    _config: TieredStoreConfig | None = None

    @property
    def config(self) -> TieredStoreConfig:
        """Loaded on first use, so ``--help`` and usage errors never touch config files."""
        if self._config is None:
            self._config = load_config(self.config_path, **self.flags)
        return self._config


app = typer.Typer(
    name="tieredstore",
    help="Archive message data from a local hot store to POSIX or S3 cold storage, and read it back.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def root(
    ctx: typer.Context,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML config file (else $TIEREDSTORE_CONFIG).")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Data directory: hot store, SQLite metadata, default cold dir.")
    ] = None,
    hot_dir: Annotated[
        Path | None,
        typer.Option(help="Hot store (default <data-dir>/hot): a RocketMQ broker's storePathRootDir to archive it."),
    ] = None,
    metadata_url: Annotated[
        str | None, typer.Option(help="sqlite:///path.db or postgresql+psycopg://user@host/db")
    ] = None,
    cold_url: Annotated[
        str | None, typer.Option(help="Cold storage: a directory, s3://bucket/prefix, or fsspec URL.")
    ] = None,
    output: Annotated[OutputFormat, typer.Option("--output", "-o", help="text for people, json for scripts.")] = "text",
    debug: Annotated[bool, typer.Option(help="Show tracebacks and debug logs.")] = False,
    log_json: Annotated[bool, typer.Option(help="Logs as JSON lines on stderr.")] = False,
) -> None:
    """Global options apply to every command."""
    configure_logging("DEBUG" if debug else "WARNING", json=log_json)
    flags = {"data_dir": data_dir, "hot_dir": hot_dir, "metadata_url": metadata_url, "cold_url": cold_url}
    ctx.obj = CliState(output=Output(output), debug=debug, config_path=config, flags=flags)


def state(ctx: typer.Context | click.Context) -> CliState:
    obj = ctx.find_root().obj
    assert isinstance(obj, CliState)
    return obj


def exit_code_for(exc: BaseException) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_ERROR


def _register_commands() -> None:
    # Imported for their side effect of adding commands to ``app``; kept here so ``app`` is complete
    # whichever module imports it first.
    import importlib

    for module in ("db", "run", "inspect", "read", "put", "verify", "restore", "topic", "scrub", "keys", "table"):
        importlib.import_module(f"tieredstore.cli.{module}")


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the app, print a one-line error and return its exit code."""
    _register_commands()
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        # Outside standalone mode typer returns an Exit's code instead of raising it, and turns Ctrl-C
        # into Exit(130): a code returned here is the command's, not a value to drop.
        returned = app(args=argv, prog_name="tieredstore", standalone_mode=False)
        if isinstance(returned, int) and not isinstance(returned, bool) and returned != EXIT_OK:
            if returned == EXIT_INTERRUPTED:
                print("tieredstore: interrupted", file=sys.stderr)
            return returned
    except (click.exceptions.Abort, typer.Abort):
        print("tieredstore: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (click.exceptions.Exit, typer.Exit) as exc:
        return int(exc.exit_code)
    except (click.ClickException, TyperException) as exc:
        # Newer typer vendors click: its usage errors derive from TyperException, not click's classes.
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            print(f"tieredstore: error: {exc.format_message()}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tieredstore: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except errors.TieredStoreError as exc:
        if debug:
            raise
        print(f"tieredstore: error: {exc}", file=sys.stderr)
        return exit_code_for(exc)
    except OSError as exc:
        # A file the library does not type (a path given on the command line, the machine's own limits):
        # still one line, the system's reason and the path.
        if debug:
            raise
        where = f": {exc.filename}" if exc.filename is not None else ""
        print(f"tieredstore: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
