"""Structured logging: structlog on top of the standard library, key=value on a terminal or JSON lines."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of the write, not at configure time.

    A test runner (or a daemon) may swap or close the stderr that was current when logging was
    configured; every later log line would then fail on a closed file.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _CurrentStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


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
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    handler = _CurrentStderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    # No force=True: a root logger someone already configured (an application, pytest's capture) stays as it is.
    logging.basicConfig(level=level.upper(), handlers=[handler])
    for noisy in ("botocore", "aiobotocore", "s3fs", "urllib3", "werkzeug", "py4j", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str, **context: Any) -> Any:
    """A lazy structlog logger; ``context`` (topic=, queue_id=) rides along on every line.

    Lazy on purpose: binding at import time would freeze structlog's configuration before
    ``configure_logging`` runs, and the CLI's level and renderer would be ignored.
    """
    return structlog.get_logger(name, logger_name=name, **context)
