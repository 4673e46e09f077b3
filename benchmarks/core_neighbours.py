#!/usr/bin/env python3
"""Who else runs on the timed rounds' core while a command runs: the threads that took CPU time there, and the
core's steal time, in bins of the sampling interval. No torch; reads /proc only (Linux).

    python3 benchmarks/core_neighbours.py --core 15 --json out.json -- harness selfcheck ...

Every `--interval-ms` it reads each thread's CPU time (utime + stime, in clock ticks) and the core it last ran on
(/proc/PID/task/TID/stat), and the core's own counters (/proc/stat). A thread whose CPU time grew and whose last
core is `--core` is counted there. A thread allowed only that core is a window thread (rounds.TimedRounds._pin:
both sides keep theirs there); any other is a neighbour. Ticks are the kernel's (100 a second on most hosts), so
a bin of 100 ms resolves a tenth of the core. The sampler keeps itself off the core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path


def _threads() -> dict[int, tuple[str, int, int, int]]:
    """Every thread: tid -> (comm, pid, ticks of CPU time, last core)."""
    out: dict[int, tuple[str, int, int, int]] = {}
    for pid_dir in os.scandir("/proc"):
        if not pid_dir.name.isdigit():
            continue
        try:
            tasks = os.scandir(f"/proc/{pid_dir.name}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                raw = Path(f"/proc/{pid_dir.name}/task/{task.name}/stat").read_text()
            except OSError:
                continue
            comm = raw[raw.index("(") + 1:raw.rindex(")")]
            fields = raw[raw.rindex(")") + 2:].split()
            # fields[0] is field 3 (state): utime is field 14, stime 15, processor 39.
            out[int(task.name)] = (comm, int(pid_dir.name), int(fields[11]) + int(fields[12]), int(fields[36]))
    return out


def _allowed(pid: int, tid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def _core_counters(core: int) -> tuple[int, int]:
    """(busy ticks, steal ticks) of one core since boot."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            v = [int(x) for x in line.split()[1:]]
            user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
            return user + nice + system + irq + softirq, steal
    return 0, 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--core", type=int, default=None, help="the core to watch (default: this process's last)")
    ap.add_argument("--interval-ms", type=float, default=100.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    cores = sorted(os.sched_getaffinity(0))
    core = args.core if args.core is not None else cores[-1]
    tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
    proc = subprocess.Popen(command)  # on every core this process may use; then this process keeps off the core
    os.sched_setaffinity(0, [c for c in cores if c != core] or cores)
    before = _threads()
    counters = _core_counters(core)
    t0 = time.monotonic()
    bins: list[dict] = []
    totals: Counter[str] = Counter()
    window_ticks = 0
    while True:
        done = proc.poll() is not None
        time.sleep(args.interval_ms / 1000.0)
        now = _threads()
        busy, steal = _core_counters(core)
        neighbours: Counter[str] = Counter()
        windows = 0
        for tid, (comm, pid, ticks, last) in now.items():
            grew = ticks - before.get(tid, (comm, pid, ticks, last))[2] if tid in before else ticks
            if grew <= 0 or last != core or pid == os.getpid():
                continue
            if _allowed(pid, tid) == str(core):
                windows += grew
            else:
                neighbours[f"{comm}[{pid}]"] += grew
        before = now
        window_ticks += windows
        totals.update(neighbours)
        bins.append({"t_s": round(time.monotonic() - t0, 3), "busy_ms": (busy - counters[0]) * tick_ms,
                     "steal_ms": (steal - counters[1]) * tick_ms, "window_threads_ms": windows * tick_ms,
                     "neighbours_ms": {k: v * tick_ms for k, v in neighbours.items()}})
        counters = (busy, steal)
        if done:
            break
    span = bins[-1]["t_s"] if bins else 0.0
    steal_ms = sum(b["steal_ms"] for b in bins)
    print(f"core {core}: {span:.1f} s watched, busy {sum(b['busy_ms'] for b in bins) / 1e3:.1f} s, steal "
          f"{steal_ms / 1e3:.2f} s, window threads {window_ticks * tick_ms / 1e3:.1f} s, neighbours "
          f"{sum(totals.values()) * tick_ms / 1e3:.2f} s", file=sys.stderr)
    for name, ticks in totals.most_common(12):
        print(f"  neighbour {name}: {ticks * tick_ms / 1e3:.2f} s", file=sys.stderr)
    crowded = [b for b in bins if sum(b["neighbours_ms"].values()) >= 0.3 * args.interval_ms]
    print(f"  bins with neighbours over 30% of the core: {len(crowded)} of {len(bins)}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"core": core, "interval_ms": args.interval_ms, "tick_ms": tick_ms,
                                         "command": command, "rc": proc.returncode, "bins": bins,
                                         "neighbours_s": {k: v * tick_ms / 1e3 for k, v in totals.items()}}))
    return proc.returncode or 0


if __name__ == "__main__":
    raise SystemExit(main())
