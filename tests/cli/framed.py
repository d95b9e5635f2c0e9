"""CLI nodes whose cold segments are framed (zstd, AES-256-GCM), on POSIX and S3 with SQLite and PostgreSQL.

``framed_node_on`` builds a node on one of the four backend pairs (``BACKEND_PAIRS``) archiving with
``[cold] compression = "zstd"`` and ``[encryption]`` on; ``ColdObjects`` reads and rewrites what a node
stored, file or object, the way an operator (or an attacker) with access to the bucket could.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import SMALL_FILES
from tests.cli.helpers import Node, put_jsonl
from tests.cli.test_restore import TOPIC
from tieredstore.providers.codec import DESCRIPTOR_NAME

KEY_ID = "ring-2026"
BACKEND_PAIRS = [
    "posix-sqlite",
    pytest.param("posix-postgres", marks=pytest.mark.postgres),
    "s3-sqlite",
    pytest.param("s3-postgres", marks=pytest.mark.postgres),
]
# POSIX with SQLite and S3 with PostgreSQL: every part of both axes in each test, at half the full matrix's
# time, for the tests of failure modes (the readers' own test runs on all four pairs).
DIAGONAL_PAIRS = ["posix-sqlite", pytest.param("s3-postgres", marks=pytest.mark.postgres)]
# Small key-index files: a few hundred keys fill several, each sealed and uploaded by the run that filled it.
SMALL_INDEX = {"TIEREDSTORE_INDEX__INDEX_MAX_ITEMS": "64", "TIEREDSTORE_INDEX__INDEX_SLOT_COUNT": "16"}


def write_keyring(path: Path, keys: dict[str, bytes]) -> Path:
    lines = ["[keys]", *(f'"{key_id}" = "{base64.b64encode(material).decode()}"' for key_id, material in keys.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def codec_env(compression: str, keyring: Path | None = None, active_key: str | None = None) -> dict[str, str]:
    """The settings of one codec configuration; unset ones are removed by ``use_codec``."""
    env = {"TIEREDSTORE_COLD__COMPRESSION": compression}
    if keyring is not None:
        env["TIEREDSTORE_ENCRYPTION__KEYRING_FILE"] = str(keyring)
    if active_key is not None:
        env["TIEREDSTORE_ENCRYPTION__ACTIVE_KEY"] = active_key
    return env


def use_codec(node: Node, env: dict[str, str]) -> None:
    """Restart the node's commands with this codec configuration (and no other)."""
    for name in [n for n in node.env if n.startswith(("TIEREDSTORE_COLD__", "TIEREDSTORE_ENCRYPTION__"))]:
        del node.env[name]
    node.env.update(env)


@dataclass
class ColdObjects:
    """What a node's cold root holds, by key relative to the root: files on POSIX, objects on S3."""

    root: Path | None = None
    client: Any = None
    bucket: str = ""
    prefix: str = ""

    def listed(self) -> list[str]:
        if self.root is not None:
            return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())
        found = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            found += [item["Key"].removeprefix(self.prefix) for item in page.get("Contents", [])]
        return sorted(found)

    def read(self, key: str) -> bytes:
        if self.root is not None:
            return (self.root / key).read_bytes()
        return bytes(self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read())

    def write(self, key: str, data: bytes) -> None:
        """Put changed bytes back in place (an S3 object overwritten with the test's own client)."""
        if self.root is not None:
            (self.root / key).parent.mkdir(parents=True, exist_ok=True)
            (self.root / key).write_bytes(data)
        else:
            self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)

    def chunks(self, segment_key: str) -> list[str]:
        """The chunk objects of a framed segment, in logical order."""
        inside = [k for k in self.listed() if k.startswith(segment_key + "/") and not k.endswith(DESCRIPTOR_NAME)]
        return sorted(inside, key=lambda k: int(k.rsplit("/", 1)[1]))

    def is_framed(self, segment_key: str) -> bool:
        return f"{segment_key}/{DESCRIPTOR_NAME}" in self.listed()


def cold_objects(node: Node, request: pytest.FixtureRequest) -> ColdObjects:
    if node.cold_url is None:
        return ColdObjects(root=node.data_dir / "cold")
    bucket, prefix = node.cold_url.removeprefix("s3://").split("/", 1)
    return ColdObjects(client=request.getfixturevalue("s3_server").client(), bucket=bucket, prefix=prefix + "/")


def backend_node(pair: str, request: pytest.FixtureRequest, data_dir: Path) -> Node:
    """A node on ``pair`` (``posix-sqlite``, ``s3-postgres`` ...), its PostgreSQL schema migrated first."""
    storage, metadata = pair.split("-")
    env = {**SMALL_FILES, **SMALL_INDEX, "TIEREDSTORE_ARCHIVER__LEASES": "false"}
    cold_url = None
    if storage == "s3":
        env.update(request.getfixturevalue("s3_server").settings())
        cold_url = request.getfixturevalue("s3_bucket_url")
    metadata_url = request.getfixturevalue("postgres_url") if metadata == "postgres" else None
    node = Node(pair, data_dir, cold_url=cold_url, metadata_url=metadata_url, env=env)
    if metadata_url is not None:
        upgraded = node("db", "upgrade", output="json")
        assert upgraded.exit_code == 0, upgraded.stderr
    return node


def framed_node_on(pair: str, request: pytest.FixtureRequest, tmp_path: Path) -> Node:
    """A node on ``pair`` archiving zstd frames sealed under ``KEY_ID`` of ``tmp_path/keyring.toml``."""
    node = backend_node(pair, request, tmp_path / "node")
    keyring = write_keyring(tmp_path / "keyring.toml", {KEY_ID: os.urandom(32)})
    use_codec(node, codec_env("zstd", keyring, KEY_ID))
    return node


def plain_twin(node: Node, tmp_path: Path) -> Node:
    """A POSIX + SQLite node without codecs whose hot store is a copy of ``node``'s: the same messages,
    byte for byte, archived unframed, to compare what every reader returns against."""
    twin = Node("plain", tmp_path / "plain", env={**SMALL_FILES, **SMALL_INDEX})
    twin.data_dir.mkdir(parents=True)
    shutil.copytree(node.hot_dir, twin.hot_dir)
    return twin


def produce_json(node: Node, queue_id: int, count: int, first: int = 0) -> None:
    """``count`` small JSON messages, each with a key of its own (``order-<queue>-<n>``)."""
    items = [
        {
            "body": json.dumps({"order": n, "queue": queue_id, "item": f"widget-{n % 13}"}),
            "keys": [f"order-{queue_id}-{n}"],
            "tags": "paid",
        }
        for n in range(first, first + count)
    ]
    put_jsonl(node, TOPIC, queue_id, items)


def segment_keys(node: Node, queue_id: int = 0) -> dict[str, list[str]]:
    """The keys of a queue's live segments, by file type (COMMIT_LOG, CONSUME_QUEUE)."""
    rows = node("segments", TOPIC, str(queue_id), output="json").json()["rows"]
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["file_type"], []).append(row["key"])
    return found
