"""ChildProcess's own controls, on a child that only ticks (tests/sandbox/ticker.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from harness.sandbox.process import ChildProcess, scrubbed_env


def _ticks(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _wait_for(cond, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_a_paused_child_runs_nothing_in_any_thread_until_resumed_or_killed(tmp_path):
    """Between a candidate's turns in the timed rounds its processes are stopped (SIGSTOP, which no code of its can
    catch): a thread of its own that would launch work beside the trusted side's windows does nothing there."""
    ticks = tmp_path / "ticks"
    proc = ChildProcess("tests.sandbox.ticker", [], cwd=tmp_path, env=scrubbed_env({"TICK_FILE": str(ticks)},
                        tmp_path), log_path=tmp_path / "child.log", kill_grace_s=2.0)
    try:
        assert _wait_for(lambda: {"main", "thread"} <= set(ticks.read_text().split()) if ticks.exists() else False)
        proc.pause()
        proc.pause()  # idempotent
        time.sleep(0.1)  # a write in flight when the signal came lands
        stopped = _ticks(ticks)
        time.sleep(0.5)
        assert _ticks(ticks) == stopped and proc.paused
        proc.resume()
        assert _wait_for(lambda: _ticks(ticks) > stopped + 10) and not proc.paused
        proc.pause()
        t0 = time.monotonic()
    finally:
        proc.kill()  # continued first: a stopped process would hold SIGTERM
        proc.reap()
    assert proc.proc.returncode is not None and time.monotonic() - t0 < 2.0  # SIGTERM, not the grace's SIGKILL


def test_a_jail_without_cgroups_finds_its_processes_by_uid(tmp_path):
    """Without cgroups a pause finds the jail's processes by their uid (a process that left the group has it
    still): here this test's own, by the Uid line of its status."""
    from harness.config import Settings
    from harness.sandbox.limits import Jail

    jail = Jail(Settings(data_dir=tmp_path), untrusted=True, uid=os.getuid())
    assert os.getpid() in jail.processes()
    assert Jail(Settings(data_dir=tmp_path), untrusted=True).processes() == []  # no uid, no cgroup: its group only
