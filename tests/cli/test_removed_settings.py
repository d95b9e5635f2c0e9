"""Settings that are gone: a config file that still names one loads, ignores it and says so once."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tieredstore.config import load_config
from tieredstore.config import section as config_section
from tieredstore.errors import ConfigError

OLD_FILE = """
[s3]
receive_buffer_bytes = 0
[archiver]
group_commit_count = 64
unmap_hot_reads = false
tune_allocator = false
[read]
prefetch_handoff = 0.01
"""


def test_a_config_file_naming_removed_settings_loads_and_warns_once_about_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config_section, "_warned_removed", set())
    path = tmp_path / "tieredstore.toml"
    path.write_text(OLD_FILE)
    with capture_logs() as logs:
        config = load_config(path)
        again = load_config(path)
    assert config == again and config.archiver.group_commit_count == 64
    for section, name in (
        ("s3", "receive_buffer_bytes"),
        ("archiver", "unmap_hot_reads"),
        ("archiver", "tune_allocator"),
        ("read", "prefetch_handoff"),
    ):
        assert not hasattr(getattr(config, section), name)
    warnings = sorted(entry["event"].split(" ")[0] for entry in logs if entry["log_level"] == "warning")
    assert warnings == [
        "archiver.tune_allocator",
        "archiver.unmap_hot_reads",
        "read.prefetch_handoff",
        "s3.receive_buffer_bytes",
    ]
    assert all("is ignored and can be removed" in entry["event"] for entry in logs)


def test_an_unknown_key_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "tieredstore.toml"
    path.write_text("[read]\nprefetch_handof = 0.01\n")
    with pytest.raises(ConfigError, match=r"read\.prefetch_handof: unknown key"):
        load_config(path)
