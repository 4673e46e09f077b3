"""Migrations own the schema: they run from any directory, match the models, and tolerate processes
starting together (on PostgreSQL too); SQLite is set up in WAL mode with a busy timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from harness.config import Settings
from harness.db.models import Base
from harness.db.session import Database, alembic_config

REPO = Path(__file__).parents[2]


@pytest.mark.both_databases
def test_migrations_bring_a_fresh_file_to_head_and_match_the_models(db):
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head
        assert set(inspect(conn).get_table_names()) >= {"submissions", "jobs", "results", "tokens", "workers"}
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], f"the models changed without a migration: {diff}"


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(db, db_settings):
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == db_settings.sqlite_busy_timeout_ms
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


@pytest.mark.both_databases
def test_migrating_again_is_a_no_op(db, db_settings):
    Database(db_settings).dispose()
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1


@pytest.mark.both_databases
def test_processes_starting_together_migrate_once_from_outside_the_repo(tmp_path, database_url):
    """As `harness serve` and its worker do; run from a directory with no alembic.ini nearby. On PostgreSQL
    each process has its own data dir, as on hosts of their own: the lock is in the database."""
    code = ("import sys\nfrom harness.config import Settings\nfrom harness.db.session import Database\n"
            f"Database(Settings(data_dir=sys.argv[1], database_url={database_url!r})).dispose()\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    dirs = [tmp_path / "data"] * 3 if database_url is None else [tmp_path / f"host{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", code, str(d)], cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                              text=True) for d in dirs]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    db = Database(Settings(data_dir=tmp_path / "data", database_url=database_url), migrate_now=False)
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
    db.dispose()
