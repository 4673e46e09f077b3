"""The launcher a sandboxed child starts as: `python -s -m harness.sandbox.confine CONFIG -- CMD...`.

It runs in the fresh, single-threaded process the parent spawned (no preexec_fn in a threaded
worker), applies the confinement the parent planned, then exec()s the real child. In order:

  1. join the child's cgroups (memory, pids), so every descendant is counted and can be killed;
  2. new namespaces: network (only a loopback that is down: no connection anywhere), and as root
     mount (tmpfs over the data dir, the scratch root, any dir the sandbox user could not traverse
     and the host's shared writable dirs: /tmp, /var/tmp, /dev/shm, ..., with only the paths the
     child needs bound back), IPC (SysV objects and POSIX queues of its own) and PID;
  3. resource limits (CPU time, open files, file size, processes, no core dumps);
  4. with a PID namespace, two forks (see `_init`): this process stays in the parent's namespace and
     waits, the first fork is the namespace's init, the second becomes the child;
  5. drop to the sandbox uid/gid with no supplementary groups and no_new_privs, and die with the parent;
  6. exec.

Without a PID namespace the exec happens in place (same pid, process group and channel fd). With
one the parent's pid is this process, which ends as the child ended (same exit code or signal), and
the child keeps the process group, so the parent's group kill still reaches it. When the init ends,
the kernel kills whatever is left in the namespace: nothing the child started outlives it.

Any failure before the exec is written on the status fd (close-on-exec, so an empty read there
means the exec happened) and the launcher exits 125: the parent reports an infrastructure error,
never a verdict about the submission. Standard library only: this runs before anything else.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
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


def prepare(cfg: dict) -> None:
    """What is done as root and shared by every process of the child: cgroups, namespaces, mounts, rlimits."""
    for procs in cfg.get("cgroup_procs", []):
        _write(procs, str(os.getpid()))
    flags = 0
    if cfg.get("netns"):
        flags |= CLONE_NEWNET
    if cfg.get("hide"):
        flags |= CLONE_NEWNS
    if cfg.get("ipcns"):
        flags |= CLONE_NEWIPC
    if cfg.get("pidns"):  # only this process's next child enters it
        flags |= CLONE_NEWPID
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


def _die_with_parent(expected: int | None) -> None:
    # Cleared by a uid change, kept across exec: set last. `expected`: the parent must still be that one.
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if expected is not None and os.getppid() != expected:
        raise OSError("the parent is already gone")


def _keep_only(fds: set[int]) -> None:
    """Close every fd from 3 up but `fds`, and read stdin from /dev/null: the channel, the status pipe and
    stdin stay the child's alone, so the parent sees their ends when the child's end comes."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    low = 3
    for fd in sorted(fds):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _mirror(status: int) -> None:
    """End this process the way the child ended: the parent reads the child's exit code or signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:  # the one that has no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not end a process by default
    os._exit(os.waitstatus_to_exitcode(status))


def _init() -> None:
    """Fork into the new PID namespace; return only in the process that will exec the child.

    The child must not be the namespace's pid 1: the kernel drops signals that pid 1 has no handler for,
    even SIGXCPU from its CPU limit and SIGTERM from the parent. So pid 1 is a fork of this launcher that
    mounts the namespace's /proc, starts the child as pid 2, reaps orphans and reports how pid 2 ended.
    This process stays in the parent's namespace as the pid the parent waits for; it ignores the parent's
    SIGTERM (the child gets it too, through the process group) so that it can report how the child ended,
    and a SIGKILL of it takes the init with it (PDEATHSIG), and so the whole namespace."""
    report_r, report_w = os.pipe()
    init = os.fork()
    if init:  # the launcher, in the parent's namespace
        signal.signal(signal.SIGTERM, lambda *_: None)
        _keep_only({report_r})
        report = b""
        while chunk := os.read(report_r, 64):
            report += chunk
        _, status = os.waitpid(init, 0)
        _mirror(int(report) if report else status)
    os.close(report_r)
    _die_with_parent(None)  # its parent is outside the namespace: getppid() is 0 here
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    child = os.fork()
    if child == 0:
        os.close(report_w)
        return
    _keep_only({report_w})  # the status fd too: the child's copy tells the parent about its exec
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            os.write(report_w, str(status).encode())
            os._exit(0)  # the kernel kills the rest of the namespace


def enter(cfg: dict, parent: int | None) -> None:
    """The last steps, in the process that execs the child: its uid, no new privileges, its parent, its cwd."""
    user = cfg.get("user")
    if user is not None:
        os.setgroups([])
        os.setgid(user["gid"])
        os.setuid(user["uid"])
        if os.getuid() != user["uid"] or os.geteuid() != user["uid"]:
            raise OSError("the uid did not change")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    # Killed with its parent: a SIGKILLed worker leaves no evaluation running.
    _die_with_parent(parent)
    if cfg.get("cwd"):
        os.chdir(cfg["cwd"])


def apply(cfg: dict) -> None:
    prepare(cfg)
    parent = cfg.get("parent")
    if cfg.get("pidns"):
        _die_with_parent(parent)
        _init()
        parent = 1  # the namespace's init
    enter(cfg, parent)


def main(argv: list[str]) -> None:
    status_fd = int(argv[0])
    os.set_inheritable(status_fd, False)  # closed by a successful exec: the parent reads EOF
    try:
        cfg = json.loads(argv[1])
        cmd = argv[argv.index("--") + 1:]
        apply(cfg)
        os.execv(cmd[0], cmd)  # noqa: S606 - the child's argv, built by the parent
    except BaseException as e:  # every failure goes to the parent
        why = f"{type(e).__name__}: {e}".encode()[:4000]
        try:
            os.write(status_fd, why)
        except OSError:  # the init and the waiting launcher have closed it: the child's log says it then
            os.write(2, b"[harness] the sandbox launcher failed: " + why + b"\n")
        finally:
            os._exit(125)


if __name__ == "__main__":
    main(sys.argv[1:])
