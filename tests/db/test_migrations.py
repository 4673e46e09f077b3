"""Migrations own the schema: they run from any directory, match the models, and tolerate processes
starting together (on PostgreSQL too); SQLite is set up in WAL mode with a busy timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
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


_MIGRATE_ON_GO = """
import sys, time
from pathlib import Path
from harness.config import Settings
from harness.db.session import Database, make_engine
settings = Settings(data_dir=sys.argv[1], database_url=sys.argv[3] or None)
make_engine(settings).dispose()  # imports and driver loaded: only the migration itself is left to race
go = Path(sys.argv[2])
Path(f"{go}.ready.{sys.argv[4]}").touch()
while not go.exists():
    time.sleep(0.001)
Database(settings).dispose()
"""


@pytest.mark.both_databases
def test_processes_starting_together_migrate_once_from_outside_the_repo(tmp_path, database_url):
    """As `harness serve` and its worker do, released at one instant; run from a directory with no alembic.ini
    nearby. On PostgreSQL each process has its own data dir, as on hosts of their own: the lock is in the
    database. (Without the lock this fails: several processes create the tables.)"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    go = tmp_path / "go"
    n = 6
    dirs = [tmp_path / "data"] * n if database_url is None else [tmp_path / f"host{i}" for i in range(n)]
    procs = [subprocess.Popen([sys.executable, "-c", _MIGRATE_ON_GO, str(d), str(go), database_url or "", str(i)],
                              cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True) for i, d in enumerate(dirs)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.ready.*"))) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    db = Database(Settings(data_dir=tmp_path / "data", database_url=database_url), migrate_now=False)
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
    db.dispose()


@pytest.mark.both_databases
def test_the_flags_column_is_backfilled_from_stored_payloads(db_settings):
    """0002 adds results.flags: a database stored before it keeps ranking its flagged results apart."""
    from alembic import command
    from sqlalchemy import update

    from harness.db import crud
    from harness.db.models import Result
    from harness.db.session import make_engine
    from harness.schema import Flag

    from .factories import eval_result, new_submission

    # A database at head with two results, then taken back to 0001 as a database made before 0002 was.
    db = Database(db_settings)
    with db.session() as s:
        flagged = eval_result().model_copy(update={"flags": [Flag(check="no_custom_kernel", detail="d")]})
        ids = []
        for r in (flagged, eval_result()):
            sub, _ = crud.create_submission(s, new_submission(), token=None, queue_limit=None, max_attempts=3)
            claim = crud.claim_job(s, "w", 60)
            crud.complete_job(s, claim.job_id, claim.claim_token, r)
            ids.append(sub.id)
        s.execute(update(Result).values(flags=[]))  # what 0002 must recover from the payloads
        s.commit()
    db.dispose()
    engine = make_engine(db_settings)
    with engine.begin() as conn:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0001")
        assert "flags" not in {c["name"] for c in inspect(conn).get_columns("results")}
        command.upgrade(cfg, "head")
        got = dict(conn.execute(text("SELECT submission_id, flags FROM results")).all())
    engine.dispose()
    as_lists = {k: v if isinstance(v, list) else json.loads(v) for k, v in got.items()}
    assert as_lists == {ids[0]: ["no_custom_kernel"], ids[1]: []}


@pytest.mark.both_databases
def test_submissions_and_results_stored_before_precision_existed_carry_fp32(db_settings):
    """0004 adds submissions.precision and results.precision: rows stored before it ran at fp32, and none is lost (a
    rebuild of `submissions` on SQLite would cascade into its jobs and results)."""
    from alembic import command

    from harness.db import crud
    from harness.db.session import make_engine

    from .factories import eval_result, new_submission

    db = Database(db_settings)
    with db.session() as s:
        crud.create_submission(s, new_submission(), token=None, queue_limit=None, max_attempts=3)
        claim = crud.claim_job(s, "w", 60)
        crud.complete_job(s, claim.job_id, claim.claim_token, eval_result())
    db.dispose()
    engine = make_engine(db_settings)
    with engine.begin() as conn:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0002")
        assert "precision" not in {c["name"] for c in inspect(conn).get_columns("results")}
        command.upgrade(cfg, "head")
        subs = conn.execute(text("SELECT precision FROM submissions")).scalars().all()
        results = conn.execute(text("SELECT precision FROM results")).scalars().all()
        jobs = conn.execute(text("SELECT count(*) FROM jobs")).scalar()
    engine.dispose()
    assert subs == ["fp32"] and results == ["fp32"] and jobs == 1
