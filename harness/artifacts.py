"""The one owner of on-disk paths: job dirs (logs, results), build cache dirs, scratch dirs."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
import threading
import time
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
    the data dir (starts.trusted_cache_env decides)."""
    root = settings.data_dir / "compile-cache"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton")}


def reduced_size_path(settings: Settings, key: str) -> Path:
    """Where a problem file's reduced CPU size, once chosen, is kept (`evaluation.reduced_size`)."""
    root = settings.data_dir / "sizes"
    root.mkdir(parents=True, exist_ok=True)
    return root / f"{key}.json"


def build_dir(settings: Settings, key: str) -> Path:
    path = settings.builds_dir / key
    path.mkdir(parents=True, exist_ok=True)
    return path


# A build dir's lock file, in the dir (`exclusive_build_dir`).
BUILD_LOCK = ".harness.lock"


def build_manifest(path: Path) -> Path:
    """Where the record of what a build dir keeps lies (sandbox/builds.py): beside the dir, where the candidate that
    builds in it cannot write."""
    return path.parent / f".{path.name}.manifest.json"


@contextlib.contextmanager
def exclusive_build_dir(path: Path, wait: bool = True) -> Iterator[None]:
    """Hold a build dir alone while a candidate compiles into it (with `wait` False, BlockingIOError at once where
    another holds it).

    Identical sources share a build dir, so the second evaluation reuses the first one's build.
    torch's own lock file (`<ext>/lock`) outlives a build killed at its deadline and would make the
    next build wait forever; while we hold this lock no build runs there, so such files are stale.
    """
    path.mkdir(parents=True, exist_ok=True)  # pruning may have removed it since build_dir()
    with open(path / BUILD_LOCK, "w") as lock:
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
    root = settings.builds_dir
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
            with open(d / BUILD_LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(d, ignore_errors=True)
                with contextlib.suppress(OSError):
                    build_manifest(d).unlink()
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


# A scratch dir's owner holds an exclusive flock on this file (close-on-exec: no child inherits it) for as long as
# the dir is in use; the kernel drops the lock when the owner dies, however it died.
_OWNER_LOCK = ".owner.lock"
_held: dict[Path, int] = {}  # this process's scratch dirs -> their owner lock's fd
_held_lock = threading.Lock()
_UNLOCKED_STALE_S = 6 * 3600  # a dir without an owner lock (made by an older harness) is left over past this age
_SWEEP_EVERY_S = 60.0
_last_sweep = [0.0]


def new_scratch_dir(settings: Settings, prefix: str = "kh-eval-") -> Path:
    """A private temp dir (mode 0700) under the scratch root, owned by this process until `remove_scratch_dir`
    (`scratch_dir` does both). Leftovers of processes that died hard are swept first (`sweep_scratch`)."""
    root = settings.scratch_dir
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    if time.monotonic() - _last_sweep[0] > _SWEEP_EVERY_S:
        _last_sweep[0] = time.monotonic()
        sweep_scratch(Path(root or tempfile.gettempdir()))
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    fd = os.open(path / _OWNER_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    with _held_lock:
        _held[path] = fd
    return path


def remove_scratch_dir(path: Path) -> None:
    """Remove a scratch dir this process made, and give up its ownership."""
    shutil.rmtree(path, ignore_errors=True)
    with _held_lock:
        fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


def sweep_scratch(root: Path, prefixes: tuple[str, ...] = ("kh-eval-", "kh-trusted-")) -> list[Path]:
    """Remove the scratch dirs under `root` whose owner is gone: a process killed hard (SIGKILL, a call's time
    limit) never runs its cleanup, and an H100 host's disk filled with such leftovers. A dir whose owner lock is
    free is left over; one with no lock file only once it is `_UNLOCKED_STALE_S` old (a dir is locked the moment
    it is made, so a young one may be about to be). Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = [p for p in root.iterdir() if p.name.startswith(prefixes)]
    except OSError:
        return removed
    for path in entries:
        with _held_lock:
            if path in _held:
                continue
        if path.is_symlink() or not path.is_dir():
            continue
        try:
            fd = os.open(path / _OWNER_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if time.time() - path.stat().st_mtime > _UNLOCKED_STALE_S:
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its owner is alive
            os.close(fd)
            continue
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
        removed.append(path)
    return removed


def remove_files(directory: Path) -> None:
    """Remove the files in a dir a sandboxed child owns, never following a link it may have put there: the dir is
    opened without following one, and its entries are unlinked through that fd (a link itself, not its target)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for entry in os.scandir(fd):
            if not entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def scratch_dir(settings: Settings, made: Path | None = None) -> Iterator[Path]:
    """A private temp dir for one evaluation (`made` ahead of it, or a new one), removed in every path."""
    path = made or new_scratch_dir(settings)
    try:
        yield path
    finally:
        remove_scratch_dir(path)


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
