"""The package's public face: what ``import tieredstore`` offers, what it costs, and the drawn exception tree."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import tieredstore
from tieredstore import errors

REPOSITORY = Path(__file__).resolve().parents[2]

# What the library page (docs/library.md) tells a user to use: the sync facade and its async core, the config
# loader, the statuses a read answers with, and the restore engine with its request, sinks and summary.
README_NAMES = (
    "TieredMessageStore",
    "AsyncTieredMessageStore",
    "load_config",
    "GetMessageStatus",
    "GetMessageResult",
    "PutResult",
    "restore_archive",
    "RestoreRequest",
    "RestoreSummary",
    "HotStoreSink",
    "DirectorySink",
)

# A tree line of the errors docstring: rails, a branch, the class, its other bases, the module outside errors.py.
_TREE_LINE = re.compile(
    r"^(?P<rails>(?:[│ ]   )*)(?:[├└]── )?(?P<name>\w+)"
    r"(?: \((?P<bases>\w+(?:, \w+)*)\))?(?: \[(?P<module>[\w.]+)\])?(?:\s|$)"
)


def test_every_public_name_imports_from_the_package() -> None:
    assert len(set(tieredstore.__all__)) == len(tieredstore.__all__)
    missing = [name for name in tieredstore.__all__ if not hasattr(tieredstore, name)]
    assert missing == []
    namespace: dict[str, object] = {}
    exec(f"from tieredstore import {', '.join(tieredstore.__all__)}", namespace)
    assert namespace["TieredMessageStore"].__module__ == "tieredstore.store"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'TieredMessageStor'"):
        _ = tieredstore.TieredMessageStor


def test_the_names_the_readme_uses_are_public() -> None:
    assert [name for name in README_NAMES if name not in tieredstore.__all__] == []


def test_every_import_in_the_readme_examples_resolves() -> None:
    # The library page holds the facade's examples, README the Spark one: both must import what exists.
    pages = [REPOSITORY / "README.md", REPOSITORY / "docs" / "library.md"]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    imports = [
        (module, [name.strip() for name in names.split(",")])
        for block in blocks
        for module, names in re.findall(r"^from (tieredstore[\w.]*) import ([\w, ]+)$", block, flags=re.MULTILINE)
    ]
    assert len(imports) > 1, "expected the imports of README and of the library page"
    unresolved = [
        f"{module}.{name}"
        for module, names in imports
        for name in names
        if not hasattr(importlib.import_module(module), name)
    ]
    assert unresolved == []


def test_importing_the_errors_loads_neither_the_facade_nor_its_dependencies() -> None:
    probe = (
        "import sys, tieredstore.errors, tieredstore.formats.message; "
        "print(sorted(m for m in ('tieredstore.store', 'tieredstore.config', 'sqlalchemy', 'pyspark', "
        "'aiobotocore', 'pydantic') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


# ---- the exception tree ---------------------------------------------------------------------------------------


def drawn_tree(docstring: str) -> dict[str, tuple[str, tuple[str, ...], str | None]]:
    """Each class the docstring draws: (drawn parent, other bases drawn in parentheses, module drawn in brackets).

    A drawing's root subclasses ``Exception``; a root named ``Exception`` is that built-in itself.
    """
    drawn: dict[str, tuple[str, tuple[str, ...], str | None]] = {}
    path: list[str] = []
    for line in docstring.splitlines():
        if not line.startswith("    "):
            continue  # prose; the drawings are indented
        match = _TREE_LINE.match(line[4:])
        if match is None:
            continue
        depth = len(match["rails"]) // 4 + 1 if "──" in line else 0
        del path[depth:]
        bases = tuple(match["bases"].split(", ")) if match["bases"] else ()
        if depth:
            drawn[match["name"]] = (path[depth - 1], bases, match["module"])
        elif match["name"] != "Exception":
            drawn[match["name"]] = ("Exception", bases, match["module"])  # a drawing's root hangs from Exception
        path.append(match["name"])
    return drawn


def _package_modules() -> list[ModuleType]:
    """Every module of the installed package; migrations are left out (alembic runs them, importing does not)."""
    modules: list[ModuleType] = []
    for package_name in ("tieredstore", "tieredstore.providers", "tieredstore.metadata"):
        package = importlib.import_module(package_name)
        modules.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if not info.name.startswith("tieredstore.migrations"):
                modules.append(importlib.import_module(info.name))
    return modules


def defined_exceptions() -> dict[str, tuple[str, tuple[str, ...], str | None]]:
    """Each exception class the package defines: (first base, other bases, module unless it is errors.py)."""
    found: dict[str, tuple[str, tuple[str, ...], str | None]] = {}
    for module in _package_modules():
        for cls in vars(module).values():
            if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                where = None if module is errors else module.__name__.removeprefix("tieredstore.")
                first, *others = (base.__name__ for base in cls.__bases__)
                found[cls.__name__] = (first, tuple(others), where)
    return found


def test_the_drawn_exception_tree_is_every_exception_class_with_its_parents() -> None:
    assert errors.__doc__ is not None
    drawn = drawn_tree(errors.__doc__)
    defined = defined_exceptions()
    assert "StoreLockedError" in defined and "IntegrityFailure" in defined  # the walk reaches every module
    assert {name: where for name, where in defined.items() if drawn.get(name) != where} == {}
    assert sorted(set(drawn) - set(defined)) == []


def test_the_tree_check_sees_a_class_left_out_or_misplaced() -> None:
    tree = """
    TieredStoreError
    ├── ConfigError (ValueError)                 bad config
    │   └── StoreLockedError                     locked
    └── StorageError (OSError)
        └── CommitTimeoutError (TimeoutError) [providers.watchdog]  abandoned
    """
    assert drawn_tree(tree) == {
        "TieredStoreError": ("Exception", (), None),
        "ConfigError": ("TieredStoreError", ("ValueError",), None),
        "StoreLockedError": ("ConfigError", (), None),
        "StorageError": ("TieredStoreError", ("OSError",), None),
        "CommitTimeoutError": ("StorageError", ("TimeoutError",), "providers.watchdog"),
    }
    defined = defined_exceptions()
    assert defined["StoreLockedError"] == drawn_tree(tree)["StoreLockedError"]
    assert defined["CommitTimeoutError"] != drawn_tree(tree)["CommitTimeoutError"]  # drawn under the wrong parent
    assert "ArchiverRunningError" not in drawn_tree(tree)
