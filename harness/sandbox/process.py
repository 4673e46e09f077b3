"""Parent side of one child process: spawn fresh, own its deadlines, kill its whole group, reap.

No torch here. The child runs `python -m <module>` in a new session (its own process group), in a
working dir the parent chose, with the environment the parent built; it reports JSON lines on a
pipe whose write end is the only extra fd it inherits. With a `Jail` it starts through the
confining launcher (own uid, network and mount namespaces, cgroups, rlimits; see limits.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from harness.sandbox import pause
from harness.sandbox.limits import Jail, SandboxError, UncountedDir, tree_usage

_EOF = object()

# The longest line the parent reads from a child's channel: a longer one is the child's protocol violation.
MAX_MESSAGE_BYTES = 1 << 20


class Deadline(Exception):
    """The child said nothing conclusive before its deadline."""


class ChildExited(Exception):
    """The channel closed: the child is gone (or closed the pipe) before sending what was awaited."""


@dataclass
class Message:
    event: str
    fields: dict[str, Any]
    received_at: float  # the parent's monotonic clock


# Process names (as /proc/<pid>/stat's comm shows them, at most 15 characters) of what a load_inline build runs.
COMPILERS = frozenset({"ninja", "nvcc", "cicc", "ptxas", "fatbinary", "nvlink", "cudafe++", "gcc", "g++", "c++", "cc",
                       "cc1", "cc1plus", "as", "ld", "collect2", "clang", "clang++", "make", "cmake"})


def scrubbed_env(extra: dict[str, str], home: Path) -> dict[str, str]:
    """Only what a build and a CUDA run need; no tokens, database URLs or HARNESS_* settings."""
    keep = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES",
            "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CC", "CXX", "TZ")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    bindir = str(Path(sys.executable).parent)  # ninja from the venv
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    # The harness itself must be importable (uninstalled checkouts too), and so must what the
    # parent's own PYTHONPATH provides (e.g. wheels unpacked beside a preinstalled torch).
    pythonpath = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]),
                                             os.environ.get("PYTHONPATH", "")) if p)
    env.update(
        HOME=str(home), TMPDIR=str(home), PYTHONPATH=pythonpath, PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1", LANG=env.get("LANG", "C.UTF-8"),
        # A sandbox uid has no passwd entry; getpass.getuser() (torch.compile's cache, the profiler's
        # kernel trace) reads these first.
        USER="harness-sandbox", LOGNAME="harness-sandbox",
    )
    env.update(extra)
    return env


class ChildProcess:
    def __init__(self, module: str, args: list[str], *, cwd: Path, env: dict[str, str], log_path: Path,
                 kill_grace_s: float, jail: Jail | None = None, fd_socket: bool = False):
        self.kill_grace_s = kill_grace_s
        self.module = module
        self.log_path = log_path
        self.jail = jail
        self.limit_exceeded: str | None = None  # why the parent killed it for a resource limit
        # Its share of disk: the settings' own, plus what the harness asks it to keep (`allow_disk`).
        self.disk_limit = jail.disk_limit_bytes if jail is not None else None
        self.file_limit = jail.disk_limit_files if jail is not None else None  # files and dirs: inodes
        self.log_limit = jail.log_limit_bytes if jail is not None else None
        if jail is not None:
            jail.setup()  # SandboxError: the harness's failure
        read_fd, write_fd = os.pipe()
        status_r, status_w = os.pipe() if jail is not None else (-1, -1)
        # With `fd_socket`, a socket for file descriptors (SCM_RIGHTS) besides the channel: `--fd-socket N` in the
        # child, `self.fds` here (see `send_fds`, `receive_fds`).
        self.fds: socket.socket | None = None
        theirs: socket.socket | None = None
        if fd_socket:
            self.fds, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            args = [*args, "--fd-socket", str(theirs.fileno())]
        passed = (write_fd,) if jail is None else (write_fd, status_w)
        passed += (theirs.fileno(),) if theirs is not None else ()
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 - closed in reap()
        try:
            prefix = jail.launcher(status_w, cwd) if jail is not None else []
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-s", "-m", module, "--channel-fd", str(write_fd), *args],
                cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                pass_fds=passed, start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            os.close(read_fd)
            self._log.close()
            if self.fds is not None:
                self.fds.close()
            if jail is not None:
                os.close(status_r)
                jail.cleanup()
            raise
        finally:
            os.close(write_fd)
            if theirs is not None:
                theirs.close()
            if status_w >= 0:
                os.close(status_w)
        if jail is not None:
            # EOF once the launcher exec()s the child (the fd is close-on-exec there); text if it failed.
            with os.fdopen(status_r, "rb") as status:
                failure = status.read(4000).decode(errors="replace")
            if failure:
                self.proc.wait()
                os.close(read_fd)
                self._log.close()
                jail.cleanup()
                raise SandboxError(f"the sandbox launcher failed: {failure}")
        self.started_at = time.monotonic()
        self._messages: queue.Queue[Any] = queue.Queue()
        self.garbage_lines = 0
        self._reader = threading.Thread(target=self._read, args=(read_fd,), daemon=True)
        self._reader.start()
        self.killed_by_parent = False
        self.paused = False
        self._pause: pause.CgroupFreeze | pause.PtraceStop | None = None
        self._watch_stop = threading.Event()
        if self._watched():
            assert jail is not None
            threading.Thread(target=self._watch_disk, args=(jail.writable,), daemon=True, name="disk-watch").start()

    def pause(self) -> None:
        """Pause the child and every process its jail holds (one that left the group too) until `resume`, by a pause
        no signal of its own lifts (pause.py: its cgroup's freezer, else a ptrace-stop): between a candidate's turns
        in the timed rounds nothing of its runs beside the trusted side's windows, to launch work there or take the
        CPU. PauseFailed where it cannot be had (then it stays `paused`, so that `resume` lets go what was held)."""
        if self.paused or self.proc.poll() is not None:
            return
        self.paused = True
        if self._pause is None:
            self._pause = pause_for(self.jail, self.proc)
        self._pause.stop()

    def processes(self) -> list[int]:
        """Every process the child runs now, by PID as this process sees them: its jail's (by cgroup or sandbox uid,
        one that left the process group too), else its session's and its descendants; the child itself always."""
        if self.jail is not None and (self.jail.cgroups or self.jail.uid is not None):
            pids = self.jail.processes()
        else:
            pids = pause.session_processes(self.proc.pid)
        return sorted({self.proc.pid, *pids})

    @property
    def pause_method(self) -> str | None:
        """How `pause` holds this child ("cgroup_freeze", "cgroup_v1_freezer", "ptrace"); None before its first."""
        return self._pause.method if self._pause is not None else None

    def cpu_mark(self) -> pause.PausedMark | None:
        """The paused child's CPU clock now, and its threads' (None unless paused): `cpu_used_us` tells what it used
        since, `cpu_users` which threads."""
        if not self.paused or self._pause is None:
            return None
        try:
            clock = self._pause.clock.mark()
        except (OSError, ValueError, StopIteration):
            return None  # its cgroup went with it: it ended
        threads = pause.ProcCpu(self.processes).mark()
        assert isinstance(threads, dict)
        return pause.PausedMark(clock, threads)

    def cpu_used_us(self, mark: pause.PausedMark | None) -> int:
        """The CPU time (µs) the child's processes used since `mark`: none, while its pause holds."""
        if mark is None or self._pause is None:
            return 0
        try:
            return self._pause.clock.used_since(mark.clock)
        except (OSError, ValueError, StopIteration):
            return 0

    def cpu_users(self, mark: pause.PausedMark, used_us: int) -> str:
        """Which of its threads used the `used_us` its clock counted since `mark` (pause.users)."""
        return pause.users(mark.threads, self.processes(), used_us)

    def resume(self) -> None:
        """Undo `pause` (a no-op when not paused). Every command to the child resumes it first."""
        if not self.paused:
            return
        self.paused = False
        if self._pause is not None:
            self._pause.resume()

    def allow_disk(self, extra_bytes: int) -> None:
        """Raise the child's share of disk by what the harness itself asks it to write and keep (a problem's trial
        outputs at its own size can be gigabytes: the harness's demand is never the child's excess)."""
        if self.disk_limit:
            self.disk_limit += max(0, extra_bytes)

    disk_watch_interval_s = 0.5  # between the watcher's counts of the child's disk

    def _watched(self) -> bool:
        """Whether the child has a share of disk to keep to: of its log, or of its dirs."""
        return self.jail is not None and bool(self.log_limit or ((self.disk_limit or self.file_limit)
                                                                 and self.jail.writable))

    def _watch_disk(self, paths: list[Path]) -> None:
        """Disk has no rlimit: the parent measures the child's dirs and its log, and kills it past its share."""
        while not self._watch_stop.wait(self.disk_watch_interval_s) and self.proc.poll() is None:
            excess = self._disk_excess(paths)
            if excess:
                self.limit_exceeded = excess
                self.note(f"\n[harness] killed: {excess}\n")
                self.kill()
                return

    def count_disk_at_end(self) -> str | None:
        """Count its disk once more, the process ended (or stopped): a child can go over its share and be done
        before the watcher's next count. What it is over by, else None; the log says it as the watcher's kill
        does, since the verdict's evidence is that line."""
        if self._watched():
            assert self.jail is not None
            excess = self._disk_excess(self.jail.writable)
            if excess:
                self.note(f"\n[harness] counted at its end: {excess}\n")
            return excess
        return None

    def _disk_excess(self, paths: list[Path]) -> str | None:
        """What the child's dirs are over its share by, in bytes or in files and dirs (inodes), or its log over its
        own, else None."""
        logged = self.log_size()
        if self.log_limit and logged > self.log_limit:
            return f"log: the child wrote {logged // 2**20} MiB to its log, over its {self.log_limit // 2**20} MiB"
        if not paths or not (self.disk_limit or self.file_limit):
            return None
        try:
            used, entries = tree_usage(paths, most_entries=self.file_limit)
        except UncountedDir as e:  # it made a dir unreadable to the parent (one not root): count it as over
            return f"disk: the child hid a dir from the parent's count of its disk ({e})"
        if self.file_limit and entries > self.file_limit:
            return f"disk: the child made more than {self.file_limit} files and dirs, over its share of inodes"
        if self.disk_limit and used > self.disk_limit:
            return f"disk: the child wrote {used // 2**20} MiB, over its {self.disk_limit // 2**20} MiB"
        return None

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as chan:
            while True:
                line = chan.readline(MAX_MESSAGE_BYTES)
                # When the reply arrived: parsing it is the parent's own work, in no command's time (a fingerprint's
                # 2000 numbers took 0.5-1.4 ms to parse on a 2-core host).
                arrived = time.monotonic()
                if not line:
                    break
                try:
                    obj = json.loads(line)
                    event = obj.pop("event")
                    if not isinstance(event, str):
                        raise TypeError("event is not a string")
                except (ValueError, TypeError, KeyError, AttributeError):
                    self.garbage_lines += 1
                    if not line.endswith(b"\n"):  # an oversized line: drop its remainder
                        while line and not line.endswith(b"\n"):
                            line = chan.readline(MAX_MESSAGE_BYTES)
                    continue
                self._messages.put(Message(event, obj, arrived))
        self._messages.put(_EOF)

    def send(self, command: dict[str, Any] | str) -> None:
        assert self.proc.stdin is not None
        self.resume()
        text = command if isinstance(command, str) else json.dumps(command, default=str)
        try:
            self.proc.stdin.write(text.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise ChildExited(f"could not send to the child: {e}") from None

    def compiling(self) -> bool:
        """Whether a compiler (or the build tool driving one) runs in this child's session: its load_inline builds.
        Where /proc cannot be read, True (no idle deadline can be told from a hang there)."""
        try:
            entries = os.listdir("/proc")
        except OSError:
            return True
        for pid in entries:
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read().decode(errors="replace")
            except OSError:  # gone meanwhile, or not ours to read
                continue
            comm, _, rest = stat.partition("(")[2].rpartition(")")
            fields = rest.split()
            if len(fields) > 3 and fields[3] == str(self.proc.pid) and comm in COMPILERS:
                return True
        return False

    def next_message(self, deadline: float) -> Message:
        """The next message; Deadline when `deadline` (monotonic) passes, ChildExited on EOF."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Deadline()
        try:
            item = self._messages.get(timeout=remaining)
        except queue.Empty:
            raise Deadline() from None
        if item is _EOF:
            self._messages.put(_EOF)  # stay at EOF for later calls
            raise ChildExited("the child closed its channel")
        return item

    def drain(self) -> list[Message]:
        """The messages received and not yet taken (call once the child has exited and its reader is joined)."""
        left = []
        while True:
            try:
                item = self._messages.get_nowait()
            except queue.Empty:
                return left
            if item is not _EOF:
                left.append(item)

    def kill(self) -> None:
        """SIGTERM the whole process group, wait the grace period, then SIGKILL it."""
        self.resume()  # a stopped process would hold SIGTERM until continued
        if self.proc.poll() is None:
            self.killed_by_parent = True
        for sig, wait_s in ((signal.SIGTERM, self.kill_grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.proc.wait(timeout=wait_s)
                # The leader is gone; SIGKILL stragglers left in its group (ninja, nvcc, forks).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                break
            except subprocess.TimeoutExpired:
                continue

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def reap(self) -> None:
        """Always called: no zombies, no open fds, no process group left behind."""
        self.kill()
        self._watch_stop.set()
        if self._pause is not None:
            self._pause.close()
        if self.jail is not None:
            self.jail.cleanup()  # what left the process group: by cgroup and by uid
        if self.proc.stdin:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self._reader.join(timeout=5)
        self._log.close()
        if self.fds is not None:
            self.fds.close()

    def send_fds(self, fds: list[int]) -> None:
        """Pass descriptors to the child over its fd socket (one message; the child takes them when a command says
        so). Never blocks: a child that takes none fills its socket's buffer, and the send fails (ChildExited)."""
        assert self.fds is not None, "started without fd_socket"
        try:
            socket.send_fds(self.fds, [b"fds"], fds, socket.MSG_DONTWAIT)
        except OSError as e:
            raise ChildExited(f"descriptors could not be passed to the child ({e.strerror})") from None

    def receive_fds(self, count: int, timeout_s: float = 10.0) -> list[int]:
        """`count` descriptors the child sent over its fd socket (in one message), now the caller's to close."""
        assert self.fds is not None, "started without fd_socket"
        if count == 0:
            return []
        self.fds.settimeout(timeout_s)
        try:
            _, fds, _, _ = socket.recv_fds(self.fds, 16, count)
        except OSError as e:
            raise ChildExited(f"no descriptors came from the child ({e})") from None
        if len(fds) != count:
            for fd in fds:
                os.close(fd)
            raise ChildExited(f"{len(fds)} descriptors came from the child where {count} were due")
        return fds

    def note(self, text: str) -> None:
        """Write the harness's own line into the child's log, at the offset the child writes at (they share it)."""
        with contextlib.suppress(OSError, ValueError):
            self._log.write(text.encode(errors="replace"))
            self._log.flush()

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_tail(self, max_bytes: int = 8192) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                data = f.read()
        except OSError:
            return ""
        text = data.decode("utf-8", errors="replace")
        if size > max_bytes:
            text = "[...]" + text[text.find("\n") + 1 :]
        return text


def pause_for(jail: Jail | None, leader: subprocess.Popen) -> pause.CgroupFreeze | pause.PtraceStop:
    """The pause of a child: its jail's cgroup freezer where it has one, else a ptrace-stop of its processes (its
    jail's, by cgroup or uid; without either, the leader's session and descendants). Its CPU clock: the cgroup's
    count where one keeps it, else the threads' own in /proc."""
    if jail is not None and (jail.cgroups or jail.uid is not None):
        pids = jail.processes
    else:
        def pids() -> list[int]:
            return pause.session_processes(leader.pid)
    clock = pause.CgroupCpu(jail.cpu_clock) if jail is not None and jail.cpu_clock is not None else pause.ProcCpu(pids)
    if jail is not None and jail.freezer is not None:
        return pause.CgroupFreeze(jail.freezer, clock)
    return pause.PtraceStop(pids, leader, clock)


def describe_returncode(code: int | None) -> str | None:
    """The signal's name for a negative return code."""
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return None
