"""Validation of logical paths: every provider maps one logical path to exactly one place under its root.

A logical path is ``/``-separated, relative, and made of non-empty segments other than ``.`` and
``..``; it holds no NUL and no backslash. These rules make the mapping injective on every provider
(``a//b`` and ``a/./b`` would alias ``a/b`` on POSIX but not on S3) and keep it under the root.
"""

from __future__ import annotations

from tieredstore.errors import PathEscapeError

_FORBIDDEN_SEGMENTS = frozenset({"", ".", ".."})


def check_logical_path(path: str, *, allow_root: bool = False) -> str:
    """Return ``path`` unchanged if it is a safe logical path; raise PathEscapeError naming the rule otherwise.

    ``allow_root`` admits ``""`` (the provider's root itself), as listing does.
    """
    if not isinstance(path, str):
        raise PathEscapeError(f"logical path must be a string, not {type(path).__name__}")
    if path == "" and allow_root:
        return path
    if "\x00" in path:
        raise PathEscapeError(f"logical path {path!r} contains a NUL byte")
    if "\\" in path:
        raise PathEscapeError(f"logical path {path!r} contains a backslash; use '/' between segments")
    if path.startswith("/"):
        raise PathEscapeError(f"logical path {path!r} is absolute; it must be relative to the provider root")
    for segment in path.split("/"):
        if segment in _FORBIDDEN_SEGMENTS:
            shown = "an empty segment" if segment == "" else f"a {segment!r} segment"
            raise PathEscapeError(f"logical path {path!r} has {shown}; it would alias or leave the root")
    return path
