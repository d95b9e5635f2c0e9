"""The ``tieredstore`` command line: one entry point, subcommands in sibling modules."""

from __future__ import annotations

import sys

from tieredstore.cli.app import app, main

__all__ = ["app", "main", "run_main"]


def run_main() -> None:
    sys.exit(main())
