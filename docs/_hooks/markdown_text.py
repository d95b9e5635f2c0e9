"""Plain help and description text made safe for Markdown, shared by the generated reference pages."""

from __future__ import annotations

import html
import re

# Backtick spans in help text are already code; only the text between them needs escaping.
_CODE_SPAN = re.compile(r"`([^`]*)`")
_MARKDOWN_SPECIALS = re.compile(r"([\\*_\[\]|])")


def escape(text: str) -> str:
    """``text`` as literal Markdown: no emphasis, link, table cell break or raw HTML it did not mean."""
    pieces = _CODE_SPAN.split(text)  # odd indices are the insides of backtick spans
    return "".join(code(piece) if index % 2 else _plain(piece) for index, piece in enumerate(pieces))


def _plain(text: str) -> str:
    return _MARKDOWN_SPECIALS.sub(r"\\\1", html.escape(text, quote=False))


def code(text: str) -> str:
    """``text`` as inline code that may stand in a table cell.

    HTML rather than backticks: a table ends its cell at any ``|`` a backtick span holds, and an escaped
    one would show its backslash.
    """
    return "<code>" + html.escape(text, quote=False).replace("|", "&#124;") + "</code>"
