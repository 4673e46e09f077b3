"""The worker's ready jobs: oldest first, a slot's warm problem ahead of older jobs, and a bound on passing over."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from harness.service.ready import ReadyJobs


def jobs(*names: str, limit: int = 8) -> ReadyJobs[str]:
    ready: ReadyJobs[str] = ReadyJobs(limit, key=lambda job: job[0])  # the problem: the name's first letter
    for name in names:
        ready.put(name)
    return ready


def take(ready: ReadyJobs[str], n: int, prefer: str | None) -> list[str]:
    return [ready.get(0.1, prefer=prefer) for _ in range(n)]


def test_without_a_preference_the_oldest_comes_first():
    assert take(jobs("a1", "b1", "a2"), 3, None) == ["a1", "b1", "a2"]


def test_the_warm_problems_jobs_come_ahead_of_older_ones_of_other_problems():
    assert take(jobs("a1", "b1", "a2", "c1", "b2"), 5, "b") == ["b1", "b2", "a1", "a2", "c1"]


def test_a_preference_nothing_matches_takes_the_oldest():
    assert take(jobs("a1", "b1"), 2, "z") == ["a1", "b1"]


def test_no_job_is_passed_over_more_than_the_limit():
    ready = jobs("a1", *(f"b{i}" for i in range(1, 6)), limit=3)
    # a1 is passed over three times, then taken though b's jobs still wait.
    assert take(ready, 6, "b") == ["b1", "b2", "b3", "a1", "b4", "b5"]


def test_a_limit_of_zero_is_first_in_first_out():
    assert take(jobs("a1", "b1", "a2", limit=0), 3, "a") == ["a1", "b1", "a2"]


def test_get_waits_for_a_job_then_gives_up_with_empty():
    ready = jobs()
    t0 = time.monotonic()
    with pytest.raises(queue.Empty):
        ready.get(0.2)
    assert time.monotonic() - t0 >= 0.2
    threading.Timer(0.1, ready.put, args=("a1",)).start()
    assert ready.get(5.0) == "a1" and len(ready) == 0


def test_a_job_of_higher_priority_is_never_passed_over_and_comes_first():
    """A fresh submission (priority 0) held beside re-evaluations (-1): the slot takes it first, even where
    re-evaluations of the problem it evaluates wait older; among the re-evaluations the warm problem's go first."""
    ready: ReadyJobs[tuple[str, int]] = ReadyJobs(8, key=lambda job: job[0][0], rank=lambda job: job[1])
    for job in (("b1", -1), ("a1", -1), ("c1", 0), ("b2", -1)):
        ready.put(job)
    assert [ready.get(0.1, prefer="b")[0] for _ in range(4)] == ["c1", "b1", "b2", "a1"]
