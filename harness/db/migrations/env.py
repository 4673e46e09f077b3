"""Alembic environment. `harness.db.session.migrate` passes a connection in; the `alembic` command
(for writing new revisions: alembic -c harness/db/migrations/alembic.ini revision --autogenerate -m ...)
connects to the database the HARNESS_ settings name."""

from __future__ import annotations

from alembic import context

from harness.db.models import Base, UTCDateTime

config = context.config


def _render_item(kind: str, obj: object, _autogen_context: object) -> str | bool:
    # Revisions stand alone: they must not import model code that may change after them.
    if kind == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime()"
    return False


def _run(connection) -> None:
    # Batch mode: SQLite cannot ALTER most things, so alembic rebuilds the table instead.
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                      compare_type=True, render_item=_render_item)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from harness.config import Settings
    from harness.db.session import make_engine

    engine = make_engine(Settings())
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run them against a database")
run_migrations()
