"""The command-line reference page, generated from the typer app so that it cannot drift from the code."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import typer.main
from markdown_text import code, escape

from tieredstore.cli.app import _register_commands, app

PROGRAM = "tieredstore"
# Help texts end with "Example: CMD" or "Examples: CMD · CMD"; the reference shows those as a code block.
_EXAMPLES = re.compile(r"(?:^|(?<=\s))Examples?: (.*)", re.DOTALL)


@dataclass(frozen=True)
class CommandDoc:
    """One command of the tree: its full name (``tieredstore db upgrade``), usage line, help and options."""

    path: str
    usage: str
    help: str
    options: tuple[tuple[str, str], ...]
    subcommands: tuple[str, ...]


def root_command() -> Any:
    """The click command typer builds for ``tieredstore``, with every subcommand registered."""
    _register_commands()
    return typer.main.get_command(app)


def command_docs() -> Iterator[CommandDoc]:
    """Every command, depth first in the order ``--help`` lists them, the root first."""
    root = root_command()
    yield from _walk(root, root.make_context(PROGRAM, [], resilient_parsing=True), PROGRAM)


def _walk(command: Any, context: Any, path: str) -> Iterator[CommandDoc]:
    names = tuple(command.list_commands(context)) if hasattr(command, "list_commands") else ()
    yield CommandDoc(
        path=path,
        usage=command.get_usage(context).removeprefix("Usage: "),
        help=command.help or "",
        options=tuple(_options(command, context)),
        subcommands=names,
    )
    for name in names:
        child = command.get_command(context, name)
        if child is None or child.hidden:
            continue
        yield from _walk(child, child.make_context(name, [], parent=context, resilient_parsing=True), f"{path} {name}")


def _options(command: Any, context: Any) -> Iterator[tuple[str, str]]:
    # get_help_record is what --help prints: the option's names and metavar, then its help with the
    # default, range and "required" as the parser knows them.
    for param in command.get_params(context):
        if param.hidden:
            continue
        record = param.get_help_record(context)
        if record is not None:
            yield record[0], record[1]


def _help_lines(text: str) -> list[str]:
    prose, examples = text, ""
    found = _EXAMPLES.search(text)
    if found is not None:
        prose, examples = text[: found.start()], found[1]
    lines = [escape(paragraph) + "\n" for paragraph in prose.split("\n\n") if paragraph.strip()]
    if examples:
        commands = " ".join(examples.split()).split(" · ")
        lines += ["Example:" if len(commands) == 1 else "Examples:", "", "```sh", *commands, "```", ""]
    return lines


def anchor(path: str) -> str:
    """The heading anchor MkDocs gives a command's section (``tieredstore db upgrade`` → ``tieredstore-db-upgrade``)."""
    return path.replace(" ", "-")


def cli_reference_markdown() -> str:
    """The reference as Markdown: one section per command with its usage, help and options."""
    lines: list[str] = []
    for doc in command_docs():
        lines += [f"### {doc.path}", "", "```text", doc.usage, "```", ""]
        lines += _help_lines(doc.help)
        if doc.subcommands:
            links = ", ".join(f"[{name}](#{anchor(f'{doc.path} {name}')})" for name in doc.subcommands)
            lines += [f"Commands: {links}.", ""]
        if doc.options:
            lines += ["| option | meaning |", "|---|---|"]
            lines += [f"| {code(names)} | {escape(meaning) or '&nbsp;'} |" for names, meaning in doc.options]
            lines.append("")
    return "\n".join(lines)
