"""Making the directories a configuration names, with a typed error when the machine refuses."""

from __future__ import annotations

from pathlib import Path

from tieredstore.errors import ConfigError


def ensure_directory(path: Path, purpose: str) -> None:
    """Create ``path`` (and its parents) if needed; ConfigError in one line when it cannot be a directory.

    ``purpose`` says what it is for ("the hot store"), so the message names the setting to fix.
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path}, {purpose}, is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create {path}, {purpose}: {exc.strerror or exc}") from exc
