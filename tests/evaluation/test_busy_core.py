"""The core kept busy through the timed rounds: which core, a spinner there at the idle class, and none left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from harness.evaluation import busy_core
from harness.evaluation.busy_core import BusyCore


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_auto_takes_the_first_core_no_slots_windows_take_on_cuda_only():
    sixteen = list(range(16))
    assert busy_core.busy_core("auto", "cuda", 15, sixteen) == 0
    assert busy_core.busy_core("auto", "cuda", 0, [0, 1, 2, 3]) == 1  # the timing core named 0 itself
    assert busy_core.busy_core("auto", "cpu", None, sixteen) is None  # the CPU's windows need its cores
    assert busy_core.busy_core("auto", "cuda", None, sixteen) is None  # no timing core kept: nothing to keep apart
    assert busy_core.busy_core("auto", "cuda", 2, [0, 1, 2]) is None  # too few cores to spare one
    assert busy_core.busy_core("off", "cuda", 15, sixteen) is None
    assert busy_core.busy_core("5", "cpu", None, sixteen) == 5


def test_a_spinner_runs_on_its_core_at_the_idle_class_and_ends_with_the_block():
    core = sorted(os.sched_getaffinity(0))[0]
    with BusyCore(core) as busy:
        assert busy.kept and busy.proc is not None
        pid = busy.proc.pid
        deadline = time.monotonic() + 10
        while _cpu_ticks(pid) == 0 and time.monotonic() < deadline:  # idle class: it runs when the core is free
            time.sleep(0.1)
        assert _cpu_ticks(pid) > 0  # it spins (ticks of 10 ms)
        assert os.sched_getaffinity(pid) == {core}
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
    assert busy.proc is None and not _alive(pid)


def test_no_core_starts_nothing_and_a_core_it_cannot_have_leaves_no_spinner():
    with BusyCore(None) as none:
        assert none.proc is None and not none.kept
    outside = max(os.sched_getaffinity(0)) + 64
    with BusyCore(outside) as refused:
        assert not refused.kept and refused.proc is None  # never left spinning wherever it started


def test_the_spinner_ends_when_its_parent_dies_without_leaving_the_block():
    """A worker killed mid-rounds leaves no spinner: it watches its parent."""
    code = ("import os, sys, time\nfrom harness.evaluation.busy_core import BusyCore\n"
            f"b = BusyCore({sorted(os.sched_getaffinity(0))[0]}).__enter__()\n"
            "print(b.proc.pid, flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    spinner = int(parent.stdout.readline())
    assert _alive(spinner)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(spinner) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(spinner)
