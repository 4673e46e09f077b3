"""The engine and session factory, and migrations applied on start.

SQLite (the embedded default) runs in WAL mode, so readers never block the one writer, with a busy
timeout, so writers wait for each other instead of failing. Python's sqlite3 module would open
transactions on its own schedule; it is switched to autocommit and the engine emits BEGIN itself,
BEGIN IMMEDIATE for writers (see `crud`): a transaction that read first and then tried to write
could otherwise fail at once with SQLITE_BUSY when another writer committed in between, without
waiting out the busy timeout.

PostgreSQL is the shared queue of workers on many hosts: a plain `postgresql://` URL uses psycopg 3 (a
dependency, so a second host needs nothing else), claims skip rows other claimers hold (`crud.claim_job`),
and migrations are serialised by an advisory lock in the database rather than a lock file on one host.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from harness import artifacts
from harness.config import Settings

MIGRATIONS_DIR = Path(__file__).parent / "migrations"

# Connection execution option that makes the SQLite BEGIN immediate; other databases ignore it.
WRITE_OPTIONS: dict[str, Any] = {"sqlite_begin": "IMMEDIATE"}

# pg_advisory_xact_lock key held while migrating: any fixed 64-bit number no other tool uses.
MIGRATION_LOCK_KEY = 0x6B68_6D69_6772  # "khmigr"

# Drivers a bare scheme means: SQLAlchemy's default for postgresql:// is psycopg2, which is not installed.
_DEFAULT_DRIVERS = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg"}


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def engine_url(settings: Settings) -> URL:
    """The configured URL with the driver a bare scheme stands for (postgresql:// is psycopg 3)."""
    url = make_url(artifacts.database_url(settings))
    return url.set(drivername=_DEFAULT_DRIVERS.get(url.drivername, url.drivername))


def display_url(settings: Settings) -> str:
    """The database URL for logs and messages: the password masked."""
    return engine_url(settings).render_as_string(hide_password=True)


def make_engine(settings: Settings) -> Engine:
    url = engine_url(settings)
    if url.get_backend_name() != "sqlite":
        # pre_ping: a worker outlives database restarts and dropped idle connections between hosts.
        return create_engine(url, pool_pre_ping=True, pool_size=settings.db_pool_size,
                             max_overflow=settings.db_pool_overflow)
    pool: dict[str, Any] = {}
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        pool = {"pool_size": settings.db_pool_size, "max_overflow": settings.db_pool_overflow}
    # API handlers run in a thread pool; a pooled connection may serve any of its threads.
    engine = create_engine(url, connect_args={"check_same_thread": False,
                                              "timeout": settings.sqlite_busy_timeout_ms / 1000}, **pool)
    busy_ms = int(settings.sqlite_busy_timeout_ms)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # autocommit at the driver; BEGIN comes from _on_begin
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={busy_ms}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "")
        conn.exec_driver_sql(f"BEGIN {mode}".strip())

    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # Objects stay readable after commit: crud returns them to callers that render them.
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config() -> Config:
    """Migrations live inside the package, so they run from an installed wheel as from the repo."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def migrate(engine: Engine, settings: Settings) -> None:
    """Bring the schema to the newest revision. Safe to call from processes starting together, on one host
    (SQLite) or on many (PostgreSQL)."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            # Held to the end of this transaction, which is the migration's own (PostgreSQL's DDL is
            # transactional): the next process waits, then finds the schema at head and does nothing.
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            _upgrade(conn)
        return
    with open(artifacts.migration_lock_path(settings), "w") as lock:
        # A server and its embedded worker start at once; without the lock both would create tables.
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with engine.begin() as conn:
                _upgrade(conn)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _upgrade(conn: Connection) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "head")


class Database:
    """An engine and its session factory, made once per process from the settings."""

    def __init__(self, settings: Settings, *, migrate_now: bool = True):
        self.settings = settings
        self.engine = make_engine(settings)
        self.sessions = make_session_factory(self.engine)
        if migrate_now:
            migrate(self.engine, settings)

    def session(self) -> Session:
        return self.sessions()

    def dispose(self) -> None:
        self.engine.dispose()
