"""What a sandbox uid may leave on the host outside its own dirs, and its removal after each child.

Sandbox uids are reused by later evaluations, so anything one leaves behind is handed to the next
submission that gets that uid. A confined child writes the host's shared writable dirs only through
a tmpfs of its own and makes SysV objects only in an IPC namespace of its own (both end with it); the
sweep, run whenever a uid is taken and given back, removes what got past them anyway, or what a
platform without those namespaces let through: entries the uid owns in the shared dirs (and in any
world-writable dir under them), and its SysV shared-memory segments, semaphore sets and message queues.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import stat
from pathlib import Path

log = logging.getLogger("harness.sandbox")

# The dirs every user may write on a Linux host (FHS), each given to a child as a tmpfs of its own.
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")  # noqa: S108 - what is swept, not used
_IPC_RMID = 0
_SYSV = ("shm", "sem", "msg")


def shared_dirs() -> list[Path]:
    """The shared writable dirs this host has (resolved: /var/lock is a link to /run/lock)."""
    found = {Path(d).resolve() for d in SHARED_DIRS if os.path.isdir(d)}
    return sorted(found)


def _remove(path: str, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # never follows links out of the tree
    else:
        os.unlink(path)


def _sweep_dir(top: str, uid: int, removed: list[str]) -> None:
    """Remove what `uid` owns in `top`; go down only into world-writable dirs, the only ones (besides its
    own, removed whole) where it could have made something."""
    try:
        entries = list(os.scandir(top))
    except OSError:
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            if st.st_uid == uid:
                _remove(entry.path, st)
                removed.append(entry.path)
            elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
                _sweep_dir(entry.path, uid, removed)
        except FileNotFoundError:
            continue  # gone already: another sweep (a scratch dir whose owner died, another uid's) took it
        except OSError as e:
            log.error("could not remove %s of sandbox uid %d: %s", entry.path, uid, e)


def _sysv_of(uid: int) -> list[tuple[str, int]]:
    """(kind, id) of the SysV objects that `uid` owns or created, in this process's IPC namespace."""
    found = []
    for kind in _SYSV:
        try:
            lines = Path("/proc/sysvipc", kind).read_text().splitlines()
        except OSError:
            continue
        names = lines[0].split() if lines else []
        for line in lines[1:]:
            row = dict(zip(names, line.split(), strict=False))
            if uid in (int(row["uid"]), int(row["cuid"])):
                found.append((kind, int(row[names[1]])))  # shmid, semid or msqid
    return found


def _sysv_remove(kind: str, ident: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if kind == "shm":
        ret = libc.shmctl(ident, _IPC_RMID, None)
    elif kind == "sem":
        ret = libc.semctl(ident, 0, _IPC_RMID)
    else:
        ret = libc.msgctl(ident, _IPC_RMID, None)
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"removing SysV {kind} {ident}: {os.strerror(err)}")


def sweep_uid(uid: int) -> list[str]:
    """Remove what `uid` left in the shared dirs and in SysV IPC; returns what was removed. Call it with no
    process of `uid` alive (after the kill), or it could race with one making more."""
    removed: list[str] = []
    for d in shared_dirs():
        _sweep_dir(str(d), uid, removed)
    for kind, ident in _sysv_of(uid):
        try:
            _sysv_remove(kind, ident)
            removed.append(f"SysV {kind} {ident}")
        except OSError as e:
            log.error("could not remove the SysV %s %d of sandbox uid %d: %s", kind, ident, uid, e)
    if removed:
        log.warning("removed what sandbox uid %d left outside its namespaces: %s", uid, ", ".join(removed[:20]))
    return removed
