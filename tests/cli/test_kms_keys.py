"""A KMS key in the keyring, from the CLI: ``keys rotate`` moves an archive from a local key to a KMS key and
back, and a KMS key that does not exist is a one-line integrity error. The cold tier is POSIX; KMS is moto's,
reached through ``[s3] endpoint_url`` and credentials as a deployment on AWS reaches its own."""

from __future__ import annotations

import json

from tests.cli.helpers import Node
from tests.cli.test_keys import MESSAGES, archived, key, key_ids, one_error_line, use_keys
from tests.cli.test_restore import TOPIC
from tests.fixtures.s3 import S3Server
from tests.providers.test_kms import kms_alias
from tieredstore.cli.app import EXIT_INTEGRITY


def use_kms(node: Node, **keys: str) -> None:
    node.env["TIEREDSTORE_ENCRYPTION__KMS_KEYS"] = json.dumps(keys)


def read_all(node: Node) -> str:
    read = node("read", TOPIC, "0", "--offset", "0", "--tier", "cold", "--count", str(MESSAGES), output="json")
    assert read.exit_code == 0, read.stderr
    return read.stdout


def test_rotate_moves_an_archive_from_a_local_key_to_a_kms_key_and_back(posix: Node, s3_server: S3Server) -> None:
    node = posix
    node.env.update(s3_server.settings())
    alias = kms_alias(s3_server)
    use_keys(node, "k1", k1=key(1))
    use_kms(node, **{"kms-2026": alias})
    archived(node)
    before = key_ids(node)
    messages = read_all(node)

    use_keys(node, "kms-2026", k1=key(1))
    rotated = node("keys", "rotate", output="json")
    assert rotated.exit_code == 0, rotated.stderr
    assert rotated.json()["segments"] == len(before["segments"])
    assert key_ids(node) == {kind: ["kms-2026"] * len(ids) for kind, ids in before.items()}

    use_keys(node, "kms-2026")  # the local key retired: KMS alone unwraps everything
    assert read_all(node) == messages
    assert node("verify", "--deep").exit_code == 0

    use_kms(node, **{"kms-2026": "alias/tieredstore-absent"})
    refused = node("read", TOPIC, "0", "--offset", "0", "--tier", "cold")
    assert refused.exit_code == EXIT_INTEGRITY, (refused.exit_code, refused.stderr)
    line = one_error_line(refused.stderr)
    assert "KMS key 'kms-2026' cannot be used" in line and "NotFoundException" in line, line
    assert s3_server.secret_access_key not in line and s3_server.access_key_id not in line

    use_kms(node, **{"kms-2026": alias})
    use_keys(node, "k1", k1=key(1))
    back = node("keys", "rotate", "--to", "k1", output="json")
    assert back.exit_code == 0, back.stderr
    assert key_ids(node) == before
    use_kms(node)
    assert read_all(node) == messages
