"""The worker's ready jobs (built, or needing no build), as its slots take them: oldest first, except that a slot
takes a job of the problem it evaluates ahead of older ones: its trusted process for that problem is warm, and a
warm evaluation skips the reference's start, build and torch.compile baseline (on an H100, level2/75's solution:
7 s against 29 s cold). Each waiting job is passed over at most `bypass_limit` times: no job waits behind a long
run of another problem's."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class ReadyJobs(Generic[T]):
    def __init__(self, bypass_limit: int, key: Callable[[T], Hashable]):
        self.bypass_limit = bypass_limit
        self.key = key
        self._waiting: list[list] = []  # [job, times passed over], oldest first
        self._cond = threading.Condition()

    def put(self, job: T) -> None:
        with self._cond:
            self._waiting.append([job, 0])
            self._cond.notify()

    def get(self, timeout: float, prefer: Hashable | None = None) -> T:
        """The oldest ready job, or the oldest of the key `prefer` while every job before it may still be passed
        over; raises queue.Empty after `timeout` seconds with none."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise queue.Empty
                self._cond.wait(left)
            at = 0
            if prefer is not None and self.bypass_limit > 0:
                for i, (job, _) in enumerate(self._waiting):
                    if self.key(job) == prefer:
                        if all(passed < self.bypass_limit for _, passed in self._waiting[:i]):
                            at = i
                        break
            for entry in self._waiting[:at]:
                entry[1] += 1
            return self._waiting.pop(at)[0]

    def __len__(self) -> int:
        with self._cond:
            return len(self._waiting)
