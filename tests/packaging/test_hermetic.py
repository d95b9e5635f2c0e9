"""The suite runs from any clone: no test names a path outside the repository and its own temporary directories."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.fixtures.paths import ROCKETMQ_FIXTURES, TESTS_DIR

# Where checkouts and shared folders live on a developer's or CI's machine: a literal under one of
# these works on the machine that wrote it and nowhere else.
WORKSPACE_ROOTS = ("/work/", "/home/", "/root/", "/mnt/", "/media/", "/opt/", "/Users/")
# Kernel and system interfaces a test may inspect; they are the same on every Linux machine.
SYSTEM_ROOTS = ("/proc/", "/sys/", "/dev/", "/etc/")
# A copy of the project's shared folder beside the clone exists on this machine only.
SHARED_MARKERS = ("../shared", "shared/fixtures")


def _string_literals(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _names_outside(text: str) -> bool:
    if "\n" in text or " " in text:
        return False  # prose (docstrings, messages), not a path
    if text in WORKSPACE_ROOTS or text in SHARED_MARKERS:
        return False  # this module's own patterns
    if any(marker in text for marker in SHARED_MARKERS) or text.startswith(WORKSPACE_ROOTS):
        return True
    # A made-up path in a config or error-message test is fine; one that exists here is being read.
    return text.startswith("/") and len(text) > 1 and not (text + "/").startswith(SYSTEM_ROOTS) and Path(text).exists()


def _outside_paths(path: Path) -> list[str]:
    """The literals of ``path`` that name a place outside the repository, as ``file:line: literal``."""
    return [f"{path.name}:{line}: {text}" for line, text in _string_literals(path) if _names_outside(text)]


def test_no_test_names_a_path_outside_the_repository() -> None:
    offenders = [hit for module in sorted(TESTS_DIR.rglob("*.py")) for hit in _outside_paths(module)]
    assert offenders == [], "tests must find their data relative to the repository:\n" + "\n".join(offenders)


def test_the_check_catches_a_test_that_reads_the_shared_fixtures(tmp_path: Path) -> None:
    module = tmp_path / "test_reads_outside.py"
    module.write_text(
        'FIXTURES = "/work/shared/fixtures/rocketmq"\nOTHER = "../shared/fixtures"\nTMP = "/tmp/x"\n'
        f'HERE = "{tmp_path}"\nREMOTE = "/var/lib/made-up"\n',
        encoding="utf-8",
    )
    assert _outside_paths(module) == [
        "test_reads_outside.py:1: /work/shared/fixtures/rocketmq",
        "test_reads_outside.py:2: ../shared/fixtures",
        f"test_reads_outside.py:4: {tmp_path}",
    ]


def test_the_rocketmq_fixtures_are_in_the_repository() -> None:
    # What the decoder and hot-store tests read: present in every clone, with their provenance.
    assert ROCKETMQ_FIXTURES.is_relative_to(TESTS_DIR)
    for relative in (
        "README.md",
        "java-4x-consumequeuetest/commitlog/00000000000000000000",
        "rust-0.9.0-writer/commitlog/00000000000000000000",
        "rust-0.9.0-writer/consumequeue/V1UpgradeTopic/0/00000000000000000000",
        "rust-0.9.0-writer/index/20260815011551705",
        "rust-0.9.0-writer/checkpoint",
    ):
        assert (ROCKETMQ_FIXTURES / relative).is_file(), relative
