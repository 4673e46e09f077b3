"""Where a candidate was when its time ran out: its Python stacks and its threads' native state, written into its
log before the parent kills it, so that a timeout's log excerpt says where the code hung. No torch.

The candidate's process registers faulthandler on DUMP_SIGNAL at its start (child.py), writing to its log. On a
timeout the parent writes each thread's kernel state it can read (/proc: state, wait channel, system call) into
that log, sends the signal and waits a moment for the dump. The process is the submission's: it may have turned
faulthandler off, or taken the signal for itself. Then the log says that no stacks came, and the verdict stands.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

from harness.sandbox.process import ChildProcess

DUMP_SIGNAL = signal.SIGUSR1
WAIT_S = 2.0  # for the dump to start; it then ends within a moment
_QUIET_S = 0.3  # the log unchanged this long after growing: the dump is written
MAX_PROCESSES = 4  # a submission that forked copies of itself: the first few are enough to say where it was


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def processes_running(module: str, group: int) -> list[int]:
    """The processes of a process group that run `python -m module` (not a launcher whose argv only names it):
    the candidate itself, and any copy of itself it forked."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or _pgid(int(entry.name)) != group:
            continue
        argv = _argv(int(entry.name))
        if "-m" in argv and argv.index("-m") + 1 < len(argv) and argv[argv.index("-m") + 1] == module:
            found.append(int(entry.name))
    return sorted(found)


def native_state(pid: int) -> list[str]:
    """Its threads, grouped by what the kernel says each is doing: state, wait channel, system call number, and the
    kernel stack where it can be read."""
    seen: Counter[str] = Counter()
    try:
        tasks = sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda p: int(p.name))
    except OSError as e:
        return [f"native: the threads of pid {pid} cannot be read ({e.strerror})"]
    for task in tasks:
        stat = _read(task / "stat") or ""
        state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
        wchan = _read(task / "wchan") or "-"
        syscall = (_read(task / "syscall") or "unreadable").split()[0]
        frames = (_read(task / "stack") or "").splitlines()  # root only: "[<0>] futex_wait+0x1a/0x40"
        kernel = " < ".join(line.split("] ", 1)[-1].split("+")[0] for line in frames)
        what = f"state {state}, waiting in {wchan if wchan != '0' else '-'}, " + (
            "running (no system call)" if syscall == "running" else f"system call {syscall}")
        seen[what + (f", kernel stack {kernel}" if kernel else "")] += 1
    return [f"native: {n} thread(s) of pid {pid}: {what}" for what, n in seen.most_common()]


def dump(proc: ChildProcess, why: str, wait_s: float = WAIT_S) -> None:
    """Write the stacks of the child `proc` started (not its launcher's) into its log; never raises for what the
    process did to its own signals."""
    proc.resume()  # a frozen process could neither answer the signal nor show its threads at work
    pids = processes_running(proc.module, proc.proc.pid)[:MAX_PROCESSES]
    if not pids:
        proc.note(f"\n[harness] {why}: no process of the candidate's left to show the stacks of\n")
        return
    lines = [f"[harness] {why}: where it was (native state, then its Python stacks)"]
    for pid in pids:
        lines += native_state(pid)
    proc.note("\n" + "\n".join(lines) + "\n")
    before = proc.log_size()
    for pid in pids:
        try:
            os.kill(pid, DUMP_SIGNAL)
        except OSError as e:
            proc.note(f"[harness] pid {pid} could not be sent {DUMP_SIGNAL.name} for its Python stacks: {e.strerror}\n")
    deadline, last, changed_at = time.monotonic() + wait_s, before, None
    while time.monotonic() < deadline:
        time.sleep(0.05)
        size = proc.log_size()
        if size != last:
            last, changed_at = size, time.monotonic()
        elif changed_at is not None and time.monotonic() - changed_at >= _QUIET_S:
            break
    if last == before:
        ended = proc.proc.poll() is not None
        proc.note(f"[harness] no Python stacks came within {wait_s:g} s of {DUMP_SIGNAL.name}: "
                  + ("the process ended on it (the submission reset its handler)" if ended else
                     "the submission's process turned faulthandler off or took the signal for itself") + "\n")
