"""The documentation site covers what the code has: every command, option and setting, the root pages and plots."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from tieredstore.cli.app import _register_commands, app
from tieredstore.config import TieredStoreConfig

REPO = Path(__file__).resolve().parents[2]
HOOKS = REPO / "docs" / "_hooks"
# The two commands README promises a newcomer; .ci/run and people copy them verbatim.
README_COMMANDS = (
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/tieredstore run --demo",
    "bash scripts/test",
)


def _hook_module(name: str) -> ModuleType:
    # The hooks import their siblings by bare name, as MkDocs loads them with their folder on the path.
    sys.path.insert(0, str(HOOKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(HOOKS))


def _command_paths() -> Iterator[tuple[str, ...]]:
    """Every command typer has registered, read from the app's own registry, not from the click tree."""
    _register_commands()
    for command in app.registered_commands:
        yield (command.name or command.callback.__name__.replace("_", "-"),)  # type: ignore[union-attr]
    for group in app.registered_groups:
        assert group.typer_instance is not None
        for command in group.typer_instance.registered_commands:
            name = command.name or command.callback.__name__.replace("_", "-")  # type: ignore[union-attr]
            yield (str(group.name), name)


def _sections(markdown: str) -> dict[str, str]:
    """A generated page split at its ``### `` headings: heading -> the text below it."""
    parts = re.split(r"^### (.+)$", markdown, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.fixture(scope="module")
def cli_sections() -> dict[str, str]:
    return _sections(_hook_module("cli_reference").cli_reference_markdown())


def test_every_command_has_a_section_in_the_cli_reference(cli_sections: dict[str, str]) -> None:
    paths = list(_command_paths())
    assert len(paths) > 10
    missing = [" ".join(path) for path in paths if "tieredstore " + " ".join(path) not in cli_sections]
    assert missing == []


@pytest.mark.parametrize(
    "path", [("restore",), ("run",), ("db", "rebuild"), ("topic", "set-retention"), ("keys", "rotate")]
)
def test_a_commands_options_are_in_its_section(path: tuple[str, ...], cli_sections: dict[str, str]) -> None:
    # --help as a user sees it is the independent account of what the command accepts.
    shown = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    options = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", shown.output))
    assert options
    section = cli_sections["tieredstore " + " ".join(path)]
    assert sorted(option for option in options if option not in section) == []
    assert "tieredstore " + " ".join(path) in section  # the usage line


def test_the_cli_reference_shows_defaults() -> None:
    section = _sections(_hook_module("cli_reference").cli_reference_markdown())["tieredstore restore"]
    (batch_row,) = [line for line in section.splitlines() if line.startswith("| <code>--batch")]
    assert "default: 16384" in batch_row


def test_every_setting_is_in_the_configuration_reference() -> None:
    markdown = _hook_module("config_reference").configuration_reference_markdown()
    expected = []
    for name, field in TieredStoreConfig.model_fields.items():
        nested = getattr(field.annotation, "model_fields", None)
        if nested is None:
            expected += [f"<code>{name}</code>", f"<code>TIEREDSTORE_{name.upper()}</code>"]
        else:
            assert f"### [{name}]" in markdown
            expected += [f"<code>TIEREDSTORE_{name.upper()}__{inner.upper()}</code>" for inner in nested]
    assert len(expected) > 50
    assert [entry for entry in expected if entry not in markdown] == []


def test_every_setting_says_what_it_does() -> None:
    # The generator is the one the docs hook runs: a field added without a description shows an empty meaning.
    reference = _hook_module("config_reference")
    escape = _hook_module("markdown_text").escape
    settings = list(reference.setting_docs())
    assert len(settings) > 50
    assert [f"{s.section}.{s.name}".lstrip(".") for s in settings if not s.description.strip()] == []
    markdown = reference.configuration_reference_markdown()
    assert [s.name for s in settings if escape(s.description) not in markdown] == []


def test_a_setting_row_has_its_type_default_and_bounds() -> None:
    markdown = _hook_module("config_reference").configuration_reference_markdown()
    (row,) = [line for line in markdown.splitlines() if "<code>TIEREDSTORE_ARCHIVER__GROUP_COMMIT_SIZE</code>" in line]
    assert "| int | <code>4194304</code> (4 MiB) | ≥ 1 |" in row
    (row,) = [line for line in markdown.splitlines() if "<code>TIEREDSTORE_READ__READ_POLICY</code>" in line]
    assert "<code>NOT_IN_DISK</code>" in row
    assert "<code>FORCE</code>" in row


def test_help_text_is_literal_in_markdown() -> None:
    escape = _hook_module("markdown_text").escape
    assert escape("a <dir>|b *c* [x] `text|json`") == r"a &lt;dir&gt;\|b \*c\* \[x\] <code>text&#124;json</code>"


def test_root_pages_move_their_links_into_the_site() -> None:
    site_markdown = _hook_module("root_pages").site_markdown
    text = (
        "[cli](docs/reference/cli.md#exit-codes) [b](BENCHMARKS.md) [r](RELIABILITY.md#tools) "
        "![p](benchmarks/plots/x.png) [w](https://example.org/README.md)"
    )
    assert site_markdown(text) == (
        "[cli](reference/cli.md#exit-codes) [b](benchmarks.md) [r](reliability.md#tools) "
        "![p](benchmarks/plots/x.png) [w](https://example.org/README.md)"
    )


def test_every_plot_benchmarks_shows_is_copied_into_the_site() -> None:
    shown = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", (REPO / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert shown
    copied = {path.as_posix() for path in _hook_module("root_pages").plots()}
    assert sorted(set(shown) - copied) == []


def test_reliability_shows_its_plots_and_the_site_has_them() -> None:
    shown = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", (REPO / "RELIABILITY.md").read_text(encoding="utf-8"))
    assert len(shown) >= 2
    site_link = _hook_module("root_pages").site_link
    for plot in shown:
        assert (REPO / plot).is_file(), plot
        # under docs/, so the site holds it where the page's moved link points
        assert (REPO / "docs" / site_link(plot)).is_file(), plot


def test_readme_keeps_its_two_commands_and_the_suite_builds_the_docs_strictly() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for command in README_COMMANDS:
        assert f"```sh\n{command}\n```" in readme
    assert "mkdocs build --strict" in (REPO / "scripts" / "test").read_text(encoding="utf-8")
