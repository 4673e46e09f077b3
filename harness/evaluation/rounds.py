"""The timed rounds of an evaluation, driven from the parent: its own object, given its collaborators. No torch.

Each round opens a window of every kind on the same fresh seeds (the candidate's, eager's, torch.compile's and the
empty one's, in an order drawn for the round), on the parent's clock. After the candidate's window it fingerprints
that window's outputs (what it takes beyond the trusted side's same work is charged to the window) and, where the
parent so draws once the window has closed, hands picked outputs over whole for the trusted side to judge (both
checks: output_checks.py). Then it is paused until its next turn; before and after each reference window the parent
checks that nothing of its ran (its CPU clock; on CUDA, GPU work the trusted side waits out), and a window it
disturbed is timed again. Untimed rounds (the plan's `warmup_rounds`, and more while a kind the windows are sized on
still gets faster) first warm every kind up and size the windows; where the plan names a busy core, a spinner runs
there through all of them (busy_core.py).
The timed rounds end after the plan's fewest once the candidate's ratio to each baseline, paired by round, is known
to the plan's aim (windows.paired_halfwidth), else after its rounds, or, while the ratio is not yet known to the aim
of a ranked result, after as many extra rounds as that takes (the plan's most). Timed windows that were sized down on
the candidate's untimed ones and then ran short count as one more warm-up round: the timed rounds run once more.

`TimedRounds` owns the rounds' bookkeeping, and its `OutputChecks` the checks' (the hand-overs read and left to
compare among them); what they learn goes into the `Observations` it is given. The runner builds it with the handles,
the plan and the deadlines, and drives it: `run`, then `compare_handovers` and `handovers_compared` around the
candidate's trace and exit.
"""

from __future__ import annotations

import math
import random
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness import grading
from harness.evaluation import busy_core, gpu_sharing, windows
from harness.evaluation.eager_process import EagerProcess
from harness.evaluation.handles import Candidate, CandidateStopped, Trusted, TrustedFailed
from harness.evaluation.output_checks import Fingerprints, OutputChecks
from harness.evaluation.protocol import (
    EAGER_WINDOW_SEGMENT,
    WINDOW_SEGMENT,
    FillWindowCommand,
    LeadIn,
    LeadInCommand,
    Pin,
    ReferenceWindowCommand,
    StageWindowCommand,
    Window,
)
from harness.sandbox.pause import PausedMark
from harness.schema import Observations, TimedOutputCheck, Tolerance
from harness.verdicts import Phase

# A reference window the paused candidate disturbed is timed again, up to this many tries in all; then timing stops.
DISTURBED_TRIES = 3
# A warm-up window that took under this share of the time per call of its kind's window before it was still warming
# up: another warm-up round follows (RoundsPlan.settle_rounds at most). Once calls run no more than a fifth faster than
# the window they were sized on, a timed window lasts at least about four fifths of its target, where
# `windows.sized_down` cannot rank one that lasts under half of it.
SETTLED = 0.8
# The trusted side answers a wait for an idle GPU within the wait's own limit; this much more is its reply's slack.
_IDLE_REPLY_SLACK_S = 10.0



@dataclass(frozen=True)
class RoundsPlan:
    """What the rounds are: how many, of which kinds, how long a window should last, on which device."""

    device: str  # cuda | cpu
    rounds: int  # the most timed rounds, after `warmup_rounds`
    kinds: tuple[str, ...]  # candidate, eager, empty, and compile where torch.compile is a baseline
    window_ms: float  # what a window should last
    calls: int  # a window's calls at the reference's speed (windows.calls_per_window), before any is timed
    most_calls: int  # what memory allows (windows.most_calls)
    output_bytes: int  # one call's outputs
    tolerance: Tolerance
    idle_wait_s: float  # on CUDA, how long the trusted side may wait for an idle GPU around a reference window; 0: not
    traced: bool  # one timed window of the candidate's is traced (its launches arrive with it)
    call_overhead_ms: float = 0.0  # what a window costs a call besides the call (its inputs, the flush)
    fixed_cost_factor: float = 0.0  # a window's net work outweighs its round trip this many times (windows.resize)
    # The windows' inputs are made by the trusted side before each window and shared with the candidate through
    # the window segment (where it lives on the evaluation's device), and each window follows a lead-in of about
    # `lead_in_ms` of untimed calls in its own process; else each process makes them inside its windows.
    staged: bool = False
    lead_in_ms: float = 0.0
    # The core both sides' window threads are kept to for the rounds (timing.pin_thread); None: wherever they run.
    core: int | None = None
    # The candidate's processes are held to `core` for the rounds (its cpuset: Candidate.keep_to) and both sides run
    # torch on one thread there: the CPU's timing on one core, where nothing the candidate does reaches another.
    held: bool = False
    # The core kept busy through the rounds (busy_core.py; Settings.busy_core, off by default); None: none.
    busy_core: int | None = None
    # The timed rounds end after `least_rounds` (None: `rounds`, every one) once the candidate's time over each
    # baseline's is known to `known_to` (95%, relative: windows.paired_halfwidth); windows that disagree run on, up to
    # `rounds`. 0: every round. Where after `rounds` it is not yet known to `rank_known_to`, up to `extra_rounds` more
    # run, ending once it is.
    least_rounds: int | None = None
    known_to: float = 0.0
    extra_rounds: int = 0
    rank_known_to: float = 0.0
    # The untimed rounds before them (every kind's windows, the last one's fingerprints let go), each sizing the
    # windows again; then up to `settle_rounds` more, while a kind the windows are sized on still gets faster
    # (`TimedRounds._settled`).
    warmup_rounds: int = 2
    settle_rounds: int = 4
    # Timed windows sized down that lasted under half their target when timed (windows.sized_down) are taken as one
    # more warm-up: the timed rounds run once more, on windows sized on those windows' calls (`TimedRounds._retime`).
    retime: bool = True

    def fewest(self) -> int:
        """The timed rounds an evaluation runs at least."""
        return max(1, min(self.least_rounds or self.rounds, self.rounds))


class TimedRounds:
    """The timed rounds of one evaluation. `deadline(calls, write_bytes)` is a candidate command's time limit over
    `calls` calls writing `write_bytes`; `phase(name)` closes a phase of the evaluation's (`obs.phases`); `seeds`
    draws the windows' seeds (the OS's, unless a run is reproduced); `draw` the rounds' order, the windows handed over
    and their picks (the OS's: the candidate cannot predict them); `gpu_processes` lists the GPUs' compute processes,
    asked whose work a long wait for an idle GPU waited out (gpu_sharing.py)."""

    def __init__(self, plan: RoundsPlan, trusted: Trusted, candidate: Candidate, obs: Observations, *,
                 deadline: Callable[[int, int], float], seeds: random.Random,
                 phase: Callable[[str], None], draw: random.Random | None = None,
                 gpu_processes: gpu_sharing.ComputeProcesses = gpu_sharing.nvml_compute_processes,
                 relay: Callable[[dict[str, Any]], list[dict[str, Any]]] = lambda fields: [],
                 idle_processes: Callable[[], list[int]] = lambda: [], eager: EagerProcess | None = None):
        self.plan, self.trusted, self.candidate, self.obs = plan, trusted, candidate, obs
        # Eager's own process (eager_process.py), which runs eager's windows and the empty one; None: the trusted one.
        self.eager = eager
        self.deadline, self.seeds, self.phase = deadline, seeds, phase
        # Passes the segments a trusted reply names on (their specs): eager's window segment to eager's own process
        # alone, every other to the candidate's.
        self.relay = relay
        self.idle_processes = idle_processes  # the harness's own processes that run nothing now (gpu_sharing.sharing)
        self.staged = plan.staged
        self.sent_layout: list[dict[str, Any]] | None = None  # the window segment's layout as the candidate has it
        self.segments: list[dict[str, Any]] = []  # window segments relayed, not yet named to the candidate
        self.eager_layout: list[dict[str, Any]] | None = None  # and as eager's own process has it, in its own
        self.eager_segments: list[dict[str, Any]] = []
        self.layout: list[dict[str, Any]] | None = None  # where the last staged window's inputs lie
        self.fill_s = 0.0  # how long the candidate last waited, paused, for its window's inputs to be written
        self.draw = draw or secrets.SystemRandom()
        self.gpu_processes = gpu_processes
        self.kinds = list(plan.kinds)
        # The fingerprints and hand-overs of the candidate's windows (output_checks.py).
        self.checks = OutputChecks(trusted, candidate, obs, plan.tolerance, plan.output_bytes, deadline)
        self.handed_before = 0  # outputs asked for before the timed rounds now running (`_retime`)

    def run(self) -> None:
        """The warm-up rounds, then the timed ones; the kinds' timing figures into `obs`. Each window is sized again
        after each warm-up round on the slower of the candidate and eager (a one-call candidate window bounds the
        first: an honest kernel far slower than the reference would overrun windows sized on the reference alone)."""
        with busy_core.BusyCore(self.plan.busy_core) as busy:
            self.obs.busy_core = self.plan.busy_core if busy.kept else None
            self._pin()
            self._rounds()
        if self.plan.core is not None:  # given back its cores (a warm one's next prepare gives them back too)
            self.trusted.call({"cmd": "pin", "cores": None}, "pinned")
        if self.obs.timing_core_held:
            self.candidate.keep_to(None)

    def _pin(self) -> None:
        """Both sides' window threads kept to the plan's core for the rounds, the candidate's continued to be told so
        and paused again: each kind's launches then run on the same core, whatever the host does to the others. What
        each side says of its thread is recorded; a side that cannot be kept there (a core outside its cgroup) is
        said in `obs.timing_core_refused`, and its windows run where they may."""
        core = self.plan.core
        if core is None:
            return
        refused = []
        threads = None
        if self.plan.held:  # every process of the candidate's held to the core, then both sides on one thread
            self.obs.timing_core_held = self.candidate.keep_to([core])
            if self.eager is not None:
                self.obs.timing_core_held &= self.eager.keep_to([core])
            if self.obs.timing_core_held:
                threads = 1
            else:
                refused.append("the candidate's processes could not be held to the core (its cpuset refused)")
        said = {"trusted": self.trusted.call({"cmd": "pin", "cores": [core], "threads": threads}, "pinned")
                .get("cores"),
                "candidate": self.candidate.request(Pin(cores=[core], threads=threads), self.deadline(1, 0),
                                                    Phase.timing).fields.get("cores")}
        self.candidate.pause()
        if self.eager is not None:
            said["eager process"] = self.eager.request(Pin(cores=[core], threads=threads), self.deadline(1, 0)
                                                       ).fields.get("cores")
            self.eager.pause()
        refused += [f"the {side}'s window thread may run on {repr(cores)[:200]}" for side, cores in said.items()
                    if cores != [core]]  # the candidate's words: hostile data, shown bounded
        self.obs.timing_core = core
        self.obs.timing_core_refused = "; ".join(refused) or None

    def _rounds(self) -> None:
        p, obs = self.plan, self.obs
        walls: dict[str, list[float]] = {k: [] for k in self.kinds}
        seen: dict[str, list[dict[str, Any]]] = {k: [] for k in self.kinds}
        check = obs.timed_outputs = TimedOutputCheck(handover_slack_ms=windows.HANDOVER_SLACK_MS[p.device])
        # A window's constant cost, as the parent sees a command's round trip to the trusted process now.
        fixed_ms = windows.round_trip_ms([self.trusted.timed_call({"cmd": "ping"}, "pong")[0] for _ in range(5)])
        one = [self.seeds.randrange(1 << 62) for _ in range(2)]
        one_call_ms, one_said = self._candidate_window(one[:1], one[1:], self.deadline(1, 0))
        self.candidate.pause()  # as after each of its turns: the first round's reference windows may come first
        self.phase("warmup_setup")  # the threads kept to their core, the round trip, the one-call window
        calls = min(p.calls, windows.resize(1, one_call_ms, p.window_ms, p.most_calls, fixed_ms,
                                            factor=p.fixed_cost_factor))
        sized = {"eager": 0, "candidate": 0}  # each kind's calls by its fastest warm-up window so far
        # The hand-overs' chance and the traced round are drawn over the rounds every evaluation runs: none is lost
        # to rounds that end early.
        chance = windows.check_chance(p.fewest(), p.output_bytes)
        traced = self.draw.randrange(p.fewest()) if p.traced else None  # the timed round whose window is traced
        warm = obs.warmup_windows = {kind: [] for kind in self.kinds}
        own = obs.warmup_own_ms = {kind: [] for kind in self.kinds}
        warm["candidate"].append([1, round(one_call_ms, 4)])
        own["candidate"].append(windows.own_clocks(one_said))
        r, warmed = -p.warmup_rounds, 0  # warmed: the warm-up rounds run so far
        while r < 0:  # rounds below 0 warm up: lazy initialisation, autotuning, torch.compile
            # Sized again after each warm-up round (the prepare phase's calls ran cold) and after the last, then
            # fixed: every timed window holds the same calls, the number its time is divided by.
            if warmed:
                calls = self._resized(sized, calls, {kind: walls[kind][-1] for kind in sized}, fixed_ms)
            timed_before = {kind: len(walls[kind]) for kind in walls}
            self._round(r, calls, None, chance, walls, seen, check)
            for kind, n in timed_before.items():  # each kind that timed a window (a torch.compile that failed: none)
                if len(walls[kind]) > n:
                    warm[kind].append([calls, round(walls[kind][-1], 4)])
                    own[kind].append(windows.own_clocks(seen[kind][-1]))
            self.phase("timing_warmup")
            warmed += 1
            r += 1
            if r == 0 and warmed < p.warmup_rounds + p.settle_rounds and not self._settled(warm, fixed_ms):
                r = -1  # one more warm-up round, as the last one (fingerprints let go)
        calls = self._resized(sized, calls, {kind: walls[kind][-1] for kind in sized}, fixed_ms)
        timed = self._timed(0, calls, traced, chance, walls, seen, check)
        # The candidate chose nothing here but may have slowed its untimed windows: windows sized down for it must
        # last about their target when timed, or a faster reply of its own counts for more of each short window.
        # Timed once more on windows sized on its timed calls, they do or the figure is not ranked.
        down = windows.sized_down(calls, sized["eager"], walls["candidate"], p.window_ms, warm["candidate"])
        if down is not None and p.retime:
            obs.windows_retimed = down
            calls = self._retime(timed, calls, sized, walls, seen, check, chance, fixed_ms)
            down = windows.sized_down(calls, sized["eager"], walls["candidate"], p.window_ms, warm["candidate"])
        obs.windows_sized_down = down
        series = {kind: windows.WindowSeries(calls, walls[kind], seen[kind]) for kind in self.kinds}
        # What each window's fingerprints took beyond the trusted side's is work that window left to them: paid there.
        assert check.handover_slack_ms is not None
        series["candidate"].charged_ms = windows.fingerprint_charges(
            check.fingerprint_ms, check.fingerprint_latency_ms, check.reference_fingerprint_own_ms,
            grading.HANDOVER_LATENCY_CREDIT * check.handover_slack_ms)
        # Where eager's own process fingerprints as the candidate's does (on the parent's clock, less the round trip
        # after it), the baselines' windows pay what that honest fingerprint of their round took beyond the median,
        # as the candidate's pay theirs: the same noise on both sides of the ratio. The trusted process's figure is
        # its own clock's step, another measure (on the CPU its noise raised A/A rows by up to 4%): none is charged.
        if self.eager is not None:
            for kind in ("eager", "compile"):
                if kind in series:
                    series[kind].charged_ms = windows.honest_charges(check.reference_fingerprint_own_ms)
        known_to = self._known_to(calls, walls, len(walls["candidate"]))
        obs.timing_known_to = round(known_to, 6) if math.isfinite(known_to) else None
        obs.candidate_timing = windows.stats(series["candidate"], series["empty"])
        obs.eager_timing = windows.stats(series["eager"], series["empty"], series["candidate"])
        if "compile" in self.kinds:
            obs.compile_timing = windows.stats(series["compile"], series["empty"], series["candidate"])

    def _resized(self, sized: dict[str, int], calls: int, window_ms: dict[str, float], fixed_ms: float) -> int:
        """The calls a window holds, sized again on the candidate's and eager's windows of `calls` calls that took
        `window_ms`: each kind's most so far (a busy host only ever adds time), the fewer of the two."""
        p = self.plan
        for kind in sized:
            sized[kind] = max(sized[kind], windows.resize(calls, window_ms[kind], p.window_ms, p.most_calls, fixed_ms,
                                                          p.call_overhead_ms, p.fixed_cost_factor))
        return min(sized.values())

    def _timed(self, base: int, calls: int, traced: int | None, chance: float, walls: dict[str, list[float]],
               seen: dict[str, list[dict[str, Any]]], check: TimedOutputCheck) -> int:
        """Timed rounds, numbered from `base`, on `walls` and `seen` emptied, until `_last_round` says (round `traced`
        has its candidate window traced); how many ran."""
        for kind in self.kinds:
            walls[kind].clear()
            seen[kind].clear()
        r, last = 0, False
        while not last:
            last = self._last_round(r, calls, walls)
            self._round(base + r, calls, traced, chance, walls, seen, check, last)
            self.phase("timed_windows")
            r += 1
        return r

    def _retime(self, base: int, calls: int, sized: dict[str, int], walls: dict[str, list[float]],
                seen: dict[str, list[dict[str, Any]]], check: TimedOutputCheck, chance: float, fixed_ms: float) -> int:
        """The timed rounds once more, after `base` rounds whose windows were sized down and ran short: those count
        as one more warm-up round (each kind's median window kept with the untimed ones), the windows are sized again
        on them as after any warm-up round, and what each window's checks measured of them (their fingerprints'
        times, which charge the windows) is let go; the checks' findings and the hand-overs stay. One of the new
        rounds is traced, its launches replacing the first trace's: credit comes from a window whose time ranks. The
        rounds go on numbering from `base`. On an H100 (464ddf9) level3/27's and 32's untimed candidate windows took
        14-16 ms a call, slow and steady, and their timed ones 2.6 and 5.1 ms: windows of 5 calls where eager's
        speed asked for 23 and 6. Returns the calls the new windows hold."""
        warm, own = self.obs.warmup_windows, self.obs.warmup_own_ms
        for kind in self.kinds:
            if walls[kind]:
                warm[kind].append([calls, round(statistics.median(walls[kind]), 4)])
                own[kind].append(windows.own_clocks(seen[kind][-1]))
        calls = self._resized(sized, calls, {kind: statistics.median(walls[kind]) for kind in sized}, fixed_ms)
        for figures in (check.fingerprint_ms, check.fingerprint_latency_ms, check.reference_fingerprint_ms,
                        check.reference_fingerprint_own_ms):
            figures.clear()
        self.handed_before = check.expected  # a hand-over of these rounds' own is made in their last, if none was
        traced = base + self.draw.randrange(self.plan.fewest()) if self.plan.traced else None  # the first's replaced
        self._timed(base, calls, traced, chance, walls, seen, check)
        return calls

    @staticmethod
    def _settled(warm: dict[str, list[list[float]]], fixed_ms: float) -> bool:
        """Whether the windows' sizes can be fixed: the last untimed window of each kind they are sized on (the
        candidate's, eager's) took at least SETTLED of the time per call of the one before it, its round trip
        `fixed_ms` taken off each. One that was faster still warms up: on an H100 (464ddf9) the candidate's last
        untimed windows of level3/4, 8, 19, 23 and 28, A/A copies, each faster a call than the one before, took
        4.5-17 ms a call where its timed ones took 0.9-3.0 ms, and windows sized on them held 3-5 times fewer calls
        than eager's speed asked for (marked, not ranked). A busy host only slows a window, which never asks for
        another round."""
        def per_call(window: list[float]) -> float:
            return windows.warm_per_call_ms(window[0], window[1], fixed_ms)

        return all(per_call(seen[-1]) >= SETTLED * per_call(seen[-2])
                   for kind, seen in warm.items() if kind in ("candidate", "eager") and len(seen) >= 2)

    def _last_round(self, r: int, calls: int, walls: dict[str, list[float]]) -> bool:
        """Whether timed round `r` is the last: one of at least the plan's fewest where the windows so far say that
        with this round the candidate's time over each baseline's is known to the plan's aim; else its `rounds`th,
        where it is known to the aim of a ranked result (`rank_known_to`) or no extra round is left. Decided before
        the round, so that it is a round like any other (its hand-over, where none was drawn, is made there)."""
        p = self.plan
        if r >= p.rounds + p.extra_rounds - 1:
            return True
        if r >= p.rounds - 1:
            return p.extra_rounds <= 0 or self._known_to(calls, walls, r + 1) <= p.rank_known_to
        if p.known_to <= 0 or r + 1 < p.fewest() or r < 2:
            return False
        return self._known_to(calls, walls, r + 1) <= p.known_to

    def _known_to(self, calls: int, walls: dict[str, list[float]], n: int) -> float:
        """What the candidate's speedup over each baseline, paired by round, is known to with `n` rounds of the spread
        the timed rounds so far show (the wider of eager's and torch.compile's; windows.paired_halfwidth), their times
        per call less the empty window's."""
        if not walls["candidate"] or not walls["empty"]:
            return math.inf
        empty = statistics.median(walls["empty"])
        per_call = {kind: windows.WindowSeries(calls, walls[kind]).per_call_ms(empty) for kind in self.kinds}
        return max(windows.paired_halfwidth(per_call[kind], per_call["candidate"], n)
                   for kind in ("eager", "compile") if kind in self.kinds)

    def _round(self, r: int, calls: int, traced: int | None, chance: float, walls: dict[str, list[float]],
               seen: dict[str, list[dict[str, Any]]], check: TimedOutputCheck, last: bool = False) -> None:
        """Round `r`: every kind's window on the same fresh seeds, in a drawn order; in a timed round, the candidate's
        fingerprints (and perhaps a hand-over: in the `last` round, where none was drawn before) and eager's,
        compared. The last warm-up round fingerprints both too, its figures let go: a process's first fingerprint
        pays for its kernels' first loads (on an H200 the candidate's first timed window was charged 30-83 ms in every
        row of level 3, level 2 and level 1 run at 52439f4, its others 0-1.3 ms), a cost of the harness's, not of
        the window's."""
        window_limit = self.deadline(calls, 0)
        seeds = [self.seeds.randrange(1 << 62) for _ in range(calls)]
        forward = [self.seeds.randrange(1 << 62) for _ in range(calls)]
        key = self.seeds.randrange(1 << 62)  # the fingerprints': the candidate's once its window closed
        fingerprinted = r >= -1
        figures = check if r >= 0 else TimedOutputCheck(handover_slack_ms=check.handover_slack_ms)  # -1's: let go
        got: Fingerprints = []
        reference: tuple[Fingerprints, Fingerprints] = ([], [])

        def phase(name: str) -> None:  # the rounds' time, split: the windows, and the checks between them; a warm-up
            # round's under warmup_<name> (its windows: warmup_windows), what is left of it under timing_warmup
            self.phase(name if r >= 0 else "warmup_windows" if name == "timed_windows" else f"warmup_{name}")

        for kind in self.draw.sample(self.kinds, len(self.kinds)):
            if kind == "candidate":
                if self.eager is not None:  # as eager's windows follow the wait for an idle GPU (`_probe`)
                    self._probe()
                staged = self._stage(seeds) and self._candidate_lead_in(calls)
                if staged:
                    phase("lead_ins")
                else:
                    self._wake_candidate()
                    phase("wakes")
                if r == traced:
                    self.candidate.begin_trace(r)
                ms, said = self._candidate_window(seeds, forward, window_limit, trace=r == traced, staged=staged)
                phase("timed_windows")
                if fingerprinted:  # right after the window, so that what it left undone is done on the parent's clock
                    got = self.checks.candidate_fingerprints(key, window_limit, figures)
                    phase("fingerprints")
                    # Whether this window is handed over is drawn only now that it has closed (the last, if none was).
                    if r >= 0 and (self.draw.random() < chance or (last and check.expected == self.handed_before)):
                        picks = sorted(self.draw.sample(range(calls), min(windows.PICKS_PER_WINDOW, calls)))
                        self.checks.handover(r, seeds, forward, picks, check)
                        phase("handovers")
                self.candidate.pause()  # its turn is over: nothing of its runs beside the trusted side's
                phase("pauses")
            else:
                self.wait_idle()
                phase("idle_waits")
                staged = self._stage(seeds)
                if staged:
                    self._reference_lead_in(kind, calls)
                    phase("lead_ins")
                timed = self.reference_window(kind, seeds, forward, keep_outputs=kind == "eager" and fingerprinted,
                                              r=r, staged=staged)
                phase("timed_windows")
                if timed is None:  # torch.compile failed: no compile baseline (obs says why)
                    self.kinds.remove(kind)
                    continue
                ms, said = timed
                if kind == "eager" and fingerprinted:
                    reference = self.checks.trusted_fingerprints(key, figures) if self.eager is None else \
                        self.checks.eager_fingerprints(self.eager, key, window_limit, figures)
                    phase("fingerprints")
                elif self.eager is not None and kind in ("eager", "empty"):
                    self.eager.pause()  # as the candidate is after its turn (`eager_fingerprints` pauses it too)
                    phase("pauses")
            walls[kind].append(ms)
            seen[kind].append(said)
        if r >= 0:
            check.fingerprinted += sum(len(row) for row in reference[0])
            check.fingerprint_mismatches += windows.fingerprint_mismatches(r, calls, got, *reference)
            deviation, terms = windows.fingerprint_deviation(got, *reference)
            check.fingerprint_deviation += deviation
            check.fingerprint_terms += terms

    def _candidate_window(self, seeds: list[int], forward_seeds: list[int], limit_s: float, trace: bool = False,
                          staged: bool = False) -> tuple[float, dict[str, Any]]:
        """A window of the candidate's: ms on the parent's clock, and what its process said of it (a claim). With
        `trace`, the kernels it launched come with it (`Candidate.begin_trace`). With `staged`, its inputs wait in
        the window segment (filled while it was paused): the clock starts before it is continued."""
        command = Window(seeds=[] if staged else seeds, forward_seeds=forward_seeds, trace=trace, staged=staged)
        reply = self.candidate.request(command, limit_s, Phase.timing, clock_from_resume=staged)
        return (reply.received_at - self.candidate.sent_at) * 1e3, reply.fields

    def _stage(self, seeds: list[int]) -> bool:
        """Where windows are staged: the trusted side makes a window's inputs from `seeds` now, before the window and
        off its clock (for each kind's window anew: a reference that writes into its inputs leaves them changed).
        False where they cannot be (an input the window segment cannot hold as it is): from then on every process
        makes its own inside its windows, as without staging."""
        if not self.staged:
            return False
        reply = self.trusted.call(StageWindowCommand(seeds=seeds, eager=self.eager is not None)
                                  .model_dump(mode="json"), "window_staged")
        for spec in self.relay(reply):
            if spec["name"] == EAGER_WINDOW_SEGMENT:  # eager's process maps it as its window segment
                self.eager_segments.append({**spec, "name": WINDOW_SEGMENT})
            else:
                self.segments.append(spec)
        if not reply["stageable"]:
            self.staged = False
            self.obs.windows_unstaged = "an input is no plain dense tensor or JSON scalar: each window made its own"
            return False
        self.layout = list(reply["layout"])
        return True

    def _wake_candidate(self) -> None:
        """Before a window whose process makes its own inputs, off the clock: the paused candidate continued, and on
        CUDA its GPU context made the one the device last ran (`timing.touch`), as the trusted side's idle probe makes
        its own right before each reference window (`wait_idle`); its window then starts, as the trusted side's
        does, in a process that is running. Without it the candidate's one-call windows of level1/19, 43, 47 and 48
        on an H100 came out 0.92x-0.94x in an A/A with equal CUDA-event times per call: its first kernels waited on
        the GPU's switch from the trusted side's context. On every device the wake is also where the candidate lets
        its last window's outputs go (child `lead_in`): on the 2-core CPU VM, let go at the start of its next window
        instead, they put its round trip over 1 ms (up to 3.3) in 11 of 30 A/A runs, where the trusted side's was
        0.32-0.50 ms (README, "Timing on the CPU")."""
        self.candidate.request(LeadIn(calls=0), self.deadline(1, 0), Phase.timing)

    def _lead_calls(self, calls: int) -> int:
        """A lead-in's calls: about `lead_in_ms` at the windows' pace (`window_ms` over `calls`), one at least."""
        p = self.plan
        return min(calls, max(1, math.ceil(calls * p.lead_in_ms / p.window_ms))) if p.lead_in_ms > 0 else 0

    def _candidate_lead_in(self, calls: int) -> bool:
        """The candidate's lead-in (on the inputs of its last window), then, paused, its window's inputs written
        into the window segment by the trusted side: it sees them only once its window's clock runs."""
        layout = None if self.layout == self.sent_layout else self.layout
        lead = self._lead_calls(calls)
        self.candidate.request(LeadIn(calls=lead, layout=layout, segments=self.segments),
                               self.deadline(lead, 0), Phase.timing)
        self.segments, self.sent_layout = [], self.layout
        self.candidate.pause()
        fill_ms, _ = self.trusted.timed_call(FillWindowCommand().model_dump(mode="json"), "window_filled")
        self.fill_s = fill_ms / 1e3
        return True

    def _reference_lead_in(self, kind: str, calls: int) -> None:
        """A reference window starts as the candidate's does. In eager's own process (its windows and the empty one):
        its lead-in (on the inputs its last window saw), then, paused, its window's inputs written into its own window
        segment by the trusted side, continued on the window's clock: the candidate's steps, in a process started as
        the candidate's. That segment is never the candidate's: one both mapped still held a round's inputs, written
        for eager's window, when the candidate's lead-in of the same round ran. In the trusted process: its lead-in,
        paused for as long as the candidate last waited for its inputs, continued on the window's clock (the empty
        window's too: what that costs is then the fixed cost taken off every kind's)."""
        if self.eager is not None and kind in ("eager", "empty"):
            layout = None if self.layout == self.eager_layout else self.layout
            lead = self._lead_calls(calls)
            self.eager.request(LeadIn(calls=lead, layout=layout, segments=self.eager_segments), self.deadline(lead, 0))
            self.eager_segments, self.eager_layout = [], self.layout
            self.eager.pause()
            self.trusted.timed_call(FillWindowCommand(segment=EAGER_WINDOW_SEGMENT).model_dump(mode="json"),
                                    "window_filled")
            return
        self.trusted.call(LeadInCommand(kind=kind, calls=self._lead_calls(calls)).model_dump(mode="json"), "led_in")
        method = self.trusted.pause()
        if method is not None:
            self.obs.trusted_pause_method = method
            time.sleep(self.fill_s)

    def _probe(self) -> None:
        """On CUDA, the trusted side's idle probe once, nothing waited for or observed: where eager's windows run in
        a process of their own, each of its windows follows the trusted side's wait for an idle GPU and then its wake,
        and each of the candidate's the same probe and then its wake. Over eight level-3 A/A rows on an H200 without
        it, the two processes' CUDA-event times agreed (median 0.99) and their windows' medians too (0.97-1.10, median
        1.00), while the speedup paired by round came out at 0.968x-1.007x, median 0.978x: something in the round
        itself favoured eager's window. The probe right before it was the one step of the round's that its window had
        and the candidate's did not; whether it was the cause is not yet measured."""
        if self.plan.device == "cuda":
            self.trusted.call({"cmd": "wait_idle", "limit_s": 0.0}, "idle", _IDLE_REPLY_SLACK_S)

    def wait_idle(self) -> dict[str, Any] | None:
        """On CUDA, around a reference window: the trusted side waits out GPU work of another process's (what the
        candidate, paused since its turn, left running), off the window's clock; how long is observed and returned,
        with `shared` set where the wait was long and the work may not be the candidate's. None where nothing is
        waited for: on the CPU, and with the wait off, where the trusted side still probes the GPU once (not waiting,
        nothing observed), so that its window starts as the candidate's does after its wake (`_wake_candidate`)."""
        limit_s = self.plan.idle_wait_s
        if self.plan.device != "cuda":
            return None
        if not limit_s:
            self.trusted.call({"cmd": "wait_idle", "limit_s": 0.0}, "idle", _IDLE_REPLY_SLACK_S)
            return None
        idle = self.trusted.call({"cmd": "wait_idle", "limit_s": limit_s}, "idle", limit_s + _IDLE_REPLY_SLACK_S)
        waited, busy = float(idle["waited_ms"]), bool(idle["busy"])
        idle["shared"] = (busy or waited > grading.LEFTOVER_GPU_MS) and self._shared_gpu()
        if idle["shared"]:  # whose work it was cannot be told: never the candidate's (gpu_sharing.py)
            self.obs.gpu_shared_waits_ms.append(waited)
            self.obs.gpu_shared_busy += busy
        else:  # the candidate's, where long (grading._leftover_gpu_work)
            self.obs.gpu_idle_waits_ms.append(waited)
            self.obs.gpu_busy_windows += busy
        return idle

    def _shared_gpu(self) -> bool:
        """Whether processes other than the trusted side's and the candidate's compute on the evaluation's GPU now,
        or whether that cannot be told; what was seen goes into `obs`."""
        own = self.trusted.processes() + (self.eager.processes() if self.eager is not None else [])
        seen = gpu_sharing.ask(self.gpu_processes, own, self.candidate.processes(), self.idle_processes())
        self.obs.gpu_sharers = sorted({*self.obs.gpu_sharers, *seen.others})[:32]
        self.obs.gpu_unattributed = self.obs.gpu_unattributed or seen.unknown
        return seen.shared

    def reference_window(self, kind: str, seeds: list[int], forward_seeds: list[int], keep_outputs: bool = False,
                         r: int = 0, staged: bool = False) -> tuple[float, dict[str, Any]] | None:
        """A window of the trusted side's: ms on the parent's clock, and what the trusted process saw of it; None
        when torch.compile cannot compile. With `keep_outputs`, kept for the next fingerprint. One the paused
        candidate disturbed (`_disturbance`) is timed again, and said in `obs.ran_while_paused`; one that other
        processes' GPU work may have disturbed is timed again too, and where every try was, the last is kept (the result
        is marked shared_gpu, not ranked)."""
        command = ReferenceWindowCommand(kind=kind, seeds=seeds, forward_seeds=forward_seeds,
                                         keep_outputs=keep_outputs, staged=staged).model_dump(mode="json")
        eager = self.eager if kind in ("eager", "empty") else None

        def timed_call() -> tuple[float, dict[str, Any]]:
            if eager is None:
                return self.trusted.timed_call(command, "window_done")
            limit_s = self.deadline(len(seeds), 0)
            if staged:  # led in and paused, its inputs written (`_reference_lead_in`): continued on the clock
                reply = eager.request(Window(seeds=[], forward_seeds=forward_seeds, empty=kind == "empty",
                                             staged=True), limit_s, clock_from_resume=True)
            else:  # woken, off the clock, as the candidate is before its window (`_wake_candidate`), then its window
                eager.request(LeadIn(calls=0), self.deadline(1, 0))
                reply = eager.request(Window(seeds=seeds, forward_seeds=forward_seeds, empty=kind == "empty"),
                                      limit_s)
            return (reply.received_at - eager.sent_at) * 1e3, reply.fields

        window = f"the {kind} window of {'warm-up ' if r < 0 else ''}round {r}"
        candidates = 0  # tries the candidate disturbed
        for attempt in range(DISTURBED_TRIES):
            if attempt:
                self.wait_idle()
                if staged:  # as the first try had them (a reference may have written into its inputs)
                    self._stage(seeds)
                    if eager is not None:
                        self._reference_lead_in(kind, len(seeds))
            mark = self.candidate.cpu_mark()
            try:
                timed = timed_call()
            except TrustedFailed as e:
                if kind != "compile":
                    raise
                self.obs.compile_baseline_error = str(e).strip().splitlines()[-1][:2000]
                return None
            disturbed, shared = self._disturbance(window, mark)
            if disturbed is None and not shared:
                return timed
            if disturbed is not None:
                candidates += 1
                self.obs.ran_while_paused.append(disturbed)
        if not candidates:
            return timed
        self.obs.ran_while_paused.append(f"{window} was disturbed {DISTURBED_TRIES} times: timing stopped")
        self.obs.paused_timing_stopped = True
        raise CandidateStopped

    def _disturbance(self, window: str, mark: PausedMark | None) -> tuple[str | None, bool]:
        """What the paused candidate did during a reference window just timed, if anything: CPU time its cgroup (or
        its threads) counted, or, on CUDA, GPU work of another process's that the trusted side waits out after it (as
        `wait_idle` did before it). Beside it, whether GPU work that may be other processes' ran after it (no line:
        not the candidate's doing)."""
        used = self.candidate.cpu_used_us(mark)
        if used and mark is not None:
            self.obs.paused_cpu_windows += 1
            return (f"{window}: the candidate's processes used {used} µs of CPU while paused "
                    f"({self.obs.pause_method}): {self.candidate.cpu_users(mark, used)}"), False
        # GPU work queued by the candidate before its pause runs on regardless: counted as the waits before a window
        # are (grading._leftover_gpu_work names it), and the window is timed again.
        idle = self.wait_idle()
        if idle is None or not (idle["busy"] or float(idle["waited_ms"]) > grading.LEFTOVER_GPU_MS):
            return None, False
        if idle["shared"]:
            return None, True
        return (f"{window}: another process's GPU work ran after it (the trusted side waited "
                f"{float(idle['waited_ms']):.4g} ms for an idle GPU{', busy still' if idle['busy'] else ''})"), False

    def compare_handovers(self) -> None:
        """The hand-overs left to compare, compared by the trusted side from now on (OutputChecks.compare)."""
        self.checks.compare()

    def handovers_compared(self) -> bool:
        """Their comparison recorded; False where none was under way (OutputChecks.compared)."""
        return self.checks.compared()

    def settle(self) -> None:
        """At the evaluation's end, cut short: the comparison under way let finish (OutputChecks.settle)."""
        self.checks.settle()
