"""`harness db upgrade|status`: apply the migrations, or show where a database stands."""

from __future__ import annotations

import typer
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from harness.cli.tokens import DatabaseUrlOption
from harness.db.roles import WORKER_GRANTS, grant_worker
from harness.db.session import Database, alembic_config, display_url
from harness.service.runtime import settings_with

app = typer.Typer(help="The database: migrations and status.", no_args_is_help=True)


def _revisions(db: Database) -> tuple[str | None, str | None]:
    with db.engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, ScriptDirectory.from_config(alembic_config()).get_current_head()


@app.command("upgrade")
def upgrade(database_url: str = DatabaseUrlOption) -> None:
    """Bring the schema to the newest revision (every `harness` command that uses the database does it too;
    this one is for deployments that migrate in a step of their own).

    Example: harness db upgrade --database-url postgresql://harness@db.lab/harness
    """
    settings = settings_with(database_url=database_url)
    db = Database(settings)
    current, _ = _revisions(db)
    db.dispose()
    typer.echo(f"{display_url(settings)}: at revision {current}")


@app.command("status")
def status(database_url: str = DatabaseUrlOption) -> None:
    """Connect and compare the schema's revision with this harness's; exit 1 when they differ.

    Example, from a new worker host: harness db status --database-url postgresql://harness@db.lab/harness
    """
    settings = settings_with(database_url=database_url)
    db = Database(settings, migrate_now=False)
    try:
        current, head = _revisions(db)
    finally:
        db.dispose()
    typer.echo(f"{display_url(settings)}: revision {current}, this harness expects {head}")
    if current != head:
        raise typer.Exit(1)


@app.command("grant-worker")
def grant_worker_command(role: str = typer.Argument(..., help="An existing PostgreSQL role the workers log in as."),
                         database_url: str = DatabaseUrlOption) -> None:
    """Give a PostgreSQL role what a worker needs and nothing more: claim jobs and store results; no tokens, no
    deletes, no schema changes. Run it as the schema's owner, after every upgrade.

    Example:

      psql -c "CREATE ROLE harness_worker LOGIN PASSWORD '...'"   # once

      harness db grant-worker harness_worker --database-url postgresql://harness@db.lab/harness
    """
    settings = settings_with(database_url=database_url)
    db = Database(settings)
    try:
        grant_worker(db.engine, role)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    finally:
        db.dispose()
    typer.echo(f"{role} may now: " + "; ".join(f"{t}: {p}" for t, p in WORKER_GRANTS.items()))
