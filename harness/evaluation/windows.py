"""Timed windows on the parent's clock: how long a window is, and what its wall times mean. No torch.

The parent opens a window by sending N fresh seeds; the process makes each call's inputs from its seed,
flushes the L2, runs the call and waits for the device, and answers when all N are done. The parent's
monotonic clock from send to answer is the window's wall time. Windows of the candidate, eager and
torch.compile alternate round by round, with a window around a call that does nothing (in the trusted
process) beside them, so drift hits all alike. A kind's time per call is, for each of its windows, the
window's wall time less the median empty window's, over N; its figure is the median over windows. The candidate's
windows also carry what the command right after each took beyond the trusted side's same work (its fingerprints of
the window's outputs): work a window leaves undone is done there, and paid for in that window's time.

Everything here is arithmetic on figures the parent measured itself: the candidate reports none of them.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

from harness.schema import TimingStats

MAX_CALLS_PER_WINDOW = 2000
# What a window holds at once: every call's inputs (made first) and outputs (kept until its hand-over: which
# calls are picked is decided after the window closes).
HELD_BYTES = {"cuda": 4 << 30, "cpu": 1 << 30}
PICKS_PER_WINDOW = 2
# Every timed window's outputs are fingerprinted (timing.fingerprints: what binds them to the window); the picked
# calls of a few windows are also handed over whole and judged element by element: about CHECKED_WINDOWS windows
# an evaluation, drawn at random with the same chance each, at least one, and no more bytes than HANDOVER_BYTES
# (on an H100 host level2/75's hand-over of 2 x 32 MB took about 0.22 s: the candidate's save 90 ms, the trusted
# side's read and judge 130 ms; about 3.4 s a GB, so three hand-overs of level2/37's 2 x 512 MB would be 10 s).
CHECKED_WINDOWS = 3
HANDOVER_BYTES = 1 << 30
# A fingerprint off the reference's by more than this many scales (an error of the whole tolerance at every
# element, timing.fingerprint_scales) is a wrong output: an output within its tolerance is that far off, either way,
# with a chance under 2 * exp(-18), 3e-8 (random signs are sub-Gaussian: Chernoff's bound, which a normal meets too).
FINGERPRINT_Z = 6.0


# Both processes' CUDA caching allocator: expandable segments, which grow one mapping rather than keep blocks of
# fixed sizes. With fixed blocks, level1/45 at its own size (16 GiB inputs) ran the trusted side out of an H200's
# memory with 31 GiB reserved but unallocated (blocks from earlier trials too small for the next 16 GiB): the memory
# plan counts tensors, not how the allocator cut its blocks.
ALLOCATOR_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

# Both processes' host allocator (glibc's malloc) keeps what it is given back: blocks up to 32 MiB (its largest
# threshold) come from the heap, and the heap is never trimmed. By default it hands freed memory back to the kernel
# and sets its thresholds from each process's own history, so a window's tensors came from pages the kernel had to
# find and zero again in one process and not in the other. On the 2-core CPU VM, both sides on one core and one
# thread, the trusted side took 2,000-9,000 page faults per 0.3 s of rounds, the candidate 0-5,000, and the six
# built-ins' A/A came out at 1.05x-1.34x; kept, at 0.988x-1.017x in 29 of 30 runs (docs/results/cpu-aa-*-03fa0cf*).
# Larger blocks are still mapped and unmapped for each (a float64 truth of gigabytes goes back when it is let go).
HOST_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
                      "MALLOC_TOP_PAD_": str(64 << 20)}


def timing_env(cores: int | None = None) -> dict[str, str]:
    """The environment of both processes' thread pools and allocators (ALLOCATOR_ENV, HOST_ALLOCATOR_ENV): the same
    number of threads in each (the cores this process may run on, unless `cores` says), and no thread left spinning
    once its work is done. By default OpenMP's workers spin after each parallel region (on the 2-core CPU VM a
    2-thread torch process burnt a median of 7.6 ms of CPU in a 50 ms sleep after a matmul and a group norm; 0.04 ms
    passive): the trusted side's spinning workers would hold a core through the start of the candidate's next window
    (the candidate is frozen after its turn, so never the other way round), and on a shared host a spinning barrier
    waits out other processes' time slices. Taken in when each process starts (OpenMP and glibc read it once)."""
    threads = cores if cores is not None else len(os.sched_getaffinity(0))
    return {"OMP_NUM_THREADS": str(max(1, threads)), "OMP_WAIT_POLICY": "PASSIVE", **ALLOCATOR_ENV,
            **HOST_ALLOCATOR_ENV}


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


# A window's constant cost (a command's round trip between the parent and a process, on the parent's clock) is taken
# off with the empty window's, measured in the trusted process; the candidate's is not the same (it is woken from its
# freezer, a loaded host wakes either late). A window's net work outweighs that cost this many times (the default of
# Settings.window_fixed_cost_factor), so that what differs moves a time by no more than its inverse (1%). Where
# calls are fast and the round trip long (a short window_ms, a loaded host) this, not `window_ms`, sets the length.
FIXED_COST_FACTOR = 100.0


def resize(calls: int, warm_window_ms: float, window_ms: float, most: int, fixed_ms: float = 0.0,
           overhead_ms: float = 0.0, factor: float = FIXED_COST_FACTOR) -> int:
    """The calls a window should hold, from a warm window of `calls` calls that lasted `warm_window_ms`: about
    `window_ms` in all, and net work (less the window's constant cost `fixed_ms` and each call's `overhead_ms`: its
    inputs) of at least `factor` times `fixed_ms`; at least one, at most `most` (what memory allows)."""
    per_call = warm_per_call_ms(calls, warm_window_ms, fixed_ms)
    net = max(per_call - overhead_ms, 1e-6)
    want = max(math.ceil(window_ms / per_call), math.ceil(factor * fixed_ms / net))
    return max(1, min(want, most, MAX_CALLS_PER_WINDOW))


def warm_per_call_ms(calls: float, window_ms: float, fixed_ms: float = 0.0) -> float:
    """A warm window's time per call: its time less the window's constant cost `fixed_ms`, over its calls."""
    return max(window_ms - fixed_ms, 1e-3) / max(calls, 1.0)


def round_trip_ms(pings_ms: list[float]) -> float:
    """A command's round trip from a few pings: their median (one the host held up says nothing of the others)."""
    return statistics.median(pings_ms) if pings_ms else 0.0


def sized_down(calls: int, by_eager: int, candidate_ms: list[float], window_ms: float,
               warmup: list[list[float]] | None = None) -> str | None:
    """Why windows sized below what eager's speed asks for, on the candidate's (slow) warm-up windows, cannot rank:
    when timed they lasted under half their target. Such short windows let a faster reply of the candidate's own
    count for more of each window. None where the sizing held. `warmup`: the candidate's untimed windows as [calls,
    ms], said with it (what the sizing saw)."""
    timed_ms = statistics.median(candidate_ms)
    if calls >= by_eager or timed_ms >= window_ms / 2:
        return None
    seen = "; its untimed windows: " + ", ".join(f"{int(c)} call{'s' if c != 1 else ''} in {ms:.3g} ms"
                                                 for c, ms in warmup) if warmup else ""
    return (f"windows of {calls} calls (eager's speed asks for {by_eager}), sized on the candidate's warm-up windows, "
            f"lasted {timed_ms:.3g} ms when timed, under half the {window_ms:g} ms aimed at{seen}")


def check_chance(rounds: int, output_bytes: int) -> float:
    """The chance that a window's picked outputs are handed over whole: CHECKED_WINDOWS windows on average (fewer where
    their bytes would pass HANDOVER_BYTES, at least one). A submission cannot know which windows (it is drawn after
    each window closed), and every window's outputs are fingerprinted in any case."""
    affordable = HANDOVER_BYTES // max(PICKS_PER_WINDOW * output_bytes, 1)
    return min(1.0, max(1, min(CHECKED_WINDOWS, affordable)) / max(rounds, 1))


def paired_ratio(base: list[float], candidate: list[float]) -> tuple[float, float]:
    """The candidate's speedup over a baseline from their windows' times per call paired by round (the i-th of each
    timed in the same round): exp of the median of log(base_i / candidate_i), and the interquartile range of those
    logs (a relative spread, as `spread` is of one kind's windows). A host whose speed drifts by more than the calls
    differ moves both windows of a round alike, and their ratio not at all: on an H200's host ResNet101's calls ran
    at 7.5 or 16 ms for seconds at a time, and an A/A of one-call windows cut from one process's timeline (no
    difference of process at all), 12 pairs a group, came out 0.87x at worst as a ratio of medians, 1.03x paired
    (benchmarks/call_timeline.py; docs/kernelbench.md). A window of zero time per call, which only rounding makes,
    counts as 1e-9 ms. (nan, 0) without a pair."""
    pairs = [(max(b, 1e-9), max(c, 1e-9)) for b, c in zip(base, candidate, strict=False)]
    if not pairs:
        return math.nan, 0.0
    logs = [math.log(b / c) for b, c in pairs]
    return math.exp(statistics.median(logs)), _iqr(logs)


def paired_halfwidth(base: list[float], candidate: list[float], n: int) -> float:
    """What the paired speedup (`paired_ratio`) is known to, relative to it (95%), over `n` rounds of the spread these
    windows show: a median of n is about 1.2533 sigma over sqrt(n), sigma about the interquartile range over 1.349,
    so the median log ratio is known to 0.929 s over sqrt(n) for many rounds. For few, the interquartile range of n
    normal draws comes out short of 1.349 sigma (0.79 of it at 6, 0.89 at 12) by more than their median's spread
    falls short of 1.2533 sigma over sqrt(n) (0.90 of it at 6, 0.94 at 12), so the factor is 0.929 (1 + 0.8 / n)
    (1.05 at 6, 0.99 at 12; 20,000 draws each); and the spread is itself estimated from few rounds, so Student's t
    for n - 1 degrees of freedom stands in for the normal's 1.96. Without both, 6 rounds of normal noise held the
    true ratio 90% of the time, not 95% (tests/evaluation/test_windows.py). 12 rounds of a 5% spread leave +-3.0%; 6
    of 0.5%, +-0.5%."""
    return halfwidth(paired_ratio(base, candidate)[1], n)


def halfwidth(spread_: float, n: int) -> float:
    """What a median of `n` rounds of this relative spread (interquartile range) is known to (95%): the factor
    `paired_halfwidth` says."""
    n = max(n, 1)
    return _t95(max(n - 1, 1)) * 0.929 * (1 + 0.8 / n) * spread_ / math.sqrt(n)


def _t95(df: int) -> float:
    """Student's t two-sided 95% quantile for `df` degrees of freedom, by its series about the normal's (Cornish-
    Fisher; 2.55 at 5 against the exact 2.571, 2.20 at 11 against 2.201)."""
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def fingerprint_mismatches(window: int, calls: int, got: list[list[float | None]], reference: list[list[float | None]],
                           scales: list[list[float | None]]) -> list[str]:
    """The window's outputs whose fingerprint is not the reference's within FINGERPRINT_Z scales (the candidate's
    numbers are a claim: any list of them may come). An output whose reference fingerprint is not finite decides
    nothing; a missing or non-finite number where the reference has one is a mismatch."""
    found: list[str] = []
    if len(got) != len(reference):
        return [f"window {window}: {len(got)} fingerprints for {len(reference)} calls"]
    for j, (g_row, r_row, s_row) in enumerate(zip(got, reference, scales, strict=True)):
        call = window * calls + j
        if len(g_row) != len(r_row):
            found.append(f"timed call {call}: {len(g_row)} output tensor(s) fingerprinted, the reference has "
                         f"{len(r_row)}")
            continue
        for k, (g, r, scale) in enumerate(zip(g_row, r_row, s_row, strict=True)):
            if r is None or scale is None:
                continue
            bound = FINGERPRINT_Z * scale + 1e-9 * abs(r)
            if g is None or not abs(g - r) <= bound:
                found.append(f"timed call {call} output {k}: fingerprint {g} where the reference's is {r:.6g} "
                             f"(within {bound:.3g} for an output within the tolerance)")
    return found


_DEVIATION_CAP = 1e6 * FINGERPRINT_Z


def fingerprint_deviation(got: list[list[float | None]], reference: list[list[float | None]],
                          scales: list[list[float | None]]) -> tuple[float, int]:
    """The sum of (difference / scale)**2 over the outputs of a window whose fingerprints both sides gave, and their
    number (grading.fingerprint_deviation_bound judges the evaluation's total). Mismatched structures count in
    fingerprint_mismatches instead."""
    total, terms = 0.0, 0
    if len(got) != len(reference):
        return total, terms
    for g_row, r_row, s_row in zip(got, reference, scales, strict=True):
        if len(g_row) != len(r_row):
            continue
        for g, r, scale in zip(g_row, r_row, s_row, strict=True):
            if g is not None and r is not None and scale and math.isfinite(g):
                # The candidate's number is a claim: one past the float range squared would raise (OverflowError),
                # and the evaluation would read as the harness's failure. A term is capped far past the point where
                # it alone is a mismatch (fingerprint_mismatches), so the cap decides nothing.
                z = min(abs(g - r) / scale, _DEVIATION_CAP)
                total += z * z
                terms += 1
    return total, terms


def _iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def timing_core(setting: str, device: str, visible: str, cores: list[int] | None = None,
                held: bool = False) -> int | None:
    """The core both sides' window threads are kept to for the timed rounds (Settings.timing_core): a launch-bound
    network timed in two processes whose threads ran on two cores of an H100's host measured 0.71x-1.35x against
    itself, on one core 0.89x-1.04x (the host slows its cores apart, by up to 1.9x between them at a moment). 'auto'
    takes this process's last core for the first GPU `visible` names, the one before for the next, so that slots on
    different GPUs of one host keep apart; a number names the core, on any device. On the CPU 'auto' takes the last
    core only where the candidate can be `held` to it (its cpuset): the rounds then run both sides on one thread
    there (rounds.RoundsPlan.held), which a candidate free to use the other cores would be credited for. None: not
    kept ('off', and 'auto' on a CPU that cannot hold the candidate)."""
    if setting == "off":
        return None
    if setting != "auto":
        return int(setting)
    if device != "cuda" and not held:
        return None
    mine = cores if cores is not None else sorted(os.sched_getaffinity(0))
    first = visible.split(",")[0].strip()
    index = int(first) if first.isdigit() else 0
    return mine[-1 - index % len(mine)]


def spread(values: list[float]) -> float:
    """Interquartile range over median (0 for fewer than 2 values or a zero median)."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return _iqr(values) / med if med > 0 else 0.0


def fingerprint_charges(fingerprint_ms: list[float], round_trip_ms: list[float], reference_ms: list[float],
                        round_trip_credit_ms: float) -> list[float]:
    """What each window's fingerprint command took beyond an honest one's, charged to that window: the candidate's
    command on the parent's clock, less the host's round trip measured right after it (a trusted no-op, credited at
    most `round_trip_credit_ms`), less the trusted side's fingerprint of the same outputs (eager's, of the same
    seeds) on its own clock. That is the same work in every round, so its median over the rounds is taken: a round
    where the host held up the trusted side's does not let that window's undone work go unpaid. An honest
    fingerprint only reads outputs already made and comes to about nothing; outputs a window left undone are computed
    here, since no fingerprint can be made without them, and are paid for in full, whatever their number. Never
    below zero: a faster fingerprint than the trusted side's earns no credit."""
    if not len(fingerprint_ms) == len(round_trip_ms) == len(reference_ms):
        raise ValueError(f"fingerprint figures of {len(fingerprint_ms)}, {len(round_trip_ms)} and "
                         f"{len(reference_ms)} windows: one each per window")
    if not fingerprint_ms:
        return []
    honest = statistics.median(reference_ms)
    return [round(max(c - min(rt, round_trip_credit_ms) - honest, 0.0), 4)
            for c, rt in zip(fingerprint_ms, round_trip_ms, strict=True)]


def honest_charges(reference_ms: list[float]) -> list[float]:
    """What each round's baseline windows are charged: what eager's process's fingerprint of that round took beyond
    their median (each measured as the candidate's are in `fingerprint_charges`: on the parent's clock, less the round
    trip after it), never below zero. The candidate's charges are taken over that same median, and an honest
    fingerprint's time varies from round to round, so about half of an honest candidate's windows are charged
    something: charging only them made the same code slower than itself (H100, tree 728f2e8: level1/99's A/A 0.989x
    paired before its charges, 0.973x after; level3/20's 0.994x and 0.970x). Charged alike, a window of eager's pays
    that noise as the candidate's does, and the candidate's speedup over it is that of the windows it did (eager's
    process is paused while the candidate runs: nothing of the candidate's sets these)."""
    if not reference_ms:
        return []
    honest = statistics.median(reference_ms)
    return [round(max(r - honest, 0.0), 4) for r in reference_ms]


@dataclass
class WindowSeries:
    """The wall times (ms, parent's clock) of one kind's windows, each of `calls` calls; beside them, what the
    process said of each window (`host_ms`, `device_ms`: a diagnostic, never a figure that ranks), and what is
    charged to each beside its wall time (`charged_ms`: the candidate's fingerprint_charges, the baselines'
    honest_charges; none for the empty window)."""

    calls: int
    wall_ms: list[float]
    seen: list[dict[str, Any]] = field(default_factory=list)
    charged_ms: list[float] = field(default_factory=list)

    def said(self, key: str) -> list[float]:
        """The process's figure `key` for each window where it gave a finite, non-negative number."""
        values = [_number(s.get(key)) for s in self.seen]
        return [v for v in values if v is not None]

    def charges(self) -> list[float]:
        if self.charged_ms and len(self.charged_ms) != len(self.wall_ms):
            raise ValueError(f"{len(self.charged_ms)} charges for {len(self.wall_ms)} windows")
        return self.charged_ms or [0.0] * len(self.wall_ms)

    def per_call_ms(self, empty_ms: float) -> list[float]:
        """Each window's time per call: its wall time less the empty window's, plus what is charged to it."""
        return [(max(w - empty_ms, 0.0) + c) / self.calls for w, c in zip(self.wall_ms, self.charges(), strict=True)]


def own_clocks(said: dict[str, Any]) -> list[float | None]:
    """What a window's process said its own clocks took, [host ms, device ms], each a finite, non-negative number
    rounded, or None (a claim may be anything)."""
    return [None if (v := _number(said.get(key))) is None else round(v, 4) for key in ("host_ms", "device_ms")]


def _number(value: Any) -> float | None:
    """A finite, non-negative float, or None (a claim may be anything JSON holds: 10**400 too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) and f >= 0 else None


def stats(series: WindowSeries, empty: WindowSeries, candidate: WindowSeries | None = None) -> TimingStats:
    """One kind's timing figures: median over windows of (window - median empty window + its charge) / calls; for
    a series with charges, also the median of its windows alone (a diagnostic: what the time was before them). For a
    baseline, given the `candidate`'s series of the same rounds, the candidate's speedup over it paired by round
    (`paired_ratio`), the figure that ranks."""
    empty_ms = statistics.median(empty.wall_ms)
    per_call = series.per_call_ms(empty_ms)
    paired: dict[str, float] = {}
    if candidate is not None and len(candidate.wall_ms) == len(series.wall_ms):
        ratio, logs_spread = paired_ratio(per_call, candidate.per_call_ms(empty_ms))
        if math.isfinite(ratio):
            paired = {"paired_speedup": ratio, "paired_spread": logs_spread}
    raw = [(w + c) / series.calls for w, c in zip(series.wall_ms, series.charges(), strict=True)]
    alone = [max(w - empty_ms, 0.0) / series.calls for w in series.wall_ms]
    return TimingStats(
        clock="parent_window", n=len(per_call), calls_per_window=series.calls,
        median_ms=statistics.median(per_call), raw_median_ms=statistics.median(raw),
        mean_ms=statistics.fmean(per_call), min_ms=min(per_call), max_ms=max(per_call),
        std_ms=statistics.pstdev(per_call) if len(per_call) > 1 else 0.0,
        overhead_ms=empty_ms / series.calls, spread=spread(per_call), windows_ms=[round(w, 4) for w in series.wall_ms],
        noise_ms=_iqr(empty.wall_ms) / series.calls, charged_ms=list(series.charged_ms),
        windows_alone_median_ms=statistics.median(alone) if series.charged_ms else None, **paired,
        **_diagnostics(series),
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


# The host's scheduling noise on a command's time, by device: the host's round trip taken off a fingerprint is credited
# at most grading.HANDOVER_LATENCY_CREDIT of these (a submission that loads the host around its reply gains no more).
# Results stored before fingerprints were charged to their windows allowed the fingerprints (before fingerprints, a
# hand-over) this much more than the trusted side's, and are graded so still (grading._fingerprint_time).
HANDOVER_SLACK_MS = {"cuda": 3.0, "cpu": 40.0}
