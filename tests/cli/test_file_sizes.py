"""The CLI on a hot store whose files are not the configured size: reads go by the files, and a writer whose
largest message would not fit in them is refused as a configuration error, with nothing changed."""

from __future__ import annotations

import json

from tests.cli.helpers import Node
from tests.cli.test_commit_log_only import snapshot
from tieredstore.local import LocalMessageStore, LocalStoreConfig


def test_a_writer_on_files_too_small_for_its_largest_message_is_refused_and_reads_go_on(posix: Node) -> None:
    config = LocalStoreConfig(commit_log_file_size=64 << 10, max_message_size=16 << 10)
    with LocalMessageStore(posix.hot_dir, config=config) as store:
        for n in range(200):
            store.put_message("Orders", 0, f"order {n}|".encode() * 100)
    before = snapshot(posix.hot_dir)
    # The node's configuration: 256 KiB files, messages up to 64 KiB, which a 64 KiB file cannot hold.
    put = posix("put", "Orders", "0", "--jsonl", input=json.dumps({"body": "one more"}) + "\n")
    assert put.exit_code == 7, put.stderr
    (error,) = [line for line in put.stderr.splitlines() if line.startswith("tieredstore: error:")]
    assert "commit-log files of 65536 bytes" in error and "going by the files" in put.stderr
    assert snapshot(posix.hot_dir) == before
    read = posix("read", "Orders", "0", "--offset", "199", "--tier", "hot", output="json").json_lines()
    assert [(m["queue_offset"], m["body"]) for m in read] == [(199, "order 199|" * 100)]
