"""What a hot-store directory must be before anything opens it: one rule for the archiver, the CLI and the facade.

A hot store is a directory holding ``commitlog/`` (ours, or a RocketMQ broker's ``storePathRootDir``,
whose broker creates it at start). These checks only look: they create, open or lock nothing, so a
mistyped ``hot_dir`` fails before any other part of a node is touched.
"""

from __future__ import annotations

from pathlib import Path

from tieredstore.errors import ConfigError, NotFoundError

COMMIT_LOG_DIR = "commitlog"


def refuse_non_directory(path: Path) -> None:
    """ConfigError when ``path`` exists and is not a directory (a regular file): no hot store can be there."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"hot_dir {path} is not a directory: point it at a hot store or a broker's storePathRootDir")


def hot_store_at(path: Path, *, required: bool) -> bool:
    """Whether ``path`` holds a hot store to read (a ``commitlog/`` directory).

    Something other than a directory is a ConfigError. With ``required`` (a ``hot_dir`` the user set),
    a path that does not exist is a NotFoundError and a non-empty directory without ``commitlog/`` a
    ConfigError; an empty directory is a store nothing was written to yet. Without it, anything but a
    store means there is no hot store to read.
    """
    refuse_non_directory(path)
    if (path / COMMIT_LOG_DIR).is_dir():
        return True
    if not required:
        return False
    if not path.exists():
        raise NotFoundError(f"hot_dir {path} does not exist; check --hot-dir")
    if any(path.iterdir()):
        raise ConfigError(
            f"hot_dir {path} is not a hot store: it holds no {COMMIT_LOG_DIR}/ directory "
            "(point it at a broker's storePathRootDir)"
        )
    return False
