"""Structured logging: structlog on top of the standard library, key=value on a terminal or JSON lines."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure_logging(level: str = "INFO", *, json: bool = False) -> None:
    """Route structlog and stdlib logging to stderr; call once at process start (CLI, ``run``)."""
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*processors, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("botocore", "aiobotocore", "s3fs", "urllib3", "werkzeug", "py4j", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str, **context: Any) -> Any:
    """A lazy structlog logger; ``context`` (topic=, queue_id=) rides along on every line.

    Lazy on purpose: binding at import time would freeze structlog's configuration before
    ``configure_logging`` runs, and the CLI's level and renderer would be ignored.
    """
    return structlog.get_logger(name, logger_name=name, **context)
