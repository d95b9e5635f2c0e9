"""The base of every configuration section: frozen, unknown keys refused, removed keys warned about once."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pydantic
import structlog
from pydantic import BaseModel, ConfigDict

log = structlog.get_logger(__name__)

# Removed keys already warned about: a process loads its configuration more than once (CLI, Spark tasks).
_warned_removed: set[str] = set()


class Section(BaseModel):
    """A TOML table of the configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # The section's name in TOML, and the keys of older versions with why each went: a file or variable that
    # still sets one loads, the key is ignored and a warning says so once, instead of the deployment failing.
    section: ClassVar[str]
    removed_keys: ClassVar[dict[str, str]] = {}

    @pydantic.model_validator(mode="before")
    @classmethod
    def _drop_removed_keys(cls, values: Any) -> Any:
        if not isinstance(values, dict) or not cls.removed_keys.keys() & values.keys():
            return values
        for key in sorted(cls.removed_keys.keys() & values.keys()):
            name = f"{cls.section}.{key}"
            if name not in _warned_removed:
                _warned_removed.add(name)
                log.warning(f"{name} is ignored and can be removed, it is no longer a setting: {cls.removed_keys[key]}")
        return {k: v for k, v in values.items() if k not in cls.removed_keys}


def home_expanded(path: Path) -> Path:
    """``path`` with ``~`` expanded as a shell would; ValueError, which pydantic reports, if it cannot be."""
    try:
        return path.expanduser()
    except RuntimeError as exc:  # ~user of no such user, or no home at all
        raise ValueError(f"cannot expand {str(path)!r}: {exc}") from exc
