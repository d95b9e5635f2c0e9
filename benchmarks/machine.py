"""Facts about the machine a benchmark ran on: cores, memory, disk, Python, key package versions, git commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

REPOSITORY = Path(__file__).resolve().parent.parent
KEY_PACKAGES = (
    "tieredstore",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "aiobotocore",
    "botocore",
    "boto3",
    "moto",
    "fsspec",
    "pyspark",
    "pyarrow",
    "pyiceberg",
    "psutil",
    "matplotlib",
    "zlib-ng",
)


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _git(*args: str) -> str | None:
    try:
        completed = subprocess.run(
            ["git", *args], cwd=REPOSITORY, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip()


def git_facts() -> dict[str, Any]:
    """The commit the benchmarked code came from, and whether the working tree differed from it."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": _git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in KEY_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@cache
def _static_facts() -> dict[str, Any]:
    memory = psutil.virtual_memory()
    temp_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    filesystem = None
    for partition in sorted(psutil.disk_partitions(all=True), key=lambda p: len(p.mountpoint), reverse=True):
        if temp_dir.resolve().is_relative_to(partition.mountpoint):
            filesystem = f"{partition.fstype} on {partition.device} ({partition.mountpoint})"
            break
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_bytes": memory.total,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "temp_filesystem": filesystem,
        "packages": _package_versions(),
    }


def machine_facts() -> dict[str, Any]:
    """Everything above plus what changes between runs: the git commit and the load when the result was taken."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {**_static_facts(), "git": git_facts(), "load_average": list(load) if load else None}
