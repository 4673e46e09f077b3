"""Timed windows on the parent's clock: how long a window is, and what its wall times mean. No torch.

The parent opens a window by sending N fresh seeds; the process makes each call's inputs from its seed,
flushes the L2, runs the call and waits for the device, and answers when all N are done. The parent's
monotonic clock from send to answer is the window's wall time. Windows of the candidate, eager and
torch.compile alternate round by round, with a window around a call that does nothing (in the trusted
process) beside them, so drift hits all alike. A kind's time per call is, for each of its windows, the
window's wall time less the median empty window's, over N; its figure is the median over windows.

Everything here is arithmetic on figures the parent measured itself: the candidate reports none of them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from harness.schema import TimingStats

MAX_CALLS_PER_WINDOW = 2000
# What a window holds at once: every call's inputs (made first) and outputs (kept until its hand-over: which
# calls are picked is decided after the window closes).
HELD_BYTES = {"cuda": 4 << 30, "cpu": 1 << 30}
PICKS_PER_WINDOW = 2
# The trusted side times its own save of the picked outputs (what an honest hand-over costs) on the first hand-overs
# of an evaluation only: saving the same bytes costs the same each time, and the bound takes their median.
SAVES_TIMED = 3
# Bytes of handed-over outputs an evaluation checks, at most: windows are checked at random, each with the same
# chance, at least one (for level2/37's 537 MB outputs, about 3 windows of 15).
HANDOVER_BYTES = 4 << 30
MIN_CHECKED_WINDOWS = 3


def calls_per_window(reference_call_ms: float, io_bytes: int, device: str, window_ms: float,
                     window_cost_ms: float = 0.0) -> int:
    """How many calls a window holds: enough that it lasts about `window_ms` at the reference's speed, counting the
    window's own cost per call (inputs, flush), so the IPC round trip (0.4-0.7 ms on an H100 host) is about 1% of a
    60 ms window;
    no more than the inputs and outputs a window holds (`io_bytes` a call) fit in memory; at least one."""
    want = math.ceil(window_ms / max(reference_call_ms + window_cost_ms, 1e-3))
    return max(1, min(want, most_calls(io_bytes, device)))


def most_calls(io_bytes: int, device: str) -> int:
    """The most calls a window may hold: their inputs and outputs within HELD_BYTES, at most MAX_CALLS_PER_WINDOW."""
    return max(1, min(HELD_BYTES[device] // max(io_bytes, 1), MAX_CALLS_PER_WINDOW))


def resize(calls: int, warm_window_ms: float, window_ms: float, most: int) -> int:
    """The calls a window should hold, from a warm window of `calls` calls that lasted `warm_window_ms`: about
    `window_ms` in all, at least one, at most `most` (what memory allows)."""
    per_call = max(warm_window_ms, 1e-3) / calls
    return max(1, min(math.ceil(window_ms / per_call), most, MAX_CALLS_PER_WINDOW))


def sized_down(calls: int, by_eager: int, candidate_ms: list[float], window_ms: float) -> str | None:
    """Why windows sized below what eager's speed asks for, on the candidate's (slow) warm-up windows, cannot rank:
    when timed they lasted under half their target. Such short windows let a faster reply of the candidate's own
    count for more of each window. None where the sizing held."""
    timed_ms = statistics.median(candidate_ms)
    if calls >= by_eager or timed_ms >= window_ms / 2:
        return None
    return (f"windows of {calls} calls (eager's speed asks for {by_eager}), sized on the candidate's warm-up windows, "
            f"lasted {timed_ms:.3g} ms when timed, under half the {window_ms:g} ms aimed at")


def check_chance(rounds: int, output_bytes: int) -> float:
    """The chance that a window's outputs are checked: every window where the hand-overs fit HANDOVER_BYTES, else
    enough for MIN_CHECKED_WINDOWS on average. A submission cannot know which windows will be checked (it is
    drawn after each window closes), and moving the median takes cheating in most of them."""
    affordable = HANDOVER_BYTES // max(PICKS_PER_WINDOW * output_bytes, 1)
    return min(1.0, max(affordable, MIN_CHECKED_WINDOWS) / max(rounds, 1))


def _iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def spread(values: list[float]) -> float:
    """Interquartile range over median (0 for fewer than 2 values or a zero median)."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return _iqr(values) / med if med > 0 else 0.0


@dataclass
class WindowSeries:
    """The wall times (ms, parent's clock) of one kind's windows, each of `calls` calls; beside them, what the
    process said of each window (`host_ms`, `device_ms`: a diagnostic, never a figure that ranks)."""

    calls: int
    wall_ms: list[float]
    seen: list[dict[str, Any]] = field(default_factory=list)

    def said(self, key: str) -> list[float]:
        """The process's figure `key` for each window where it gave a finite, non-negative number."""
        values = [_number(s.get(key)) for s in self.seen]
        return [v for v in values if v is not None]

    def per_call_ms(self, empty_ms: float) -> list[float]:
        return [max(w - empty_ms, 0.0) / self.calls for w in self.wall_ms]


def _number(value: Any) -> float | None:
    """A finite, non-negative float, or None (a claim may be anything JSON holds: 10**400 too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) and f >= 0 else None


def stats(series: WindowSeries, empty: WindowSeries) -> TimingStats:
    """One kind's timing figures: median over windows of (window - median empty window) / calls."""
    empty_ms = statistics.median(empty.wall_ms)
    per_call = series.per_call_ms(empty_ms)
    raw = [w / series.calls for w in series.wall_ms]
    return TimingStats(
        clock="parent_window", n=len(per_call), calls_per_window=series.calls,
        median_ms=statistics.median(per_call), raw_median_ms=statistics.median(raw),
        mean_ms=statistics.fmean(per_call), min_ms=min(per_call), max_ms=max(per_call),
        std_ms=statistics.pstdev(per_call) if len(per_call) > 1 else 0.0,
        overhead_ms=empty_ms / series.calls, spread=spread(per_call), windows_ms=[round(w, 4) for w in series.wall_ms],
        noise_ms=_iqr(empty.wall_ms) / series.calls, **_diagnostics(series),
    )


def _diagnostics(series: WindowSeries) -> dict[str, float | None]:
    """The process's own clocks beside the parent's: its CUDA events per call, its time making inputs per call, and
    the median window's wall time less its own host time (the command's round trip). Only where every window said
    them."""
    device = series.said("device_ms")
    host = series.said("host_ms")
    inputs = series.said("inputs_ms")
    n = len(series.wall_ms)
    return {"device_median_ms": statistics.median(device) / series.calls if device and len(device) == n else None,
            "inputs_median_ms": statistics.median(inputs) / series.calls if inputs and len(inputs) == n else None,
            "round_trip_ms": statistics.median(w - h for w, h in zip(series.wall_ms, host, strict=True))
            if host and len(host) == n else None}



# What a hand-over may take beyond the trusted side's own save of outputs of the same sizes (host noise:
# scheduling; the page cache adds a share of the save itself, see grading.HANDOVER_SAVE_SHARE).
HANDOVER_SLACK_MS = {"cuda": 3.0, "cpu": 40.0}
