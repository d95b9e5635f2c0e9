"""MkDocs hooks: the generated reference pages and the root files (README, BENCHMARKS, RELIABILITY) in the site.

Loaded by ``hooks:`` in mkdocs.yml; MkDocs puts this folder on the import path while it loads the file.
"""

from __future__ import annotations

from typing import Any

from cli_reference import cli_reference_markdown
from config_reference import configuration_reference_markdown
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from root_pages import REPOSITORY, ROOT_PAGES, plots, root_page

# A hand-written page names where its generated part goes with one of these lines.
GENERATED = {
    "<!-- generated: cli-reference -->": cli_reference_markdown,
    "<!-- generated: configuration-reference -->": configuration_reference_markdown,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for name, page in ROOT_PAGES.items():
        files.append(File.generated(config, page, content=root_page(name)))
    for plot in plots():
        files.append(File.generated(config, plot.as_posix(), abs_src_path=str(REPOSITORY / plot)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files, **_: Any) -> str:
    for marker, generate in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown
