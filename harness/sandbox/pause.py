"""Pausing a candidate between its turns so that no signal of its own lifts the pause; and its CPU clock, by which the
parent checks that the pause held. No torch here.

SIGSTOP does not hold: a candidate's own POSIX timer (`timer_create` delivering SIGCONT) continues it a moment after
each stop, and its threads then run beside the trusted side's windows. Two pauses that no signal ends:
  cgroup_freeze      cgroup v2's `cgroup.freeze` (or v1's freezer controller, `cgroup_v1_freezer`): the kernel
                     parks every task of the cgroup, its descendants included, until the parent thaws it;
  ptrace             where the host gives no usable freezer: each thread of each of its processes is seized and
                     interrupted (a ptrace-stop, which SIGCONT does not end; only the tracer lets it go).
Either one is confirmed before `stop` returns (`frozen 1`, `FROZEN`, every thread's stop reported, then its CPU clock
standing still), or `PauseFailed` says why. Held by v1's freezer or ptrace a process uses no CPU at all, whatever it is
sent; v2 wakes a frozen task for each new signal, for the kernel to freeze it again, microseconds it is counted for:
only a candidate that signals itself uses any. The runner reads the clock around every reference window.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# An idle candidate (waiting for its next command) is held within milliseconds (the `pauses` phase of an evaluation);
# this is a stalled host's margin. Past it, one of its threads is somewhere it will not leave: no pause can be had.
STOP_LIMIT_S = 5.0

PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4206, 0x4207
_WALL = 0x40000000  # waitid: threads (clone children) as well as processes
_POLL_S = 0.0002
# A thread's last moment on the CPU is counted as it leaves it, just after the freezer (or the tracer) sees it held:
# the CPU clock is read again this long apart until it stands still, and only then is the pause complete.
_SETTLE_S = 0.001


class PauseFailed(Exception):
    """The candidate's processes could not be paused. `harness`: the host lacks what the pause needs (the harness's
    failure); otherwise the candidate made itself unpausable (its failure)."""

    def __init__(self, why: str, harness: bool = False):
        super().__init__(why)
        self.harness = harness


# ---- the CPU clock -------------------------------------------------------------------------------------------


CpuMark = int | dict[int, int]  # a cgroup's usage in µs, or each thread's CPU time in ns


@dataclass(frozen=True)
class PausedMark:
    """A paused child's CPU clock at a moment (`clock`, the pause's own), and each of its threads' CPU time then (ns
    by tid): where the clock moved, `users` names what ran."""

    clock: CpuMark
    threads: dict[int, int]


class CgroupCpu:
    """A cgroup's CPU time: v2's `cpu.stat` usage_usec (every v2 cgroup has it), v1's `cpuacct.usage` (ns). It counts
    processes that have exited since, and those that left the process group."""

    def __init__(self, path: Path):
        self.path = path

    def mark(self) -> CpuMark:
        text = self.path.read_text()
        if self.path.name == "cpuacct.usage":
            return int(text) // 1000
        return next(int(v) for k, v in (line.split() for line in text.splitlines()) if k == "usage_usec")

    def used_since(self, mark: CpuMark) -> int:
        now = self.mark()
        assert isinstance(mark, int) and isinstance(now, int)
        return max(0, now - mark)


class ProcCpu:
    """Without a cgroup: the CPU time of each thread of the processes `pids()` names, from /proc (schedstat's ns where
    the kernel keeps it, else stat's utime+stime in clock ticks). A thread that appeared since the mark counts whole:
    nothing of a paused candidate's can start one."""

    def __init__(self, pids: Callable[[], list[int]]):
        self.pids = pids

    def mark(self) -> CpuMark:
        out: dict[int, int] = {}
        for pid in self.pids():
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    ns = thread_cpu_ns(pid, int(tid))
                    if ns is not None:
                        out[int(tid)] = ns
        return out

    def used_since(self, mark: CpuMark) -> int:
        assert isinstance(mark, dict)
        now = self.mark()
        assert isinstance(now, dict)
        return sum(max(0, ns - mark.get(tid, 0)) for tid, ns in now.items()) // 1000


_TICK_NS = 10**9 // os.sysconf("SC_CLK_TCK")


def thread_cpu_ns(pid: int, tid: int) -> int | None:
    """One thread's CPU time so far (ns), or None where it is gone."""
    base = f"/proc/{pid}/task/{tid}"
    try:
        with open(f"{base}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"{base}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_NS
    except (OSError, ValueError, IndexError):
        return None


def users(before: dict[int, int], pids: list[int], used_us: int) -> str:
    """Which threads of `pids` used CPU since `before` (each thread's ns): "'name' (tid T) N µs", busiest first, and
    the part of `used_us` (the pause's clock) that no thread alive now accounts for (threads or processes that ended
    since, or CPU time their clock books later than /proc's)."""
    now = ProcCpu(lambda: pids).mark()
    assert isinstance(now, dict)
    ran = sorted(((ns - before.get(tid, 0)) // 1000, tid) for tid, ns in now.items() if ns > before.get(tid, 0))
    ran.reverse()
    parts = [f"{_comm(tid)!r} (tid {tid}{', new' if tid not in before else ''}) {us} µs" for us, tid in ran[:4]]
    if len(ran) > 4:
        parts.append(f"{len(ran) - 4} more threads {sum(us for us, _ in ran[4:])} µs")
    rest = used_us - sum(us for us, _ in ran)
    if rest > 0:
        parts.append(f"{rest} µs by no thread alive now")
    return ", ".join(parts) or "no thread alive now"


def _comm(tid: int) -> str:
    try:
        return Path(f"/proc/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def settle(clock: CgroupCpu | ProcCpu, deadline: float) -> None:
    """Wait until the held processes' CPU clock stands still (see _SETTLE_S). One that never does ran on: the pause did
    not hold."""
    try:
        before = clock.mark()
        while True:
            time.sleep(_SETTLE_S)
            now = clock.mark()
            if now == before:
                return
            if time.monotonic() > deadline:
                raise PauseFailed(f"its processes still used CPU {STOP_LIMIT_S:g} s after they were paused")
            before = now
    except (OSError, ValueError, StopIteration):
        return  # its cgroup went with it: it ended


# ---- the pauses ----------------------------------------------------------------------------------------------


class CgroupFreeze:
    """The cgroup freezer: `cgroup.freeze` (v2), or `freezer.state` (v1)."""

    def __init__(self, freezer: Path, clock: CgroupCpu | ProcCpu):
        self.freezer, self.clock = freezer, clock
        self.v2 = (freezer / "cgroup.freeze").exists()
        self.method = "cgroup_freeze" if self.v2 else "cgroup_v1_freezer"

    def stop(self) -> None:
        if not self._write("1" if self.v2 else "FROZEN"):
            return
        deadline = time.monotonic() + STOP_LIMIT_S
        while not self._frozen():
            if time.monotonic() > deadline:
                raise PauseFailed(f"its processes did not freeze within {STOP_LIMIT_S:g} s (a thread held in the "
                                  "kernel, out of the freezer's reach)")
            time.sleep(_POLL_S)
        settle(self.clock, deadline)

    def resume(self) -> None:
        self._write("0" if self.v2 else "THAWED")

    def close(self) -> None:
        self.resume()

    def _write(self, value: str) -> bool:
        """Write the freezer's state; False where the cgroup is gone (its processes ended and it was removed)."""
        name = "cgroup.freeze" if self.v2 else "freezer.state"
        try:
            (self.freezer / name).write_text(value)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise PauseFailed(f"the freezer of {self.freezer} cannot be written: {e}", harness=True) from e
        return True

    def _frozen(self) -> bool:
        try:
            if self.v2:
                return "frozen 1" in (self.freezer / "cgroup.events").read_text().splitlines()
            return (self.freezer / "freezer.state").read_text().strip() == "FROZEN"
        except FileNotFoundError:
            return True  # removed: nothing is left in it to run


class PtraceStop:
    """A ptrace-stop of every thread of the processes `pids()` names. ptrace requests come from the thread that seized
    the tracee, so one thread of this process's own makes them all; the leader (this process's child) has its wait
    statuses read under Popen's own lock, so that no `poll()` elsewhere takes its stop for an exit."""

    method = "ptrace"

    def __init__(self, pids: Callable[[], list[int]], leader: subprocess.Popen | None, clock: CgroupCpu | ProcCpu):
        self.pids, self.leader, self.clock = pids, leader, clock
        self.seized: dict[int, int] = {}  # tid -> its process
        self._tracer = ThreadPoolExecutor(1, thread_name_prefix="pause-tracer")
        self._closed = False

    def stop(self) -> None:
        self._tracer.submit(self._stop).result()
        settle(self.clock, time.monotonic() + STOP_LIMIT_S)

    def resume(self) -> None:
        self._tracer.submit(self._resume).result()

    def close(self) -> None:
        """Let everything go and end the tracing thread (idempotent: a reap may come twice)."""
        if not self._closed:
            self._closed = True
            self.resume()
            self._tracer.shutdown()

    def _stop(self) -> None:
        deadline = time.monotonic() + STOP_LIMIT_S
        while True:  # until a listing finds no thread that is not stopped: a new one comes only from a running one
            new = [(pid, tid) for pid in self.pids() for tid in _tids(pid) if tid not in self.seized]
            if not new:
                return
            for pid, tid in new:
                if _ptrace(PTRACE_SEIZE, tid) != 0:
                    err = ctypes.get_errno()
                    if err == errno.ESRCH or not Path(f"/proc/{pid}/task/{tid}").exists():
                        continue  # ended meanwhile
                    raise _refused(pid, tid, err)
                self.seized[tid] = pid
                _ptrace(PTRACE_INTERRUPT, tid)
            for pid, tid in new:
                if tid in self.seized:
                    self._await_stop(pid, tid, deadline)

    def _await_stop(self, pid: int, tid: int, deadline: float) -> None:
        lock = getattr(self.leader, "_waitpid_lock", None) if self.leader is not None and pid == self.leader.pid \
            else None
        with lock or contextlib.nullcontext():
            while True:
                try:
                    # WSTOPPED without WEXITED: an exit is never taken here, it stays its parent's to reap.
                    if os.waitid(os.P_PID, tid, os.WSTOPPED | os.WNOHANG | _WALL) is not None:
                        return
                except ChildProcessError:
                    return  # ended
                if _state(pid, tid) in ("Z", "X", None):
                    return
                if time.monotonic() > deadline:
                    raise PauseFailed(f"its thread {tid} did not stop within {STOP_LIMIT_S:g} s of its interrupt")
                time.sleep(_POLL_S)

    def _resume(self) -> None:
        for tid, pid in self.seized.items():
            if _ptrace(PTRACE_DETACH, tid) == 0:
                continue
            if _state(pid, tid) not in ("Z", "X", None):
                # Seized and interrupted, its stop not yet taken (a pause that failed part way): detach once stopped.
                with contextlib.suppress(PauseFailed):
                    self._await_stop(pid, tid, time.monotonic() + STOP_LIMIT_S)
                if _ptrace(PTRACE_DETACH, tid) == 0:
                    continue
            if self.leader is None or pid != self.leader.pid:
                # It ended while traced: its exit is reported to this tracer first, then to its own parent.
                with contextlib.suppress(ChildProcessError):
                    os.waitid(os.P_PID, tid, os.WEXITED | os.WNOHANG | _WALL)
        self.seized = {}


def _tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _state(pid: int, tid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def _refused(pid: int, tid: int, err: int) -> PauseFailed:
    """Why a seize failed: the candidate's doing (already traced, undumpable), or a host whose harness cannot
    trace at all (no CAP_SYS_PTRACE, a seccomp profile): then the harness's."""
    why = os.strerror(err)
    if not ptrace_capable():
        return PauseFailed(f"the harness cannot ptrace a process of its own making on this host ({why}): no pause "
                           "holds here (no usable cgroup freezer, and no ptrace: CAP_SYS_PTRACE, seccomp)",
                           harness=True)
    tracer = _status_field(pid, tid, "TracerPid")
    if tracer not in (None, "0"):
        return PauseFailed(f"its thread {tid} is already traced (by pid {tracer}): the harness cannot pause it")
    return PauseFailed(f"its thread {tid} refused the harness's ptrace ({why}; undumpable?): it cannot be paused")


def _status_field(pid: int, tid: int, name: str) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, tid: int) -> int:
    ctypes.set_errno(0)
    return int(_libc.ptrace(request, tid, None, None))


@functools.cache
def ptrace_capable() -> bool:
    """Whether this process can seize, stop and let go a process it started (as another uid where it is root, as the
    candidates run): what the ptrace pause needs of the host."""
    user: dict[str, Any] = {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
    try:
        child = subprocess.Popen(["sleep", "30"], **user)
    except OSError:
        return False
    try:
        probe = PtraceStop(lambda: [child.pid], child, ProcCpu(lambda: [child.pid]))
        try:
            probe.stop()
            return _state(child.pid, child.pid) == "t"
        except PauseFailed:
            return False
        finally:
            probe.close()
    finally:
        child.kill()
        child.wait()


def session_processes(leader: int) -> list[int]:
    """Without a jail's cgroup or uid: the leader's session and every descendant of the leader (one that started a
    session of its own too)."""
    parents: dict[int, int] = {}
    session: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(name)] = int(fields[1])
        if int(fields[3]) == leader:
            session.add(int(name))
    found = {leader} | session
    grew = True
    while grew:
        more = {p for p, pp in parents.items() if pp in found and p not in found}
        found |= more
        grew = bool(more)
    return sorted(p for p in found if p in parents)

