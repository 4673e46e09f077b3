"""A core kept busy beside the timing core while the timed rounds run (Settings.busy_core; off by default). No torch.

A launch-bound forward's speed follows what the host's other cores do. On an H200's host (a KVM guest of 16 vCPUs,
Intel Xeon) two processes of KernelBench's level3/28 (ViT) on one core took 35.0-40.0 ms a window of 10 calls with
every other core idle, and 18.5-23.4 ms beside one spinning core (normal or idle class, core 0 or 14 alike);
level3/10 (ResNet101) took 16.2 ms a call in an A/A with nothing beside it, 9.6 ms with the next row's processes
starting beside it (docs/kernelbench.md, "What the other cores do"). Left to chance, whatever else the host runs sets
a window's speed, and a candidate spinning a thread of its own on another core during its windows could buy that
speed-up. This keeps one core busy for every kind's windows alike.

Measured in the harness it did not do what it did outside: with the spinner through the rounds level 3's windows still
drifted between 8 and 19 ms a call within one row, as without it, so it is off by default; it stays for measuring
(`HARNESS_BUSY_CORE=auto` or a core).

The spinner is a process of the parent's, not the candidate's, at the idle scheduling class: it runs only where that
core has nothing else to run, so it takes no time from anything else, and it ends when the rounds end or its parent
dies.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from types import TracebackType

# The spinner's loop: pure CPU work, its parent looked at about every few tens of milliseconds (it ends with it). The
# parent's pid comes from the parent: one that died before the spinner's first look would otherwise go unseen.
_SPIN = "import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n    for _ in range(200000):\n        pass\n"


def busy_core(setting: str, device: str, timing_core: int | None, cores: list[int] | None = None) -> int | None:
    """The core kept busy through the timed rounds (Settings.busy_core): 'auto' takes, on CUDA and where a core is
    kept for the windows, this process's first core that no slot's windows take (those are counted from the last,
    windows.timing_core), where it has at least four; a number names it; 'off' keeps none. None: no core kept busy
    (and 'auto' on the CPU, whose windows need every core it has)."""
    if setting == "off":
        return None
    if setting != "auto":
        return int(setting)
    mine = cores if cores is not None else sorted(os.sched_getaffinity(0))
    if device != "cuda" or timing_core is None or len(mine) < 4:
        return None
    return mine[0] if mine[0] != timing_core else mine[1]


class BusyCore:
    """`with BusyCore(core):` a process spins on `core` (None: nothing happens) at the idle scheduling class. What it
    could not do it leaves undone: a spinner that cannot be kept to `core` (outside this process's set) ends at
    once, and `kept` says whether one runs there; where there is no idle class it spins at the normal one."""

    def __init__(self, core: int | None):
        self.core = core
        self.proc: subprocess.Popen[bytes] | None = None
        self.kept = False

    def __enter__(self) -> BusyCore:
        if self.core is None:
            return self
        self.proc = subprocess.Popen([sys.executable, "-S", "-c", _SPIN, str(os.getpid())], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
        try:
            os.sched_setaffinity(self.proc.pid, [self.core])
        except (OSError, ValueError):  # not on that core: it might spin on the timing core instead
            self.__exit__(None, None, None)
            return self
        self.kept = True
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(self.proc.pid, os.SCHED_IDLE, os.sched_param(0))
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
