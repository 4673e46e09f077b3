"""The build cache stays bounded: least recently used build dirs go first, one in use never. Scratch dirs left by
a process killed hard are swept; a child's files are removed without following its links."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from harness import artifacts
from harness.config import Settings


def _build(settings: Settings, key: str, mb: int, age_s: float):
    d = artifacts.build_dir(settings, key)
    (d / "ext.so").write_bytes(os.urandom(mb * 2**20))
    t = os.path.getmtime(d) - age_s
    os.utime(d, (t, t))
    return d


def test_prune_removes_least_recently_used_builds_first_and_never_one_in_use(tmp_path):
    settings = Settings(data_dir=tmp_path)
    oldest, in_use, newer, newest = (_build(settings, k, 1, age) for k, age in
                                     (("a", 400), ("b", 300), ("c", 200), ("d", 100)))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with artifacts.exclusive_build_dir(in_use):
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    os.utime(in_use, (os.path.getmtime(oldest) + 1,) * 2)  # still among the oldest
    try:
        removed = artifacts.prune_build_cache(settings, max_bytes=int(2.5 * 2**20))
    finally:
        release.set()
        t.join()
    assert removed == [oldest, newer]
    assert in_use.exists() and newest.exists() and not oldest.exists() and not newer.exists()
    assert artifacts.prune_build_cache(settings, max_bytes=0) == [in_use, newest]


def test_a_build_dir_removed_by_pruning_is_made_again_on_use(tmp_path):
    settings = Settings(data_dir=tmp_path)
    d = artifacts.build_dir(settings, "k")
    (d / "ext.so").write_bytes(b"x")
    assert artifacts.prune_build_cache(settings, max_bytes=0) == [d] and not d.exists()
    with artifacts.exclusive_build_dir(d):
        assert d.is_dir()


def test_workers_with_data_dirs_of_their_own_share_one_build_cache(tmp_path, monkeypatch):
    """HARNESS_BUILD_CACHE_DIR: one host's workers (each its own data dir) find each other's builds, and prune
    there; a relative path is made absolute, as a child in its own working dir must get it."""
    monkeypatch.chdir(tmp_path)
    one = Settings(data_dir=tmp_path / "w1", build_cache_dir=Path("cache"))
    two = Settings(data_dir=tmp_path / "w2", build_cache_dir=tmp_path / "cache")
    assert one.builds_dir == two.builds_dir == tmp_path / "cache"
    d = _build(one, "k", 1, 10)
    assert artifacts.build_dir(two, "k") == d and (d / "ext.so").exists()
    assert artifacts.prune_build_cache(two, max_bytes=0) == [d] and not (tmp_path / "w1" / "builds").exists()
    assert Settings(data_dir=tmp_path / "w3").builds_dir == tmp_path / "w3" / "builds"


def _scratch_settings(tmp_path):
    return Settings(data_dir=tmp_path / "data", scratch_dir=tmp_path / "scratch")


def test_a_scratch_dir_left_by_a_process_killed_hard_is_swept_and_a_live_ones_is_kept(tmp_path):
    """Two GPU suite runs killed at a time limit left their evaluations' scratch dirs (gigabytes of trial files) on
    an H100 host, whose disk then filled. A dir whose owner died is swept; one whose owner lives, or this process's
    own, is kept; an unlocked dir (an older harness's) only once it is old."""
    import subprocess
    import sys

    settings = _scratch_settings(tmp_path)
    root = settings.scratch_dir
    mine = artifacts.new_scratch_dir(settings)
    code = ("import sys, time; from pathlib import Path; from harness import artifacts; from harness.config import "
            "Settings; s = Settings(data_dir=Path(sys.argv[1]), scratch_dir=Path(sys.argv[2])); "
            "print(artifacts.new_scratch_dir(s), flush=True); time.sleep(60)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(settings.data_dir), str(root)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    dead, alive = (Path(p.stdout.readline().strip()) for p in procs)
    (dead / "trial.pt").write_bytes(b"x" * 1024)
    procs[0].kill()
    procs[0].wait()
    young, old = root / "kh-eval-young", root / "kh-eval-old"
    young.mkdir()
    old.mkdir()
    os.utime(old, (time.time() - 7 * 3600,) * 2)
    try:
        assert sorted(artifacts.sweep_scratch(root)) == sorted([dead, old])
        assert mine.is_dir() and alive.is_dir() and young.is_dir() and not dead.exists()
    finally:
        procs[1].kill()
        procs[1].wait()
    assert artifacts.sweep_scratch(root) == [alive]
    artifacts.remove_scratch_dir(mine)
    assert not mine.exists()


def test_removing_a_childs_files_never_follows_its_links(tmp_path):
    outputs, elsewhere = tmp_path / "outputs", tmp_path / "elsewhere"
    outputs.mkdir()
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("kept")
    (outputs / "output_0.pt").write_bytes(b"x")
    (outputs / "link").symlink_to(elsewhere / "precious")
    (outputs / "subdir").symlink_to(elsewhere)
    artifacts.remove_files(outputs)
    assert sorted(p.name for p in outputs.iterdir()) == []
    assert (elsewhere / "precious").read_text() == "kept"
    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere)
    artifacts.remove_files(linked)  # the dir itself a link: nothing is removed through it
    assert (elsewhere / "precious").exists()
