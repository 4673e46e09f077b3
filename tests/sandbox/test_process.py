"""ChildProcess's own controls, on a child that only ticks (tests/sandbox/ticker.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from harness.sandbox import limits
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
    """Between a candidate's turns in the timed rounds its processes are paused (here, with no jail, by a ptrace-stop
    of each of its threads, which no signal of its own ends): a thread of its own that would launch work beside the
    trusted side's windows does nothing there."""
    ticks = tmp_path / "ticks"
    proc = ChildProcess("tests.sandbox.ticker", [], cwd=tmp_path, env=scrubbed_env({"TICK_FILE": str(ticks)},
                        tmp_path), log_path=tmp_path / "child.log", kill_grace_s=2.0)
    try:
        assert _wait_for(lambda: {"main", "thread"} <= set(ticks.read_text().split()) if ticks.exists() else False)
        proc.pause()
        proc.pause()  # idempotent
        assert proc.pause_method == "ptrace"
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


def test_the_disk_count_reads_what_a_file_holds_not_what_the_filesystem_says_it_takes(tmp_path):
    """A child's disk share is counted in the bytes it wrote: a compressing filesystem (ZFS's) reports a few KiB of
    blocks for 8 MiB of one repeated byte, and its unsynced data not at all. A sparse file stands in for that here:
    100 MiB long, no blocks. Its honest twin, a file of 1 MiB written out, counts as 1 MiB (and its block)."""
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(100 * 2**20)
    assert os.stat(sparse).st_blocks * 512 < 2**20  # what a block count alone would say
    assert limits.tree_bytes([tmp_path]) >= 100 * 2**20
    sparse.unlink()
    (tmp_path / "honest").write_bytes(os.urandom(2**20))
    assert 2**20 <= limits.tree_bytes([tmp_path]) <= 2**20 + 8192


def _count_as(uid: int, top: Path) -> int:
    """`tree_bytes` with the effective uid `uid` (root keeps its saved uid, to take its own back)."""
    os.seteuid(uid)
    try:
        return limits.tree_bytes([top])
    finally:
        os.seteuid(0)


def test_a_dir_the_parent_cannot_read_is_no_hiding_place_for_bytes():
    """A parent that is not root counts a child of its own uid; the child can make a dir of its unreadable. The count
    then fails closed (the watcher kills the child), it does not skip the dir. Run here as an unprivileged uid, the
    counter and the files both its own; its twin, the same tree readable, is counted."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to count as another uid")
    top = Path(tempfile.mkdtemp(prefix="kh-count-", dir="/tmp"))
    try:
        top.chmod(0o755)
        (top / "hidden").mkdir()
        (top / "hidden" / "fill.bin").write_bytes(b"x" * 2**20)
        for p in (top, top / "hidden", top / "hidden" / "fill.bin"):
            os.chown(p, 65534, 65534)
        assert _count_as(65534, top) >= 2**20
        (top / "hidden").chmod(0)
        assert _count_as(0, top) >= 2**20  # root reads it anyway
        with pytest.raises(limits.UncountedDir, match="hidden"):
            _count_as(65534, top)
    finally:
        (top / "hidden").chmod(0o700)
        shutil.rmtree(top)


def test_the_disk_count_counts_files_and_dirs_and_stops_past_the_most_asked_for(tmp_path):
    """An empty file holds no bytes but takes an inode: the count says how many entries there are, and stops walking
    once it passes the most the caller asked for (a child with a million files is over its share at the first
    thousands, not after a walk of all)."""
    for d in range(3):
        (tmp_path / str(d)).mkdir()
        for i in range(100):
            (tmp_path / str(d) / str(i)).touch()
    assert limits.tree_usage([tmp_path]) == (303 * 4096, 303)
    _, counted = limits.tree_usage([tmp_path], most_entries=50)
    assert 50 < counted < 303
