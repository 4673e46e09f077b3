"""A throwaway PostgreSQL server for the queue suite: initdb and pg_ctl in a temp dir, listening on a free
loopback port, trust auth (nothing but this machine's loopback can reach it). PostgreSQL refuses to run as
root, so under root the server runs as the `postgres` user (Debian's package makes it) or `nobody`.
HARNESS_TEST_POSTGRES_URL names an existing server instead (its user must be allowed CREATE DATABASE)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url


def find_bindir() -> Path | None:
    """The newest installed server binaries (Debian keeps them out of PATH)."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """Databases on one server; `create_database` makes a fresh one per test."""

    def __init__(self, admin_url: str, *, root: Path | None = None, bindir: Path | None = None,
                 run_as: list[str] | None = None):
        self.admin_url = admin_url  # a SQLAlchemy/libpq URL of a database to run CREATE DATABASE from
        self.root, self.bindir, self.run_as = root, bindir, run_as or []

    @classmethod
    def start(cls, bindir: Path) -> PostgresServer:
        root = Path(tempfile.mkdtemp(prefix="harness-pg-"))
        run_as: list[str] = []
        if os.geteuid() == 0:
            user = _unprivileged_user()
            os.chown(root, user.pw_uid, user.pw_gid)
            run_as = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]
        port = _free_port()
        server = cls(f"postgresql://postgres@127.0.0.1:{port}/postgres", root=root, bindir=bindir, run_as=run_as)
        data = root / "data"
        server._run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
        # fsync off: a throwaway server; the tests are about concurrency, not durability.
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c max_connections=200"
        server._run("pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-o", opts, "-w", "-t", "60", "start")
        return server

    def _run(self, tool: str, *args: str) -> None:
        assert self.bindir is not None and self.root is not None
        proc = subprocess.run([*self.run_as, str(self.bindir / tool), *args], capture_output=True, text=True,
                              cwd=self.root, timeout=120)
        if proc.returncode != 0:
            log = self.root / "server.log"
            raise RuntimeError(f"{tool} failed ({proc.returncode}): {proc.stderr[-2000:]}"
                               + (log.read_text()[-2000:] if log.exists() else ""))

    def create_database(self) -> str:
        """A new empty database; returns its URL as `--database-url` takes it."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self._libpq(self.admin_url), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return make_url(self.admin_url).set(database=name).render_as_string(hide_password=False)

    @staticmethod
    def _libpq(url: str) -> str:
        return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)

    def stop(self) -> None:
        if self.root is None:
            return
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _unprivileged_user() -> pwd.struct_passwd:
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root with neither a postgres nor a nobody user to run PostgreSQL as")
