"""The build cache stays bounded: least recently used build dirs go first, one in use never."""

from __future__ import annotations

import os
import threading

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
