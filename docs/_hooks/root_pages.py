"""README, BENCHMARKS and RELIABILITY stay at the repository root; the site shows them as pages of its own.

Their links are written for a reader of the repository: ``docs/x.md`` from README, ``BENCHMARKS.md`` from
anywhere, plots under ``benchmarks/plots/``. The site keeps the plots at the same relative place and renames
the pages, so only page links change.
"""

from __future__ import annotations

import re
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
# Repository file -> its page in the site.
ROOT_PAGES = {"README.md": "index.md", "BENCHMARKS.md": "benchmarks.md", "RELIABILITY.md": "reliability.md"}
DOCS_PREFIX = "docs/"
# The plots the root pages show, as repository-relative paths.
PLOT_GLOBS = ("benchmarks/plots/*.png",)

_INLINE_LINK = re.compile(r"(\]\()([^)\s#]*)([^)\s]*\))")


def site_link(target: str) -> str:
    """Where a link written for the repository root points in the site (same target if nothing to change)."""
    if target.startswith(DOCS_PREFIX):
        return target.removeprefix(DOCS_PREFIX)
    return ROOT_PAGES.get(target, target)


def site_markdown(text: str) -> str:
    """A root page's Markdown with each inline link's target moved to its place in the site."""
    return _INLINE_LINK.sub(lambda match: match[1] + site_link(match[2]) + match[3], text)


def root_page(name: str) -> str:
    """The site version of the root file ``name`` (a key of ROOT_PAGES)."""
    return site_markdown((REPOSITORY / name).read_text(encoding="utf-8"))


def plots() -> list[Path]:
    """Every plot a root page may show, as paths relative to the repository."""
    return sorted(path.relative_to(REPOSITORY) for pattern in PLOT_GLOBS for path in REPOSITORY.glob(pattern))
