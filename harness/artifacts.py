"""The one owner of on-disk paths: job dirs (logs, results), build cache dirs, scratch dirs."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from harness.config import Settings


def new_job_id() -> str:
    return uuid.uuid4().hex[:16]


def job_dir(settings: Settings, job_id: str) -> Path:
    path = settings.data_dir / "jobs" / job_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_key(source: str, *, arch: str, torch_version: str, cuda_version: str | None, python: str) -> str:
    h = hashlib.sha256()
    for part in (source, arch, torch_version, cuda_version or "cpu", python):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def compile_cache_env(settings: Settings) -> dict[str, str]:
    """Where the trusted child's torch.compile baseline keeps inductor's and Triton's caches: one folder for
    every evaluation, so the reference is compiled once per problem, size and software, not once per
    submission. Only trusted children get it, and only where candidates run as sandbox uids that cannot see
    the data dir (runner.trusted_cache_env decides)."""
    root = settings.data_dir / "compile-cache"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton")}


def build_dir(settings: Settings, key: str) -> Path:
    path = settings.data_dir / "builds" / key
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def exclusive_build_dir(path: Path, wait: bool = True) -> Iterator[None]:
    """Hold a build dir alone while a candidate compiles into it (with `wait` False, BlockingIOError at once where
    another holds it).

    Identical sources share a build dir, so the second evaluation reuses the first one's build.
    torch's own lock file (`<ext>/lock`) outlives a build killed at its deadline and would make the
    next build wait forever; while we hold this lock no build runs there, so such files are stale.
    """
    path.mkdir(parents=True, exist_ok=True)  # pruning may have removed it since build_dir()
    with open(path / ".harness.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.utime(path)  # last use, for prune_build_cache
        for stale in path.glob("*/lock"):
            with contextlib.suppress(OSError):
                stale.unlink()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def prune_build_cache(settings: Settings, max_bytes: int) -> list[Path]:
    """Remove the least recently used build dirs until the cache fits `max_bytes`; a dir in use (its
    lock held) is never removed. Returns what was removed."""
    root = settings.data_dir / "builds"
    if not root.is_dir():
        return []
    dirs = sorted((d.stat().st_mtime, d) for d in root.iterdir() if d.is_dir())
    sizes = {d: _tree_bytes(d) for _, d in dirs}
    total = sum(sizes.values())
    removed = []
    for _, d in dirs:
        if total <= max_bytes:
            break
        try:
            with open(d / ".harness.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            continue  # in use
        total -= sizes[d]
        removed.append(d)
    return removed


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def new_scratch_dir(settings: Settings, prefix: str = "kh-eval-") -> Path:
    """A private temp dir (mode 0700) under the scratch root; the caller removes it (`scratch_dir`)."""
    root = settings.scratch_dir
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


@contextlib.contextmanager
def scratch_dir(settings: Settings, made: Path | None = None) -> Iterator[Path]:
    """A private temp dir for one evaluation (`made` ahead of it, or a new one), removed in every path."""
    path = made or new_scratch_dir(settings)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def database_url(settings: Settings) -> str:
    """The configured SQLAlchemy URL, or the embedded SQLite file in the data dir."""
    if settings.database_url:
        return settings.database_url
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{settings.data_dir / 'harness.db'}"


def migration_lock_path(settings: Settings) -> Path:
    """Held while migrations run, so a server and its workers starting together migrate once."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return settings.data_dir / "migrate.lock"


def bootstrap_token_path(settings: Settings) -> Path:
    """Where `harness serve` leaves the first admin token it makes (mode 0600), for the local user."""
    return settings.data_dir / "admin-token"
