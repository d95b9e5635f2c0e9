"""Alembic owns the schema: upgrade and downgrade on both engines, models equal head, refusals name a command."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import alembic.op
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text

from tieredstore.errors import ConfigError, SchemaVersionError
from tieredstore.metadata import MetadataStore, check_schema, current, downgrade, head, migrate, upgrade
from tieredstore.metadata.engine import create_metadata_engine
from tieredstore.metadata.models import Base

TABLES = {"topics", "queues", "segments", "index_files"}


def _tables(url: str) -> set[str]:
    engine = create_metadata_engine(url)
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_empty_database_to_head_and_downgrade_to_base(metadata_url: str) -> None:
    assert current(metadata_url) is None
    upgrade(metadata_url)
    assert current(metadata_url) == head()
    assert _tables(metadata_url) >= TABLES
    downgrade(metadata_url, "base")
    assert current(metadata_url) is None
    assert not (_tables(metadata_url) & TABLES)
    upgrade(metadata_url)  # and back up again: the downgrade left nothing behind that blocks it
    assert current(metadata_url) == head()


def test_an_upgrade_that_fails_part_way_changes_nothing_and_the_next_start_creates_the_database(
    metadata_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last revision fails after its first step, as a process killed in the middle of it would stop.
    def fail(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("killed in the middle of a migration")

    monkeypatch.setattr(alembic.op, "execute", fail)
    with pytest.raises(RuntimeError, match="killed in the middle"):
        upgrade(metadata_url)
    assert current(metadata_url) is None, "no revision was committed on its own"
    assert not (_tables(metadata_url) & TABLES)
    monkeypatch.undo()
    upgrade(metadata_url)
    assert current(metadata_url) == head()


def test_a_first_start_killed_while_creating_the_embedded_database_is_created_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'metadata.db'}"
    script = (
        "import alembic.op, sys\n"
        "from tieredstore.metadata import MetadataStore\n"
        "def killed(*args, **kwargs):\n"
        "    import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n"
        "alembic.op.execute = killed\n"
        "MetadataStore.open(sys.argv[1])\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, check=False)
    assert killed.returncode == -9, killed.stderr
    store = MetadataStore.open(url)  # a brand-new database again, not one stuck at an older revision
    try:
        assert store.get_or_create_topic("Orders").reserve_hours == 72
    finally:
        store.close()
    assert current(url) == head()


def test_models_and_head_revision_agree(metadata_url: str) -> None:
    upgrade(metadata_url)
    engine = create_metadata_engine(metadata_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "compare_server_default": True}
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_store_refuses_an_unmigrated_database_and_says_what_to_run(metadata_url: str) -> None:
    with pytest.raises(SchemaVersionError, match="tieredstore db upgrade --metadata-url") as caught:
        MetadataStore(metadata_url)
    assert "has no tieredstore schema" in str(caught.value)
    assert not (_tables(metadata_url) & TABLES), "opening must never create tables"


def test_store_refuses_a_database_newer_than_it_knows(metadata_url: str) -> None:
    upgrade(metadata_url)
    engine = create_metadata_engine(metadata_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = 'ffff_from_the_future'"))
        with pytest.raises(SchemaVersionError, match=r"ffff_from_the_future.*upgrade tieredstore"):
            check_schema(engine)
    finally:
        engine.dispose()
    with pytest.raises(SchemaVersionError, match="does not know"):
        MetadataStore(metadata_url)


def test_store_opens_a_database_at_head(metadata_url: str) -> None:
    upgrade(metadata_url)
    with MetadataStore(metadata_url) as store:
        assert store.get_or_create_topic("TopicA").reserve_hours == 72


@contextmanager
def _engine_at(metadata_url: str, revision: str, *inserts: str) -> Iterator[Engine]:
    """The database migrated to ``revision`` holding the rows ``inserts`` add, then migrated to head."""
    upgrade(metadata_url, revision)
    engine = create_metadata_engine(metadata_url)
    try:
        with engine.begin() as connection:
            for insert in inserts:
                connection.execute(text(insert))
        upgrade(metadata_url)
        yield engine
    finally:
        engine.dispose()


def test_topic_retentions_in_hours_become_seconds_and_a_downgrade_rounds_up_to_hours(metadata_url: str) -> None:
    with _engine_at(
        metadata_url,
        "0002_archivers",
        "INSERT INTO topics (name, reserve_hours, status, created, updated) "
        "VALUES ('Kept', 5, 'ACTIVE', 0, 0), ('Default', 72, 'ACTIVE', 0, 0)",
    ) as engine:
        with MetadataStore(metadata_url) as store:
            assert {t.name: t.reserve_seconds for t in store.list_topics()} == {"Kept": 5 * 3600, "Default": 72 * 3600}
            assert store.get_topic("Kept").reserve_hours == 5
            assert store.set_retention("Kept", 30 / 3600).reserve_seconds == 30  # 30 s: kept to the second
        downgrade(metadata_url, "0002_archivers")
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT name, reserve_hours FROM topics ORDER BY name")).all()
        assert [tuple(row) for row in rows] == [("Default", 72), ("Kept", 1)]


def test_refusal_hides_the_password(postgres_url: str) -> None:
    with_password = postgres_url.replace("postgres@", "postgres:s3cret@")
    with pytest.raises(SchemaVersionError) as caught:
        MetadataStore(with_password)
    assert "s3cret" not in str(caught.value)
    assert "***" in str(caught.value)


def test_open_creates_a_brand_new_embedded_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'nested' / 'metadata.db'}"
    with MetadataStore.open(url) as store:
        store.get_or_create_queue("TopicA", 3)
    assert current(url) == head()
    with MetadataStore.open(url) as store:  # reopening keeps what was written
        assert store.get_queue("TopicA", 3).queue_id == 3


def test_open_in_memory_sqlite_works_with_zero_setup() -> None:
    with MetadataStore.open("sqlite://") as store:
        store.get_or_create_topic("TopicA")
        assert [t.name for t in store.list_topics()] == ["TopicA"]


def test_open_does_not_migrate_an_existing_sqlite_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'metadata.db'}"
    engine = create_metadata_engine(url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE someone_elses (id INTEGER)"))
    engine.dispose()
    with pytest.raises(SchemaVersionError, match="tieredstore db upgrade"):
        MetadataStore.open(url)
    assert current(url) is None


def test_open_without_create_refuses_a_new_file(tmp_path: Path) -> None:
    with pytest.raises(SchemaVersionError):
        MetadataStore.open(f"sqlite:///{tmp_path / 'metadata.db'}", create=False)


def test_open_never_migrates_postgres(postgres_url: str) -> None:
    with pytest.raises(SchemaVersionError, match="tieredstore db upgrade"):
        MetadataStore.open(postgres_url)
    assert current(postgres_url) is None


@pytest.mark.parametrize("url", ["mysql://root@localhost/db", "not a url"])
def test_unsupported_or_malformed_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="metadata URL"):
        MetadataStore(url)


def test_migrations_run_without_alembic_ini(metadata_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no alembic.ini anywhere near the working directory
    upgrade(metadata_url)
    assert current(metadata_url) == head()


def test_the_fast_schema_check_knows_the_packaged_head() -> None:
    # Opening a store compares the database with migrate.HEAD without importing Alembic: a migration
    # added without moving HEAD would let a database one revision behind pass as current.
    assert head() == migrate.HEAD


def test_a_store_opens_without_importing_alembic(metadata_url: str, tmp_path: Path) -> None:
    upgrade(metadata_url)
    script = (
        "import sys; from tieredstore.metadata import MetadataStore\n"
        f"MetadataStore({metadata_url!r}).close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_key_ids_are_added_empty_to_existing_rows_and_a_downgrade_drops_them(metadata_url: str) -> None:
    with _engine_at(
        metadata_url,
        "0003_retention_seconds",
        "INSERT INTO segments (path, file_type, base_offset, size, status, created_timestamp) "
        "VALUES ('c/b/Orders/0', 'COMMIT_LOG', 0, 10, 'SEALED', 0)",
        "INSERT INTO index_files (name, status, item_count, size, created, updated) "
        "VALUES ('c/b/rmq_sys_INDEX/0/1', 'UPLOAD', 1, 10, 0, 0)",
    ) as engine:
        with MetadataStore(metadata_url) as store:
            segment = store.get_segment("c/b/Orders/0", "COMMIT_LOG", 0)
            assert (segment.size, segment.key_id) == (10, None)  # written before encryption existed
            assert store.get_index_file("c/b/rmq_sys_INDEX/0/1").key_id is None
            store.update_index_file("c/b/rmq_sys_INDEX/0/1", key_id="k1")
        downgrade(metadata_url, "0003_retention_seconds")
        with engine.connect() as connection:
            columns = {
                c["name"] for table in ("segments", "index_files") for c in inspect(connection).get_columns(table)
            }
            kept = connection.execute(text("SELECT size FROM segments")).scalar_one()
        assert "key_id" not in columns and kept == 10
