"""The worker's ready jobs (built, or needing no build), as its slots take them: oldest first, except that a slot
takes a job of the problem it evaluates ahead of older ones: its trusted process for that problem is warm, and a
warm evaluation skips the reference's start, build and torch.compile baseline (on an H100, level2/75's solution:
7 s against 29 s cold). Each waiting job is passed over at most `bypass_limit` times: no job waits behind a long
run of another problem's. A job of higher priority (a fresh submission beside re-evaluations) is never passed
over: the slot takes the highest priority ready first, as the queue is claimed."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class ReadyJobs(Generic[T]):
    def __init__(self, bypass_limit: int, key: Callable[[T], Hashable], rank: Callable[[T], int] = lambda job: 0):
        self.bypass_limit = bypass_limit
        self.key = key  # the job's problem
        self.rank = rank  # the job's priority: a higher one is never passed over
        self._waiting: list[list] = []  # [job, times passed over], oldest first
        self._cond = threading.Condition()

    def put(self, job: T) -> None:
        with self._cond:
            self._waiting.append([job, 0])
            self._cond.notify()

    def get(self, timeout: float, prefer: Hashable | None = None) -> T:
        """Of the jobs of the highest priority ready, the oldest, or the oldest of the key `prefer` while every job
        before it may still be passed over; raises queue.Empty after `timeout` seconds with none."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise queue.Empty
                self._cond.wait(left)
            top = max(self.rank(job) for job, _ in self._waiting)
            first = [entry for entry in self._waiting if self.rank(entry[0]) == top]
            at = 0
            if prefer is not None and self.bypass_limit > 0:
                for i, (job, _) in enumerate(first):
                    if self.key(job) == prefer:
                        if all(passed < self.bypass_limit for _, passed in first[:i]):
                            at = i
                        break
            for entry in first[:at]:
                entry[1] += 1
            self._waiting.remove(first[at])
            return first[at][0]

    def __len__(self) -> int:
        with self._cond:
            return len(self._waiting)
