"""Schema versions: run Alembic from the installed package and check a database's revision.

No ``alembic.ini`` is needed: the Alembic config is built in code with its script location pointing
at the installed ``tieredstore.migrations`` package. The CLI's ``tieredstore db upgrade`` and
``tieredstore db current`` call ``upgrade`` and ``current``; ``MetadataStore`` calls ``check_schema``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import TYPE_CHECKING

from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from tieredstore.errors import SchemaVersionError
from tieredstore.metadata.engine import create_metadata_engine, safe_url, translate_errors

if TYPE_CHECKING:
    from alembic.config import Config

UPGRADE_COMMAND = "tieredstore db upgrade --metadata-url"

# The newest packaged revision, known without Alembic: every store open checks the database against
# it, and importing Alembic's script machinery for that would add ~0.4 s to every CLI command. A
# test holds it equal to the packaged migrations' head; Alembic is asked only when they differ.
HEAD = "0004_key_ids"


def alembic_config(engine: Engine | None = None) -> Config:
    """An Alembic config for the packaged migrations; ``engine`` is handed to env.py when given."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resources.files("tieredstore.migrations")))
    if engine is not None:
        config.attributes["engine"] = engine
    return config


def head() -> str:
    """The newest revision this version of tieredstore knows."""
    from alembic.script import ScriptDirectory

    revision = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if revision is None:
        raise SchemaVersionError("the packaged migrations have no head revision")
    return revision


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


@contextmanager
def _engine_for(target: str | URL | Engine) -> Iterator[Engine]:
    if isinstance(target, Engine):
        yield target
        return
    engine = create_metadata_engine(target)
    try:
        yield engine
    finally:
        engine.dispose()


def upgrade(target: str | URL | Engine, revision: str = "head") -> None:
    """Migrate the database up to ``revision`` (default: head); an up-to-date database is left as is."""
    from alembic import command

    with _engine_for(target) as engine, translate_errors("migrate the schema", engine.url):
        command.upgrade(alembic_config(engine), revision)


def downgrade(target: str | URL | Engine, revision: str = "base") -> None:
    """Migrate the database down to ``revision`` (default: base, which drops every table)."""
    from alembic import command

    with _engine_for(target) as engine, translate_errors("migrate the schema", engine.url):
        command.downgrade(alembic_config(engine), revision)


def current_of(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def _at_head(engine: Engine) -> bool:
    """Whether the database's one recorded revision is HEAD, read with plain SQL (no Alembic import)."""
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    except SQLAlchemyError:
        return False  # no version table (never migrated) or unreadable: Alembic says what it is
    return rows == [HEAD]


def current(target: str | URL | Engine) -> str | None:
    """The database's revision; None when it has never been migrated."""
    with _engine_for(target) as engine, translate_errors("read the schema revision", engine.url):
        return current_of(engine)


def check_schema(engine: Engine) -> str:
    """Return the database's revision if it is head; SchemaVersionError saying what to do otherwise."""
    if _at_head(engine):
        return HEAD
    url = safe_url(engine.url)
    revision = current_of(engine)
    expected = head()
    if revision == expected:
        return revision
    if revision is None:
        raise SchemaVersionError(
            f"the metadata database {url} has no tieredstore schema; create it with: {UPGRADE_COMMAND} '{url}'"
        )
    if revision not in known_revisions():
        raise SchemaVersionError(
            f"the metadata database {url} is at revision {revision}, which this version of tieredstore "
            f"does not know (its newest is {expected}); upgrade tieredstore to a version that has it"
        )
    raise SchemaVersionError(
        f"the metadata database {url} is at revision {revision}, older than {expected}; migrate it with: "
        f"{UPGRADE_COMMAND} '{url}'"
    )
