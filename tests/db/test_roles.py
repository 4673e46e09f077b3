"""The worker role (PostgreSQL): a worker's whole queue cycle works under it, and what a hostile submission
could do with the worker's credentials (mint a token, delete results, change the schema) does not."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from harness.config import Settings
from harness.db import crud, queries
from harness.db.roles import grant_worker
from harness.db.session import Database

from ..conftest import import_psycopg
from .factories import eval_result, new_submission

psycopg = import_psycopg()


@pytest.fixture
def worker_db(postgres, tmp_path):
    """A migrated database (as its owner) and the same database seen through a fresh worker role."""
    url = postgres.create_database()
    owner = Database(Settings(data_dir=tmp_path / "owner", database_url=url))
    role = f"w_{uuid.uuid4().hex[:10]}"
    try:
        with owner.engine.begin() as conn:
            conn.execute(text(f'CREATE ROLE "{role}" LOGIN PASSWORD \'x\''))
    except ProgrammingError as e:
        pytest.skip(f"the test server's user may not create roles: {e}")
    grant_worker(owner.engine, role)
    worker_url = make_url(url).set(username=role, password="x").render_as_string(hide_password=False)
    worker = Database(Settings(data_dir=tmp_path / "worker", database_url=worker_url))  # its start-up check too
    yield owner, worker
    worker.dispose()
    owner.dispose()


def test_a_worker_role_runs_the_queue_cycle(worker_db):
    owner, worker = worker_db
    with owner.session() as s:
        for _ in range(2):
            crud.create_submission(s, new_submission(), token=None, queue_limit=None, max_attempts=3)
    with worker.session() as s:
        crud.register_worker(s, "w1", hostname="h", pid=1, slots=["cpu"])
        a, b = crud.claim_job(s, "w1", 0.01), crud.claim_job(s, "w1", 30)
        assert crud.heartbeat(s, "w1", [b.claim_token], 30) == {b.claim_token}
        assert crud.mark_running(s, b.job_id, b.claim_token)
        assert crud.complete_job(s, b.job_id, b.claim_token, eval_result()) is not None
        requeued, _ = crud.requeue_expired(s, lambda *_: eval_result())
        assert requeued == [a.job_id]
        c = crud.claim_job(s, "w1", 30)
        assert crud.retry_job(s, c.job_id, c.claim_token, "GPU fell off the bus", 0)
        c = crud.claim_job(s, "w1", 30)
        assert crud.release_job(s, c.job_id, c.claim_token)
        c = crud.claim_job(s, "w1", 30)  # then w1's process is found gone: its job goes back at once
        requeued, failed = crud.requeue_expired(s, lambda *_: eval_result(), dead_workers=["w1"])
        assert requeued + failed == [c.job_id]  # back in the queue, or (its attempts spent) an infra_error
        assert queries.running_workers_on(s, "h") == []


@pytest.mark.parametrize("statement", [
    "INSERT INTO tokens (name, token_hash, is_admin, created_at) VALUES ('x', 'h', true, now())",
    "SELECT token_hash FROM tokens",
    "DELETE FROM results",
    "DELETE FROM jobs",
    "DROP TABLE results",
    "ALTER TABLE jobs ADD COLUMN x int",
    "CREATE TABLE x (id int)",
])
def test_a_worker_role_cannot_reach_beyond_the_queue(worker_db, statement):
    _, worker = worker_db
    url = worker.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)


def test_grant_worker_refuses_a_role_that_does_not_exist(postgres, tmp_path):
    db = Database(Settings(data_dir=tmp_path, database_url=postgres.create_database()))
    with pytest.raises(ValueError, match="no PostgreSQL role"):
        grant_worker(db.engine, "nobody_here")
    db.dispose()
