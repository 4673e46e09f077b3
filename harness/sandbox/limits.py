"""What confines a child, planned in the parent: uid, namespaces, cgroups, rlimits, disk use.

`Jail` is one child's confinement. The parent builds it, `setup()` allocates a sandbox uid (a lock
file per uid, so concurrent evaluations on one host, in any worker process, never share one), makes
the child's dirs its own, creates its cgroups; `launcher()` gives the argv prefix that applies the
rest inside the child (see `confine.py`); `cleanup()` kills everything the child left (by cgroup
and by uid: a process that called setsid() is not in the process group but is still found) and
gives the uid back.

What the platform allows is probed once (`capabilities.platform()`); cgroups live in `cgroups.py`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.config import Settings
from harness.sandbox import capabilities, cgroups, sweep
from harness.sandbox.capabilities import SandboxError

log = logging.getLogger("harness.sandbox")

_HARNESS_ROOT = Path(__file__).resolve().parents[2]
_KILL = shutil.which("kill", path="/usr/bin:/bin") or "/bin/kill"  # not the interpreter: the uid may not reach it


# ---- one child's jail ------------------------------------------------------------------------------------


def _uid_lock_dir() -> Path:
    d = Path(tempfile.gettempdir()) / f"kernelharness-uids-{os.geteuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    st = d.stat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SandboxError(f"{d} is not private to this user")
    return d


def pids_of_uid(uid: int) -> list[int]:
    """The live processes of `uid`. Zombies are left out: they are dead already, and one whose parent was
    killed too waits for init to reap it, which a busy host may do late."""
    pids = []
    # os.listdir, not Path.glob: a process that ends between the listing and the look at its status makes
    # glob raise ProcessLookupError from inside its own iteration, where no handler here could catch it.
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path("/proc", name, "status").read_text()
            fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) == uid and fields.get("State", "").split()[:1] not in (["Z"], ["X"]):
                pids.append(int(name))
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return pids


def kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid`: kill(-1) from a helper running as that uid reaches them all,
    including those that left the process group; repeated until none is left (forks race with it), for
    up to 10 s (a fork bomb on a loaded host)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not pids_of_uid(uid):
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([_KILL, "-9", "-1"], user=uid, group=uid, extra_groups=[], env={}, timeout=10,
                           check=False, capture_output=True)
        time.sleep(0.05)
    log.error("processes of sandbox uid %d survive SIGKILL: %s", uid, pids_of_uid(uid))


def _chown_tree(path: Path, uid: int, gid: int, modes: tuple[int, int] | None = None) -> None:
    """Hand a tree to a sandbox uid, without following links: a previous child may have planted a
    symlink or a hard link to a file outside the tree there, and root must not chown that file. With
    `modes` (directories', files'), each entry is given its mode in the same pass: a file written into the
    tree meanwhile (the trusted side fills the exchange dir while the candidate's process starts) is
    either handed over whole or left as its writer made it, never chmod-ed without its new group."""
    os.chown(path, uid, gid, follow_symlinks=False)
    if modes is not None:
        os.chmod(path, modes[0])
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            entry = os.path.join(dirpath, name)
            st = os.lstat(entry)
            if stat.S_ISLNK(st.st_mode):
                os.chown(entry, uid, gid, follow_symlinks=False)
                continue
            if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
                log.warning("not handing %s to the sandbox: it has %d hard links", entry, st.st_nlink)
                continue
            os.chown(entry, uid, gid, follow_symlinks=False)
            if modes is not None:
                os.chmod(entry, modes[0] if stat.S_ISDIR(st.st_mode) else modes[1])


class UncountedDir(Exception):
    """A directory under a child's writable dirs that the parent cannot list: what lies there is out of its count."""


def tree_usage(paths: list[Path], most_entries: int | None = None) -> tuple[int, int]:
    """What the files and dirs under `paths` hold, and how many they are. Each is counted at its largest reading: its
    length, the blocks the filesystem reports (a compressing one, ZFS's, reports a few KiB for 8 MiB of one byte, and
    its dirty data only at the next sync), and at least one 4 KiB block. An empty file takes an inode all the same,
    which bytes do not bound (two million of them fit in 8 GiB at 4 KiB each): the count of entries is the second
    figure, and the walk stops once it passes `most_entries`. A dir that vanishes while it is walked counts nothing;
    one that cannot be read raises `UncountedDir`: the count must not fail open."""
    def unreadable(e: OSError) -> None:
        if not isinstance(e, FileNotFoundError):
            raise UncountedDir(f"{e.filename}: {e.strerror}") from e

    total = entries = 0
    for p in paths:
        for dirpath, dirnames, filenames in os.walk(p, onerror=unreadable):
            for name in dirnames + filenames:
                with contextlib.suppress(FileNotFoundError):
                    st = os.lstat(os.path.join(dirpath, name))
                    total += max(st.st_size, st.st_blocks * 512, 4096)
                    entries += 1
                if most_entries is not None and entries > most_entries:
                    return total, entries
    return total, entries


def tree_bytes(paths: list[Path]) -> int:
    """The bytes of `tree_usage`."""
    return tree_usage(paths)[0]


def _traversable_by_others(path: Path) -> Path | None:
    """The topmost directory on the way to `path` (itself included, if a directory) that others cannot
    traverse, or None."""
    path = path.resolve()
    dirs = path.parts if path.is_dir() else path.parent.parts
    for i in range(2, len(dirs) + 1):
        d = Path(*dirs[:i])
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
    pausable: bool = False  # gets a freezer of its own too (the trusted side, paused as the candidate is)
    writable: list[Path] = field(default_factory=list)  # made the child's own
    readable: list[Path] = field(default_factory=list)  # made readable by the child's group
    visible: list[Path] = field(default_factory=list)  # left as they are, but not hidden (the problem's file)
    uid: int | None = None
    cgroups: list[Path] = field(default_factory=list)
    freezer: Path | None = None  # the cgroup whose freezer pauses the child (pause.py), one of `cgroups`
    cpu_clock: Path | None = None  # the file that counts the child's CPU time (cpu.stat, cpuacct.usage)
    cpuset: Path | None = None  # the cgroup that holds an untrusted child to the cores it is given (`keep_to`)
    _lock: int | None = None

    @property
    def disk_limit_bytes(self) -> int | None:
        return self.settings.child_disk_mb * 2**20 if self.settings.child_disk_mb else None

    @property
    def disk_limit_files(self) -> int | None:
        return self.settings.child_disk_files or None

    @property
    def log_limit_bytes(self) -> int | None:
        """A submission's log is written to the harness's disk, outside its dirs and its share of them: bounded on
        its own (the harness's own processes are not)."""
        return self.settings.child_log_mb * 2**20 if self.untrusted and self.settings.child_log_mb else None

    def processes(self) -> list[int]:
        """Every process the child runs now, one that left its process group too: its cgroups' (one file each),
        else its sandbox uid's (`pids_of_uid`: the Uid line of each status file; a /proc entry's owner would not
        do, a process that makes itself undumpable turns its entry root's); none without either."""
        if self.cgroups:
            return sorted({pid for cg in self.cgroups for pid in cgroups.procs(cg)})
        return pids_of_uid(self.uid) if self.uid is not None else []

    def keep_to(self, cores: list[int] | None) -> bool:
        """Hold every process of the child to `cores` (None: every core again), where its cgroups can (a cpuset):
        whatever it asks of the scheduler, none of it runs elsewhere. False where nothing holds it."""
        return self.cpuset is not None and cgroups.keep_to(self.cpuset, cores)

    def setup(self) -> None:
        p = capabilities.platform()
        s = self.settings
        try:
            if self.untrusted and p.user_switch and s.sandbox_user != "off":
                self._allocate_uid()
                assert self.uid is not None
                kill_uid(self.uid)  # leftovers of a worker that died hard
                sweep.sweep_uid(self.uid)
                for path in self.writable:
                    _chown_tree(path, self.uid, self.uid)
                for path in self.readable:  # group: this child's own gid
                    _chown_tree(path, 0, self.uid, modes=(0o750, 0o640))
                for path in self.visible:
                    if not path.stat().st_mode & 0o004:
                        raise SandboxError(f"{path} is not readable by the sandbox user: make it world-readable "
                                           "(chmod o+r), or run without a sandbox user")
            if p.cgroup is not None:
                self.cgroups = cgroups.create(self.settings, p.cgroup)
            if (self.untrusted or self.pausable) and p.freezer is not None:
                self.freezer, self.cpu_clock, made = cgroups.create_freezer(p.freezer, self.cgroups)
                self.cgroups += made
            if self.untrusted and p.cores is not None:
                self.cpuset, made = cgroups.create_cores(p.cores, self.cgroups)
                self.cgroups += made
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

    def config(self, cwd: Path) -> dict:
        s = self.settings
        p = capabilities.platform()
        cfg: dict = {"cwd": str(cwd), "cgroup_procs": [str(c / "cgroup.procs") for c in self.cgroups],
                     "parent": os.getpid()}
        if s.sandbox_network != "off" and p.netns:
            cfg["netns"] = True
            cfg["userns"] = not p.root
        limits = {"core": 0, "nofile": s.child_open_files}
        if s.child_cpu_s:
            limits["cpu"] = s.child_cpu_s
        if s.child_file_mb and self.untrusted:  # the trusted side writes the trials' inputs, whatever their size
            limits["fsize"] = s.child_file_mb * 2**20
        if self.uid is not None or (not p.root and p.cgroup is None):  # root ignores it; a user's count is shared
            limits["nproc"] = s.child_max_pids
        cfg["rlimits"] = limits
        if self.uid is not None:
            cfg["user"] = {"uid": self.uid, "gid": self.uid}
            keep = runtime_paths() + [q.resolve() for q in self.writable + self.readable + self.visible]
            # The shared writable dirs too: each child gets them empty and private, gone when it ends.
            hidden = {s.data_dir.resolve(), Path(s.scratch_dir or tempfile.gettempdir()).resolve(),
                      *sweep.shared_dirs()}
            hidden.update(a for a in (_traversable_by_others(q) for q in keep) if a is not None)
            hidden_list = _minimal(list(hidden))
            cfg["hide"] = [str(h) for h in hidden_list]
            cfg["keep"] = [str(q) for q in _minimal(keep) if any(h in q.parents for h in hidden_list)]
            cfg["ipcns"] = cfg["pidns"] = p.pidns
        return cfg

    def launcher(self, status_fd: int, cwd: Path) -> list[str]:
        return [sys.executable, "-s", "-m", "harness.sandbox.confine", str(status_fd),
                json.dumps(self.config(cwd)), "--"]

    def cleanup(self) -> None:
        """Kill whatever the child left, remove its cgroups, give its uid back. Idempotent."""
        for cg in self.cgroups:
            cgroups.empty(cg)
        if self.uid is not None:
            kill_uid(self.uid)
            sweep.sweep_uid(self.uid)
        for cg in self.cgroups:
            cgroups.remove(cg)
        self.cgroups = []
        self.freezer = self.cpu_clock = self.cpuset = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        self.uid = None


def jail(settings: Settings, *, untrusted: bool, writable: list[Path] | None = None,
         readable: list[Path] | None = None, visible: list[Path] | None = None, pausable: bool = False) -> Jail:
    return Jail(settings, untrusted, pausable, writable=list(writable or []), readable=list(readable or []),
                visible=list(visible or []))
