"""The launcher a sandboxed child starts as: `python -s -m harness.sandbox.confine CONFIG -- CMD...`.

It runs in the fresh, single-threaded process the parent spawned (no preexec_fn in a threaded
worker), applies the confinement the parent planned, then exec()s the real child in place, so the
pid, the process group and the open channel fd stay the same. In order:

  1. join the child's cgroups (memory, pids), so every descendant is counted and can be killed;
  2. new namespaces: network (only a loopback that is down: no connection anywhere), mount (as root:
     tmpfs over the data dir, the scratch root and any dir the sandbox user could not traverse,
     with only the paths the child needs bound back);
  3. resource limits (CPU time, open files, file size, processes, no core dumps);
  4. drop to the sandbox uid/gid with no supplementary groups and no_new_privs, and die with the parent;
  5. exec.

Any failure before the exec is written on the status fd (close-on-exec, so an empty read there
means the exec happened) and the launcher exits 125: the parent reports an infrastructure error,
never a verdict about the submission. Standard library only: this runs before anything else.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_LIMITS = {"cpu": resource.RLIMIT_CPU, "nofile": resource.RLIMIT_NOFILE, "fsize": resource.RLIMIT_FSIZE,
           "nproc": resource.RLIMIT_NPROC, "core": resource.RLIMIT_CORE}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                       ctypes.c_ulong(flags), data and data.encode()), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _hide(hidden: list[str], keep: list[str]) -> None:
    """tmpfs over each hidden dir, then the kept paths under it bound back at the same place."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Open what is kept before covering it: /proc/self/fd/N still names it afterwards.
    fds = {p: os.open(p, os.O_PATH) for p in keep}
    for h in hidden:
        mode = "1777" if os.stat(h).st_mode & 0o1000 else "0755"
        _mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size=64m")
    for p, fd in fds.items():
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(p, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "a").close()  # a mount point on the tmpfs
        _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
        os.close(fd)


def apply(cfg: dict) -> None:
    for procs in cfg.get("cgroup_procs", []):
        _write(procs, str(os.getpid()))
    flags = 0
    if cfg.get("netns"):
        flags |= CLONE_NEWNET
    if cfg.get("hide"):
        flags |= CLONE_NEWNS
    if cfg.get("userns"):  # not root: a user namespace is what allows the network namespace
        flags |= CLONE_NEWUSER
    if flags:
        uid, gid = os.getuid(), os.getgid()
        _check(_libc.unshare(flags), "unshare")
        if cfg.get("userns"):
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
    if cfg.get("hide"):
        _hide(cfg["hide"], cfg.get("keep", []))
    for name, value in cfg.get("rlimits", {}).items():
        # CPU: SIGXCPU at the soft limit (a signal the verdict names), SIGKILL a little later.
        resource.setrlimit(_LIMITS[name], (value, value + 5 if name == "cpu" else value))
    user = cfg.get("user")
    if user is not None:
        os.setgroups([])
        os.setgid(user["gid"])
        os.setuid(user["uid"])
        if os.getuid() != user["uid"] or os.geteuid() != user["uid"]:
            raise OSError("the uid did not change")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    # Killed with the worker (a SIGKILLed worker leaves no evaluation running). Set after the uid
    # change, which clears it; kept across the exec.
    _check(_libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "prctl(PDEATHSIG)")
    if cfg.get("parent") and os.getppid() != cfg["parent"]:
        raise OSError("the parent is already gone")
    if cfg.get("cwd"):
        os.chdir(cfg["cwd"])


def main(argv: list[str]) -> None:
    status_fd = int(argv[0])
    os.set_inheritable(status_fd, False)  # closed by a successful exec: the parent reads EOF
    try:
        cfg = json.loads(argv[1])
        cmd = argv[argv.index("--") + 1:]
        apply(cfg)
        os.execv(cmd[0], cmd)  # noqa: S606 - the child's argv, built by the parent
    except BaseException as e:  # every failure goes to the parent
        try:
            os.write(status_fd, f"{type(e).__name__}: {e}".encode()[:4000])
        finally:
            os._exit(125)


if __name__ == "__main__":
    main(sys.argv[1:])
