"""`harness tokens create|ls|revoke`: API tokens, stored hashed; the secret is shown once."""

from __future__ import annotations

import typer

from harness.cli.common import aligned
from harness.db import crud, queries
from harness.db.session import Database
from harness.service.runtime import settings_with

app = typer.Typer(help="Create, list and revoke API tokens.", no_args_is_help=True)

DatabaseUrlOption = typer.Option(None, "--database-url", help="SQLAlchemy URL (default: the SQLite file in the "
                                 "data dir).")


@app.command("create")
def create(name: str = typer.Option(..., "--name", help="Who holds it (shown in listings)."),
           admin: bool = typer.Option(False, "--admin", help="May re-evaluate and delete any submission."),
           max_queued: int = typer.Option(None, "--max-queued", min=1, help="Unfinished submissions allowed "
                                          "(default: HARNESS_MAX_QUEUED_PER_TOKEN)."),
           database_url: str = DatabaseUrlOption) -> None:
    """Create a token and print its secret (only this once).

    Example: harness tokens create --name alice
    """
    db = Database(settings_with(database_url=database_url))
    with db.session() as s:
        token, secret = crud.create_token(s, name, is_admin=admin, max_queued=max_queued)
    typer.echo(f"token {token.id} for {name}{' (admin)' if admin else ''}; keep the secret, it is not stored:",
               err=True)
    typer.echo(secret)


@app.command("ls")
def list_tokens(database_url: str = DatabaseUrlOption) -> None:
    """List tokens (never their secrets)."""
    db = Database(settings_with(database_url=database_url))
    with db.session() as s:
        tokens = queries.list_tokens(s)
    rows = [[str(t.id), t.name, "yes" if t.is_admin else "no", str(t.max_queued or "-"),
             f"{t.created_at:%Y-%m-%d %H:%M:%S}", f"{t.revoked_at:%Y-%m-%d %H:%M:%S}" if t.revoked_at else "-"]
            for t in tokens]
    for line in aligned(["id", "name", "admin", "max queued", "created", "revoked"], rows, right=frozenset({0, 3})):
        typer.echo(line)


@app.command("revoke")
def revoke(token_id: int = typer.Argument(..., help="The id `harness tokens ls` shows."),
           database_url: str = DatabaseUrlOption) -> None:
    """Revoke a token: requests with it get 401 from now on."""
    db = Database(settings_with(database_url=database_url))
    with db.session() as s:
        if not crud.revoke_token(s, token_id):
            typer.echo(f"error: no active token {token_id}", err=True)
            raise typer.Exit(1)
    typer.echo(f"token {token_id} revoked", err=True)
