"""The installed package has the layout DESIGN.md promises, and the resolver picked modern S3 libraries."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from importlib.metadata import requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def test_resolved_s3_stack_is_not_the_ancient_fallback() -> None:
    # Unpinned, pip pairs the newest boto3 with s3fs 0.4.x; our floors must have prevented that.
    assert Version(version("s3fs")) >= Version("2024.6.0"), version("s3fs")
    assert Version(version("fsspec")) >= Version("2024.6.0"), version("fsspec")
    assert Version(version("aiobotocore")) >= Version("2.13.0"), version("aiobotocore")
    # and the versions that were installed are consistent with each other
    pairs = [("s3fs", "aiobotocore"), ("s3fs", "fsspec"), ("aiobotocore", "botocore"), ("boto3", "botocore")]
    for dist, dependency in pairs:
        for line in requires(dist) or []:
            requirement = Requirement(line)
            if requirement.name == dependency and requirement.marker is None:
                assert requirement.specifier.contains(version(dependency), prereleases=True), (
                    f"{dist} needs {requirement}, installed {dependency} {version(dependency)}"
                )


def test_extras_declare_floors_on_the_s3_stack() -> None:
    declared = [Requirement(r) for r in requires("tieredstore") or []]
    s3 = {r.name: r for r in declared if r.marker is not None and r.marker.evaluate({"extra": "s3"})}
    for name in ("s3fs", "aiobotocore", "fsspec"):
        assert name in s3, f"extra s3 lacks {name}"
        assert any(spec.operator == ">=" for spec in s3[name].specifier), f"{name} has no floor"
    assert "boto3" in s3["aiobotocore"].extras, "boto3 must come through aiobotocore[boto3]"


@pytest.mark.slow
def test_wheel_installs_providers_and_metadata_inside_the_namespace(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("tieredstore-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_levels = {n.split("/", 1)[0] for n in names}
    assert "providers" not in top_levels
    assert "metadata" not in top_levels
    assert "migrations" not in top_levels
    assert "tieredstore/providers/base.py" in names
    assert "tieredstore/metadata/__init__.py" in names
    assert any(n.startswith("tieredstore/migrations/") for n in names)

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # Base dependencies only, no extras: what `pip install tieredstore` gives a user. A module that imports
    # something only an extra (or the dev tools) brings in fails here, not on the user's machine.
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True)
    cli = subprocess.run([str(env_dir / "bin" / "tieredstore"), "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert "run" in cli.stdout
    assert "restore" in cli.stdout
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util, sysconfig, os, tieredstore.providers.base;"
            "site = sysconfig.get_paths()['purelib'];"
            "print(sorted(n for n in os.listdir(site) if n in ('providers', 'metadata', 'migrations')));"
            "print(importlib.util.find_spec('providers'))",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the repository, whose own folders would shadow the installed package
    )
    assert probe.stdout.split("\n")[:2] == ["[]", "None"], probe.stdout
