"""``tieredstore keys``: which key-encryption keys the keyring holds and what each wraps; re-wrap under another.

Key ids only: no command prints key material, in text or JSON.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from tieredstore.cli.app import CliState, app, state
from tieredstore.cli.common import run
from tieredstore.keys import RotationReport, key_usage, load_keyring, rotate_keys
from tieredstore.metadata import MetadataStore
from tieredstore.runtime import open_cold_provider

keys_app = typer.Typer(
    help="Encryption keys: list them and what each wraps, rotate to another (docs/operations/keys.md)."
)
app.add_typer(keys_app, name="keys")


@keys_app.command("list")
def list_keys(ctx: typer.Context) -> None:
    """List the keyring's key ids, which is active, and how many live segments and uploaded index files each
    wraps (a key id metadata names but the keyring lacks is listed too, with in_keyring false).

    Example: tieredstore --output json keys list
    """
    cli = state(ctx)
    config = cli.config
    keyring = load_keyring(config.encryption)
    with MetadataStore.open(config.effective_metadata_url, create=False) as metadata:
        usage = key_usage(keyring, metadata)
    rows = [
        {
            "key_id": key.key_id,
            "active": key.active,
            "in_keyring": key.in_keyring,
            "segments": key.segments,
            "index_files": key.index_files,
        }
        for key in usage
    ]
    cli.output.table("keys", ["key_id", "active", "in_keyring", "segments", "index_files"], rows)
    lacking = [key.key_id for key in usage if not key.in_keyring]
    if lacking and not cli.output.is_json:
        cli.output.note(f"warning: the keyring lacks {', '.join(lacking)}: what they wrap cannot be read")


@keys_app.command("rotate")
def rotate(
    ctx: typer.Context,
    to: Annotated[
        str | None, typer.Option("--to", metavar="ID", help="The key id to wrap under (default: the active key).")
    ] = None,
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: on a terminal).")
    ] = None,
) -> None:
    """Re-wrap every live encrypted segment's and uploaded index file's data key under one key, without
    rewriting data (only each one's small .codec object is replaced), and record it in metadata.

    Files already under that key are skipped, so running it again finishes a rotation cut short. Safe
    beside a running archiver; change encryption.active_key and restart the archiver first, so that new
    segments are wrapped under the new key too. A key the keyring lacks is refused (exit 7).

    Example: tieredstore keys rotate --to k2025
    """
    cli = state(ctx)
    config = cli.config
    show = progress if progress is not None else cli.output.err.is_terminal

    async def go() -> RotationReport:
        provider = open_cold_provider(config)
        try:
            await provider.prepare()
            with (
                MetadataStore.open(config.effective_metadata_url, create=False) as metadata,
                cli.output.progress(show) as bar,
            ):
                task = bar.add_task("keys: re-wrapping", total=None)

                def advance(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                return await rotate_keys(provider, metadata, key_id=to, progress=advance)
        finally:
            await asyncio.shield(provider.close())

    _print_rotation(cli, run(go()))


def _print_rotation(cli: CliState, report: RotationReport) -> None:
    summary: dict[str, Any] = {
        "key_id": report.key_id,
        "segments": report.segments,
        "index_files": report.index_files,
        "not_stored": report.not_stored,
        "seconds": round(report.seconds, 3),
    }
    if cli.output.is_json:
        cli.output.json(summary)
        return
    pending = (
        f"; {report.not_stored} with nothing to re-wrap (not written yet, or removed meanwhile)"
        if report.not_stored
        else ""
    )
    cli.output.line(
        f"keys rotate: re-wrapped {report.segments} segments and {report.index_files} index files under "
        f"key {report.key_id} in {report.seconds:.1f}s{pending}"
    )
