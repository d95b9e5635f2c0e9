"""``tieredstore db``: schema migrations of the metadata database (Alembic underneath)."""

from __future__ import annotations

import typer

from tieredstore.cli.app import app, state
from tieredstore.metadata import migrate

db_app = typer.Typer(help="Metadata database schema: upgrade to the version this tieredstore knows, or show it.")
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def upgrade(ctx: typer.Context) -> None:
    """Migrate the metadata database to the newest schema revision.

    Example: tieredstore --metadata-url postgresql+psycopg://postgres@127.0.0.1/archive db upgrade
    """
    cli = state(ctx)
    url = cli.config.effective_metadata_url
    before = migrate.current(url)
    migrate.upgrade(url)
    after = migrate.current(url)
    cli.output.record("schema", {"before": before, "after": after, "head": migrate.head()})


@db_app.command("current")
def current(ctx: typer.Context) -> None:
    """Show the schema revision of the metadata database and the one this tieredstore expects.

    Example: tieredstore --output json db current
    """
    cli = state(ctx)
    url = cli.config.effective_metadata_url
    revision = migrate.current(url)
    head = migrate.head()
    cli.output.record(
        "schema",
        {"current": revision, "head": head, "up_to_date": revision == head},
    )
