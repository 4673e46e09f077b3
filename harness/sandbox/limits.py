"""What confines a child, planned in the parent: uid, namespaces, cgroups, rlimits, disk use.

`Jail` is one child's confinement. The parent builds it, `setup()` allocates a sandbox uid (a lock
file per uid, so concurrent evaluations on one host, in any worker process, never share one), makes
the child's dirs its own, creates its cgroups; `launcher()` gives the argv prefix that applies the
rest inside the child (see `confine.py`); `cleanup()` kills everything the child left (by cgroup
and by uid: a process that called setsid() is not in the process group but is still found) and
gives the uid back.

What the platform allows is probed once (`platform()`): a worker refuses to run with less than a
network namespace and (as root) a user switch unless `allow_unsafe_sandbox` says so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from harness.config import Settings

log = logging.getLogger("harness.sandbox")

_HARNESS_ROOT = Path(__file__).resolve().parents[2]
_CGROUP = Path("/sys/fs/cgroup")
_KILL = shutil.which("kill", path="/usr/bin:/bin") or "/bin/kill"  # not the interpreter: the uid may not reach it


class SandboxError(RuntimeError):
    """The confinement could not be set up: the harness's fault, never the submission's."""


class UnsafeSandbox(RuntimeError):
    """The platform cannot confine children as required, and unsafe mode was not allowed."""


# ---- what the platform allows ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Platform:
    root: bool
    netns: bool  # a new network namespace can be made (as root, or through a user namespace)
    mountns: bool  # as root: a mount namespace hiding the data dir and other evaluations
    user_switch: bool  # as root: children can run as sandbox uids
    cgroup: str | None  # "v2", "v1" or None
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [f"network namespace {'yes' if self.netns else 'NO'}",
                 f"sandbox user {'yes' if self.user_switch else ('NO' if self.root else 'n/a (not root)')}",
                 f"mount namespace {'yes' if self.mountns else 'no'}",
                 f"cgroup {self.cgroup or 'NO (no memory limit, no pids limit for root children)'}"]
        return ", ".join(parts)


def _own_cgroup_dirs() -> dict[str, Path]:
    """controller -> this process's cgroup dir: {"unified": ...} on v2, {"memory": ..., "pids": ...} on v1."""
    dirs: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return dirs
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":
            v2 = _CGROUP / rel if (_CGROUP / "cgroup.controllers").exists() else _CGROUP / "unified" / rel
            dirs["unified"] = v2
        for c in controllers.split(","):
            if c in ("memory", "pids"):
                dirs[c] = _CGROUP / c / rel
    return dirs


def _cgroup_version() -> str | None:
    dirs = _own_cgroup_dirs()
    probe = f"kh-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    v2 = dirs.get("unified")
    if v2 is not None:
        try:
            controllers = (v2 / "cgroup.controllers").read_text().split()
        except OSError:
            controllers = []
        if {"memory", "pids"} <= set(controllers):
            with contextlib.suppress(OSError):
                (v2 / probe).mkdir()
                ok = (v2 / probe / "memory.max").exists() and (v2 / probe / "pids.max").exists()
                (v2 / probe).rmdir()
                if ok:
                    return "v2"
    if "memory" in dirs and "pids" in dirs:
        try:
            for c in ("memory", "pids"):
                (dirs[c] / probe).mkdir()
                (dirs[c] / probe).rmdir()
            return "v1"
        except OSError:
            return None
    return None


def _try_launch(cfg: dict) -> str | None:
    """Run the launcher with `cfg` on `true`; None when it worked, else why not."""
    r, w = os.pipe()
    try:
        proc = subprocess.run([sys.executable, "-s", "-m", "harness.sandbox.confine", str(w), json.dumps(cfg),
                               "--", "/bin/true"], pass_fds=(w,), capture_output=True, timeout=30,
                              env={"PYTHONPATH": str(_HARNESS_ROOT)})
        os.close(w)
        w = -1
        msg = os.read(r, 4000).decode(errors="replace")
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    return None if proc.returncode == 0 else (msg or f"exit {proc.returncode}")


@functools.cache
def platform() -> Platform:
    root = os.geteuid() == 0
    notes = []
    net_cfg = {"netns": True} if root else {"netns": True, "userns": True}
    why = _try_launch(net_cfg)
    netns = why is None
    if not netns:
        notes.append(f"no network namespace: {why}")
    mountns = user_switch = False
    if root:
        why = _try_launch({"hide": [tempfile.gettempdir()], "keep": [], "netns": True,
                           "user": {"uid": 65534, "gid": 65534}})
        mountns = user_switch = why is None
        if why:
            notes.append(f"no mount namespace / user switch: {why}")
    found = Platform(root=root, netns=netns, mountns=mountns, user_switch=user_switch, cgroup=_cgroup_version(),
                     notes=tuple(notes))
    log.info("sandbox platform: %s%s", found.describe(), "".join(f"; {n}" for n in found.notes))
    return found


def check_safe(settings: Settings) -> Platform:
    """For a worker: the platform must isolate the network and (as root) switch users, or unsafe mode is
    explicitly allowed. Raises UnsafeSandbox otherwise."""
    p = platform()
    missing = []
    if settings.sandbox_network != "off" and not p.netns:
        missing.append("a network namespace")
    elif settings.sandbox_network == "off":
        missing.append("a network namespace (HARNESS_SANDBOX_NETWORK=off)")
    if p.root and settings.sandbox_user != "off" and not p.user_switch:
        missing.append("a sandbox user")
    elif p.root and settings.sandbox_user == "off":
        missing.append("a sandbox user (HARNESS_SANDBOX_USER=off)")
    if missing:
        why = "; ".join(missing)
        if not settings.allow_unsafe_sandbox:
            raise UnsafeSandbox(f"the sandbox lacks {why} ({p.describe()}). Submissions could reach the network "
                                "or the worker's secrets. Fix the platform, or run with --allow-unsafe-sandbox "
                                "(HARNESS_ALLOW_UNSAFE_SANDBOX=1) to accept that.")
        log.warning("UNSAFE SANDBOX (allowed explicitly): it lacks %s", why)
    if p.cgroup is not None:
        swept = sweep_stale_cgroups()
        if swept:
            log.warning("removed %d cgroups left by dead workers", len(swept))
    else:
        log.warning("no usable cgroup: children have rlimits but no host-memory limit%s",
                    "" if p.user_switch else " and (as root) no process-count limit")
    return p


# ---- one child's jail ------------------------------------------------------------------------------------


def _uid_lock_dir() -> Path:
    d = Path(tempfile.gettempdir()) / f"kernelharness-uids-{os.geteuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    st = d.stat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SandboxError(f"{d} is not private to this user")
    return d


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    if int(line.split()[1]) == uid:
                        pids.append(int(status.parent.name))
                    break
        except (OSError, ValueError):
            continue
    return pids


def kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid`: kill(-1) from a helper running as that uid reaches them all,
    including those that left the process group; repeated until none is left (forks race with it)."""
    for _ in range(20):
        if not _pids_of_uid(uid):
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([_KILL, "-9", "-1"], user=uid, group=uid, extra_groups=[], env={}, timeout=10,
                           check=False, capture_output=True)
        time.sleep(0.05)
    log.error("processes of sandbox uid %d survive SIGKILL: %s", uid, _pids_of_uid(uid))


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    """Hand a tree to a sandbox uid, without following links: a previous child may have planted a
    symlink or a hard link to a file outside the tree there, and root must not chown that file."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            entry = os.path.join(dirpath, name)
            st = os.lstat(entry)
            if not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode) and st.st_nlink > 1:
                log.warning("not handing %s to the sandbox: it has %d hard links", entry, st.st_nlink)
                continue
            os.chown(entry, uid, gid, follow_symlinks=False)


def tree_bytes(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        for dirpath, _dirnames, filenames in os.walk(p):
            for name in filenames:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _traversable_by_others(path: Path) -> Path | None:
    """The topmost ancestor of `path` that others cannot traverse, or None."""
    parts = path.resolve().parts
    for i in range(2, len(parts) + 1):
        d = Path(*parts[:i])
        try:
            if not d.stat().st_mode & 0o001:
                return d
        except OSError:
            return None
    return None


def runtime_paths() -> list[Path]:
    """What a child needs to start: the interpreter, its prefix and venv, the harness, PYTHONPATH."""
    paths = {Path(sys.base_prefix), Path(sys.prefix), Path(sys.exec_prefix), Path(sys.executable).resolve().parent,
             _HARNESS_ROOT}
    paths.update(Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    return sorted({p.resolve() for p in paths if p.exists()})


def _minimal(paths: list[Path]) -> list[Path]:
    """Drop every path that lies under another one."""
    out: list[Path] = []
    for p in sorted(set(paths), key=lambda q: len(q.parts)):
        if not any(p == q or q in p.parents for q in out):
            out.append(p)
    return out


@dataclass
class Jail:
    settings: Settings
    untrusted: bool  # runs submitted code: sandbox uid, hidden data dir
    writable: list[Path] = field(default_factory=list)  # made the child's own
    readable: list[Path] = field(default_factory=list)  # made readable by the child's group
    visible: list[Path] = field(default_factory=list)  # left as they are, but not hidden (the problem's file)
    uid: int | None = None
    cgroups: list[Path] = field(default_factory=list)
    _lock: int | None = None

    @property
    def disk_limit_bytes(self) -> int | None:
        return self.settings.child_disk_mb * 2**20 if self.settings.child_disk_mb else None

    def setup(self) -> None:
        p = platform()
        s = self.settings
        try:
            if self.untrusted and p.user_switch and s.sandbox_user != "off":
                self._allocate_uid()
                assert self.uid is not None
                kill_uid(self.uid)  # leftovers of a worker that died hard
                for path in self.writable:
                    _chown_tree(path, self.uid, self.uid)
                for path in self.readable:
                    _chown_tree(path, 0, self.uid)
                    for dirpath, _d, files in os.walk(path):
                        os.chmod(dirpath, 0o750)  # noqa: S103 - group: this child's own gid
                        for f in files:
                            os.chmod(os.path.join(dirpath, f), 0o640)
                for path in self.visible:
                    if not path.stat().st_mode & 0o004:
                        raise SandboxError(f"{path} is not readable by the sandbox user: make it world-readable "
                                           "(chmod o+r), or run without a sandbox user")
            if p.cgroup is not None:
                self._make_cgroups(p.cgroup)
        except SandboxError:
            self.cleanup()
            raise
        except OSError as e:
            self.cleanup()
            raise SandboxError(f"setting up the sandbox failed: {e}") from e

    def _allocate_uid(self) -> None:
        s = self.settings
        lock_dir = _uid_lock_dir()
        for uid in range(s.sandbox_uid_base, s.sandbox_uid_base + s.sandbox_uid_count):
            fd = os.open(lock_dir / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    continue
                raise
            self.uid, self._lock = uid, fd
            return
        raise SandboxError(f"all {s.sandbox_uid_count} sandbox uids from {s.sandbox_uid_base} are in use")

    def _make_cgroups(self, version: str) -> None:
        s = self.settings
        name = f"kh-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        dirs = _own_cgroup_dirs()
        mem = str(s.child_memory_mb * 2**20) if s.child_memory_mb else None
        if version == "v2":
            cg = dirs["unified"] / name
            cg.mkdir()
            self.cgroups.append(cg)
            (cg / "pids.max").write_text(str(s.child_max_pids))
            if mem:
                (cg / "memory.max").write_text(mem)
                with contextlib.suppress(OSError):
                    (cg / "memory.swap.max").write_text("0")
        else:
            for c in ("pids", "memory"):
                cg = dirs[c] / name
                cg.mkdir()
                self.cgroups.append(cg)
            (dirs["pids"] / name / "pids.max").write_text(str(s.child_max_pids))
            if mem:
                (dirs["memory"] / name / "memory.limit_in_bytes").write_text(mem)

    def config(self, cwd: Path) -> dict:
        s = self.settings
        p = platform()
        cfg: dict = {"cwd": str(cwd), "cgroup_procs": [str(c / "cgroup.procs") for c in self.cgroups],
                     "parent": os.getpid()}
        if s.sandbox_network != "off" and p.netns:
            cfg["netns"] = True
            cfg["userns"] = not p.root
        limits = {"core": 0, "nofile": s.child_open_files}
        if s.child_cpu_s:
            limits["cpu"] = s.child_cpu_s
        if s.child_file_mb:
            limits["fsize"] = s.child_file_mb * 2**20
        if self.uid is not None or (not p.root and p.cgroup is None):  # root ignores it; a user's count is shared
            limits["nproc"] = s.child_max_pids
        cfg["rlimits"] = limits
        if self.uid is not None:
            cfg["user"] = {"uid": self.uid, "gid": self.uid}
            keep = runtime_paths() + [q.resolve() for q in self.writable + self.readable + self.visible]
            hidden = {s.data_dir.resolve(), Path(s.scratch_dir or tempfile.gettempdir()).resolve()}
            hidden.update(a for a in (_traversable_by_others(q) for q in keep) if a is not None)
            hidden_list = _minimal(list(hidden))
            cfg["hide"] = [str(h) for h in hidden_list]
            cfg["keep"] = [str(q) for q in _minimal(keep) if any(h in q.parents for h in hidden_list)]
        return cfg

    def launcher(self, status_fd: int, cwd: Path) -> list[str]:
        return [sys.executable, "-s", "-m", "harness.sandbox.confine", str(status_fd),
                json.dumps(self.config(cwd)), "--"]

    def cleanup(self) -> None:
        """Kill whatever the child left, remove its cgroups, give its uid back. Idempotent."""
        for cg in self.cgroups:
            _empty_cgroup(cg)
        if self.uid is not None:
            kill_uid(self.uid)
        for cg in self.cgroups:
            _remove_cgroup(cg)
        self.cgroups = []
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        self.uid = None


def _empty_cgroup(cg: Path) -> None:
    for _ in range(50):
        try:
            pids = [int(x) for x in (cg / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            return
        if (cg / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (cg / "cgroup.kill").write_text("1")
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def _remove_cgroup(cg: Path) -> None:
    for _ in range(50):
        try:
            cg.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)  # the last killed processes are still being reaped
    log.warning("cgroup %s could not be removed", cg)


def sweep_stale_cgroups() -> list[Path]:
    """Remove the cgroups of children whose worker died (kh-<pid>-*, that pid gone), killing what is left."""
    swept = []
    for d in _own_cgroup_dirs().values():
        for cg in d.glob("kh-*-*"):
            try:
                pid = int(cg.name.split("-")[1])
            except (IndexError, ValueError):
                continue
            if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
                _empty_cgroup(cg)
                _remove_cgroup(cg)
                swept.append(cg)
    return swept


def jail(settings: Settings, *, untrusted: bool, writable: list[Path] | None = None,
         readable: list[Path] | None = None, visible: list[Path] | None = None) -> Jail:
    return Jail(settings, untrusted, writable=list(writable or []), readable=list(readable or []),
                visible=list(visible or []))
