"""`harness serve`: the API, and by default an embedded worker for this machine's GPUs (or its CPU)."""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import typer

from harness import artifacts
from harness.cli.common import ProblemsDirOption
from harness.cli.worker import GpusOption
from harness.config import Settings
from harness.db import crud, queries
from harness.db.session import Database, display_url
from harness.sandbox import capabilities
from harness.service.runtime import settings_with, setup_logging

log = logging.getLogger("harness.serve")

_WORKER_RESTARTS = 3


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_socket(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before anything is printed or stored: a port in use is then
    an error that leaves no token, database or worker behind. Raises OSError."""
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and without it a
    # response written in two pieces (headers, body) waits out the client's delayed ACK, about 40 ms on each request
    # of a kept-alive connection after its first.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def bootstrap_token(db: Database, settings: Settings) -> str | None:
    """On a database with no token, make an admin token and leave it (mode 0600) for the local user, as
    Jupyter does: the service is usable at once and closed to everyone else."""
    with db.session() as s:
        if queries.count_tokens(s, active_only=False):
            return None
        _, secret = crud.create_token(s, "admin (made by harness serve)", is_admin=True)
    path = artifacts.bootstrap_token_path(settings)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


def _example(base: str, token_file: Path) -> str:
    body = ('{"problem": "level2/75", "submitter": "me", "model": "my-llm", "source": open(sys.argv[1]).read()}')
    return (f"  python3 -c 'import json,sys; print(json.dumps({body}))' my_kernel.py |\n"
            f"    curl -sS -H \"Authorization: Bearer $(cat {token_file})\" -H 'Content-Type: application/json' "
            f"--data-binary @- {base}/api/submissions")


class EmbeddedWorker:
    """`harness worker` as a child process, restarted a few times if it dies, stopped with the server."""

    def __init__(self, settings: Settings, gpus: str):
        self.cmd = [sys.executable, "-m", "harness", "worker", "--gpus", gpus, "--exit-with-parent", str(os.getpid())]
        # The child reads the same settings; options given to serve travel as environment variables.
        self.env = {**os.environ, "HARNESS_DATA_DIR": str(settings.data_dir),
                    "HARNESS_DATABASE_URL": artifacts.database_url(settings)}
        if settings.problems_dir is not None:
            self.env["HARNESS_PROBLEMS_DIR"] = str(settings.problems_dir)
        if settings.allow_unsafe_sandbox:
            self.env["HARNESS_ALLOW_UNSAFE_SANDBOX"] = "1"
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="embedded-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _supervise(self) -> None:
        restarts = 0
        while not self._stopping.is_set():
            self.proc = subprocess.Popen(self.cmd, env=self.env)
            code = self.proc.wait()
            if self._stopping.is_set():
                return
            restarts += 1
            if restarts > _WORKER_RESTARTS:
                log.error("the embedded worker exited (code %s) %d times; no more restarts: nothing is evaluated "
                          "until `harness worker` runs", code, restarts)
                return
            log.error("the embedded worker exited with code %s; restarting it in 5 s", code)
            self._stopping.wait(5)

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stopping.set()
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # the worker finishes or hands back the jobs in hand
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_command(
    host: str = typer.Option(None, "--host", help="Address to listen on (default 127.0.0.1, HARNESS_HOST)."),
    port: int = typer.Option(None, "--port", help="Port (default 8000, HARNESS_PORT)."),
    no_worker: bool = typer.Option(False, "--no-worker", help="API only: workers run elsewhere (`harness worker`)."),
    gpus: str = GpusOption,
    open_mode: bool = typer.Option(None, "--open", help="Accept submissions without a token (local single-user "
                                   "use; refused unless listening on loopback)."),
    database_url: str = typer.Option(None, "--database-url", help="SQLAlchemy URL (default: SQLite in the data dir)."),
    problems_dir: Path = ProblemsDirOption,
    allow_unsafe_sandbox: bool = typer.Option(
        None, "--allow-unsafe-sandbox", help="Let the embedded worker run where submissions cannot be kept off the "
        "network or (as root) given a user of their own. See docs/security.md."),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Run the service: the HTTP API, SQLite by default, and a worker for this machine's GPUs (or its CPU).

    One evaluation slot per GPU; without a GPU the CPU evaluates at the problems' small sizes and the
    results are marked as CPU results.

    Examples:

      harness serve                        # http://127.0.0.1:8000, docs at /docs

      harness serve --host 0.0.0.0 --no-worker --database-url postgresql://db/harness
    """
    # Imported here: every other `harness` command starts faster without the web stack.
    import uvicorn

    from harness.api import create_app

    setup_logging(log_level)
    settings = settings_with(host=host, port=port, open_mode=open_mode, database_url=database_url,
                             problems_dir=problems_dir, allow_unsafe_sandbox=allow_unsafe_sandbox)
    if settings.open_mode and not _is_loopback(settings.host):
        typer.echo(f"error: open mode accepts code to run on this machine from anyone who can reach the port; "
                   f"it listens on loopback only, not {settings.host}. Use tokens (`harness tokens create`).",
                   err=True)
        raise typer.Exit(2)
    try:
        sock = listen_socket(settings.host, settings.port)
    except OSError as e:
        hint = "; stop what uses it, or choose another with --port" if e.errno == errno.EADDRINUSE else ""
        typer.echo(f"error: cannot listen on {settings.host}:{settings.port}: {e.strerror or e}{hint}", err=True)
        raise typer.Exit(1) from None
    port = sock.getsockname()[1]  # --port 0: the port the system chose
    if not no_worker:
        try:
            capabilities.check_safe(settings)  # say so now, not through a worker that keeps failing to start
        except capabilities.UnsafeSandbox as e:
            typer.echo(f"error: {e}", err=True)
            sock.close()
            raise typer.Exit(1) from None
    db = Database(settings)  # migrates before the worker starts, so the two never race to create tables
    secret = None if settings.open_mode else bootstrap_token(db, settings)
    base = f"http://{settings.host}:{port}"
    typer.echo(f"KernelHarness on {base}  (API docs: {base}/docs, database: {display_url(settings)})",
               err=True)
    if settings.open_mode:
        typer.echo("open mode: submissions need no token; re-evaluation and deletion need an admin token", err=True)
    else:
        token_file = artifacts.bootstrap_token_path(settings)
        if secret:
            typer.echo(f"created an admin token (also in {token_file}, mode 0600):\n  {secret}", err=True)
        elif token_file.exists():
            typer.echo(f"the admin token made on first start is in {token_file}", err=True)
        typer.echo("submit my_kernel.py (more tokens: harness tokens create --name <who>):", err=True)
        typer.echo(_example(base, token_file), err=True)
    worker = None if no_worker else EmbeddedWorker(settings, gpus)
    if worker:
        worker.start()
    # uvicorn shuts down on SIGINT/SIGTERM, restores the handlers it found and raises the signal again:
    # with ours in place that ends up here, so the worker is stopped in order and the exit is clean.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_stop)
    try:
        config = uvicorn.Config(create_app(settings, db=db), host=settings.host, port=port, log_level=log_level)
        uvicorn.Server(config).run(sockets=[sock])
    except _Stop:
        pass
    finally:
        sock.close()
        if worker:
            worker.stop()
        db.dispose()


class _Stop(Exception):
    pass


def _raise_stop(_signum: int, _frame: object) -> None:
    raise _Stop()
