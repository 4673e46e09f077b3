"""PostgreSQL roles: the least a worker needs.

A worker runs untrusted code on its host; whatever can read the worker's database credentials gets the
worker's rights. So workers on other hosts log in as a role that can claim jobs and store results, table by
table, and cannot touch tokens, delete anything or change the schema. Grants name tables, so they are
given again after each migration (`harness db grant-worker`, which the compose `migrate` step runs).
"""

from __future__ import annotations

from sqlalchemy import Engine, text

# What `crud`'s queue functions do as a worker: claim, heartbeat, finish, retry, release, requeue expired
# leases (which may store an infra_error result), register the worker.
WORKER_GRANTS: dict[str, str] = {
    "jobs": "SELECT, UPDATE",
    "submissions": "SELECT, UPDATE",
    "results": "SELECT, INSERT",
    "workers": "SELECT, INSERT, UPDATE",
    "alembic_version": "SELECT",  # the migration check every process runs at start
}
WORKER_SEQUENCES = ("results_id_seq",)


def grant_worker(engine: Engine, role: str) -> None:
    """Give an existing PostgreSQL role a worker's rights (and no more) on the current schema."""
    if engine.dialect.name != "postgresql":
        raise ValueError("worker roles are PostgreSQL's; SQLite has no users")
    with engine.begin() as conn:
        quote = engine.dialect.identifier_preparer.quote
        exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).scalar()
        if not exists:
            raise ValueError(f"no PostgreSQL role {role!r}: create it first (CREATE ROLE {role} LOGIN PASSWORD ...)")
        conn.execute(text(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {quote(role)}"))
        for table, privileges in WORKER_GRANTS.items():
            conn.execute(text(f"GRANT {privileges} ON {quote(table)} TO {quote(role)}"))
        for seq in WORKER_SEQUENCES:
            conn.execute(text(f"GRANT USAGE ON SEQUENCE {quote(seq)} TO {quote(role)}"))
