"""The timed rounds in this process: a fake trusted side and a fake candidate answer the rounds' commands, so the
rounds' bookkeeping (sizing, fingerprints, hand-overs, the waits and checks around reference windows) is tested
without two processes."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import grading
from harness.evaluation import busy_core, windows
from harness.evaluation.gpu_sharing import NvmlUnavailable
from harness.evaluation.handles import CandidateStopped, TrustedFailed
from harness.evaluation.rounds import DISTURBED_TRIES, RoundsPlan, TimedRounds
from harness.sandbox.process import Message
from harness.schema import Observations, Tolerance
from tests.test_integrity_grading import _passing

TOL = Tolerance(atol=1e-4, rtol=1e-4)
TRUSTED_PID, CANDIDATE_PIDS, OTHER_PID = 1000, [2000, 2001], 3000
FIGURES = {"index": 0, "got_type": "Tensor", "expected_shape": [2], "expected_dtype": "float32", "max_abs_err": 0.0}


def _sums(seeds: list[int]) -> list[list[float | None]]:
    """What both sides' fingerprints of honest outputs come to: one number per call, from its seed."""
    return [[float(s % 1000)] for s in seeds]


class FakeTrusted:
    """The trusted side: each reference window lasts `call_ms` a call (an empty one 1 ms), on the parent's clock.
    `idle` are its answers to waits for an idle GPU, in order (idle at once when they run out); `compile_fails`
    makes torch.compile's window fail."""

    def __init__(self, call_ms: float = 10.0, idle: list[dict[str, Any]] | None = None, compile_fails: bool = False,
                 stageable: bool = True):
        self.call_ms, self.idle, self.compile_fails = call_ms, list(idle or []), compile_fails
        self.commands: list[str] = []
        self.stageable = stageable
        self.staged: list[int] = []  # the seeds of the inputs staged last
        self.segment: list[int] = []  # what the window segment holds: the seeds of the inputs filled last
        self.eager_segment: list[int] = []  # and eager's own process's window segment
        self.events: list[str] = []  # both sides' commands in order, where a test hands both the same list
        self.segment_bytes = 0
        self.lead_in_calls: list[int] = []  # each lead-in's calls, in order
        self.eager_seeds: list[int] = []
        self.deferred = 0
        self.pending: str | None = None
        self.pins: list[list[int] | None] = []  # the cores of each pin command, in order (None: its own again)
        self.pin_threads: list[int | None] = []  # the threads each pin command asked for
        self.host = [1.0]  # how much slower the host runs every window now (a test may share it with the candidate)

    def timed_call(self, command: dict[str, Any], reply: str, timeout_s: float | None = None
                   ) -> tuple[float, dict[str, Any]]:
        self.commands.append(command["cmd"] if command["cmd"] != "window" else command["kind"])
        if command["cmd"] == "ping":
            return 0.2, {}
        if command["cmd"] == "fingerprint":
            return 0.5, {"sums": _sums(self.eager_seeds), "scales": [[1.0]] * len(self.eager_seeds),
                         "seconds": {"fingerprint": 0.0003}}
        if command["cmd"] == "fill_window":
            if command.get("segment", "window") == "eager_window":
                self.events.append("trusted fill_window (eager's)")
                self.eager_segment = list(self.staged)
            else:
                self.events.append("trusted fill_window")
                self.segment = list(self.staged)
            return 0.3, {}
        assert command["cmd"] == "window"
        if command["kind"] == "compile" and self.compile_fails:
            raise TrustedFailed("Traceback ...\nInductorError: no compiler")
        if command["kind"] == "eager":
            self.eager_seeds = list(command["seeds"])
        if command["staged"]:
            assert self.staged == command["seeds"]  # its own inputs, staged for this window
        per_call = 0.0 if command["kind"] == "empty" else self.call_ms * self.host[0]
        return 1.0 + per_call * len(command["seeds"]), {"host_ms": 1.0}

    def processes(self) -> list[int]:
        return [TRUSTED_PID]

    def pause(self) -> str | None:
        self.events.append("trusted paused")
        return "cgroup_freeze"

    def call(self, command: dict[str, Any], reply: str, timeout_s: float | None = None) -> dict[str, Any]:
        self.commands.append(command["cmd"])
        self.events.append(f"trusted {command['cmd']}")
        if command["cmd"] == "stage_window":
            if not self.stageable:
                return {"layout": [], "segments": [], "stageable": False}
            self.staged = list(command["seeds"])
            grown = len(self.staged) > self.segment_bytes
            self.segment_bytes = max(self.segment_bytes, len(self.staged))
            layout = [{"kind": "list", "entries": [{"tensor": {"dtype": "float32", "shape": [2], "offset": 512 * j}}]}
                      for j in range(len(self.staged))]
            names = ["window", "eager_window"] if command.get("eager") else ["window"]
            return {"layout": layout, "segments": [{"name": name, "nbytes": 512 * len(self.staged)} for name in names]
                    if grown else [], "stageable": True}
        if command["cmd"] == "lead_in":
            self.lead_in_calls.append(command["calls"])
            return {}
        if command["cmd"] == "wait_idle":
            return self.idle.pop(0) if self.idle else {"waited_ms": 0.06, "busy": False}
        if command["cmd"] == "pin":
            self.pins.append(command["cores"])
            self.pin_threads.append(command.get("threads"))
            return {"cores": command["cores"] or [0, 1, 2, 3]}
        assert command["cmd"] == "check_handover"
        if command["defer"]:
            self.deferred += len(command["layouts"])
            return {"checks": [], "seconds": {"read": 0.001}}
        return {"checks": [{"outputs": [FIGURES]} for _ in command["layouts"]], "seconds": {"judge": 0.001}}

    def send(self, command: dict[str, Any], timeout_s: float | None = None) -> None:
        self.commands.append(command["cmd"])
        self.pending = command["cmd"]

    def wait(self, reply: str, final: bool = True) -> Message:
        assert self.pending == "judge_handovers" and reply == "handovers_checked"
        self.pending = None
        checks = [{"outputs": [FIGURES]} for _ in range(self.deferred)]
        return Message("handovers_checked", {"checks": checks, "seconds": {"judge": 0.002}}, 0.0)


class FakeCandidate:
    """The candidate: its windows last `call_ms` a call; its fingerprints are honest unless `off_by`; it hands over
    the outputs picked; `cpu_used` is what its CPU clock moves during each reference window (0 when they run out)."""

    def __init__(self, outputs: Path, call_ms: float = 5.0, off_by: float = 0.0, cpu_used: list[int] | None = None,
                 jitter: float = 0.0):
        self.outputs, self.call_ms, self.off_by, self.cpu_used = outputs, call_ms, off_by, list(cpu_used or [])
        self.jitter = jitter  # each window's calls take up to this fraction more or less, drawn
        self.noise = random.Random(5)
        self.sent_at = 100.0
        self.windows: list[int] = []  # calls of each window
        self.pauses = 0
        self.traced: list[int] = []
        self.last_seeds: list[int] = []
        self.events: list[str] = []
        self.lead_ins: list[Any] = []
        self.seen_in_lead_ins: list[list[int]] = []  # what its window segment held at each lead-in
        self.window_inputs: list[list[int]] = []  # what each window computed on
        self.segment: Callable[[], list[int]] = lambda: []
        self.cores = [0, 1, 2, 3]  # the cores its thread may be kept to
        self.first_fingerprint_s = 0.0  # what its process's first fingerprint takes beyond the others (first loads)
        self.holdable = True  # its cpuset takes `keep_to`
        self.held: list[list[int] | None] = []  # what `keep_to` was given, in order
        self.threads: list[int | None] = []  # the threads each pin asked of it
        self.host = [1.0]  # how much slower the host runs every window now (FakeTrusted.host)

    def request(self, command: Any, limit_s: float, phase: Any, clock_from_resume: bool = False) -> Message:
        self.events.append(f"candidate {command.cmd}" + (" (clock from resume)" if clock_from_resume else ""))
        if command.cmd == "lead_in":
            self.lead_ins.append(command)
            self.seen_in_lead_ins.append(list(self.segment()))  # what its lead-in could read of its window segment
            return Message("led_in", {}, self.sent_at + 0.01)
        if command.cmd == "pin":  # a candidate whose cgroup holds other cores is kept to those
            self.threads.append(command.threads)
            return Message("pinned", {"cores": [c for c in command.cores if c in self.cores] or self.cores},
                           self.sent_at + 0.001)
        if command.cmd == "window":
            self.windows.append(len(command.forward_seeds))
            # Staged: its inputs are what the window segment holds (the fake trusted side's, given it by the test).
            self.last_seeds = list(self.segment()) if command.staged else list(command.seeds)
            self.window_inputs.append(self.last_seeds)
            assert len(self.last_seeds) == len(command.forward_seeds)
            call_ms = self.call_ms * self.host[0] * (1.0 + self.jitter * self.noise.uniform(-1.0, 1.0))
            return Message("window_done", {"host_ms": 1.0},
                           self.sent_at + (1.0 + call_ms * len(command.forward_seeds)) / 1e3)
        if command.cmd == "fingerprint":
            sums = [[s + self.off_by for s in row] for row in _sums(self.last_seeds)]  # type: ignore[operator]
            first, self.first_fingerprint_s = self.first_fingerprint_s, 0.0
            return Message("fingerprinted", {"sums": sums}, self.sent_at + 0.0008 + first)
        assert command.cmd == "handover"
        layouts = [{"kind": "tensor", "entries": [], "device": "cpu"} for _ in command.picks]
        return Message("handed_over", {"layouts": layouts}, self.sent_at + 0.002)

    def keep_to(self, cores: list[int] | None) -> bool:
        self.events.append(f"candidate held to {cores}")
        self.held.append(cores)
        return self.holdable

    def pause(self) -> None:
        self.pauses += 1
        self.events.append("candidate paused")

    def processes(self) -> list[int]:
        return CANDIDATE_PIDS

    def cpu_mark(self) -> int:
        return 0

    def cpu_used_us(self, mark: int | None) -> int:
        return self.cpu_used.pop(0) if self.cpu_used else 0

    def cpu_users(self, mark: int, used_us: int) -> str:
        return f"'python3' (tid 7) {used_us} µs"

    def begin_trace(self, window: int) -> None:
        self.traced.append(window)


def _rounds(tmp_path: Path, trusted: FakeTrusted, candidate: FakeCandidate, *, device: str = "cpu", rounds: int = 5,
            kinds: tuple[str, ...] = ("candidate", "eager", "empty"), idle_wait_s: float = 0.0,
            traced: bool = False, gpu_processes: Callable[[], list[list[int]]] | None = None, staged: bool = False,
            core: int | None = None, least_rounds: int | None = None, known_to: float = 0.0,
            busy_core: int | None = None, held: bool = False, warmup_rounds: int = 2, extra_rounds: int = 0,
            rank_known_to: float = 0.0) -> tuple[TimedRounds, list[str]]:
    phases: list[str] = []
    plan = RoundsPlan(device=device, rounds=rounds, kinds=kinds, window_ms=100.0, calls=10, most_calls=64,
                      output_bytes=1024, tolerance=TOL, idle_wait_s=idle_wait_s, traced=traced, staged=staged,
                      lead_in_ms=20.0 if staged else 0.0, core=core, least_rounds=least_rounds, known_to=known_to,
                      busy_core=busy_core, held=held, warmup_rounds=warmup_rounds, extra_rounds=extra_rounds,
                      rank_known_to=rank_known_to)
    candidate.events = trusted.events  # one list: the order of both sides' commands
    candidate.segment = lambda: trusted.segment
    r = TimedRounds(plan, trusted, candidate, Observations(pause_method="cgroup_freeze"),  # type: ignore[arg-type]
                    deadline=lambda calls, write_bytes: 10.0, seeds=random.Random(7),
                    phase=phases.append, draw=random.Random(11),
                    gpu_processes=gpu_processes or (lambda: [[TRUSTED_PID, *CANDIDATE_PIDS]]),
                    relay=lambda fields: list(fields.get("segments") or []))
    return r, phases


def test_honest_rounds_time_every_kind_on_windows_sized_on_the_slower_of_candidate_and_eager(tmp_path):
    """Eager takes 10 ms a call, the candidate 5: after the one-call window and the warm-up rounds, every window holds
    the calls eager's speed gives a 100 ms window (10), each timed round's figures are kept, and the candidate's time
    per call is its window less the empty one's, plus what its fingerprint took beyond the trusted side's, over the
    calls."""
    trusted, candidate = FakeTrusted(call_ms=10.0), FakeCandidate(tmp_path / "outputs", call_ms=5.0)
    rounds, phases = _rounds(tmp_path, trusted, candidate)
    rounds.run()
    obs = rounds.obs
    assert candidate.windows[0] == 1 and set(candidate.windows[1:]) == {10}
    assert len(candidate.windows) == 1 + 2 + 5
    assert obs.candidate_timing is not None and obs.eager_timing is not None and obs.compile_timing is None
    assert obs.candidate_timing.n == obs.eager_timing.n == 5 and obs.candidate_timing.calls_per_window == 10
    # Its fingerprint took 0.8 ms, less the round trip (0.2) and the trusted side's own fingerprint (0.3): charged.
    assert obs.candidate_timing.median_ms == pytest.approx(5.0 + (0.8 - 0.2 - 0.3) / 10)
    assert obs.eager_timing.median_ms == pytest.approx(10.0)
    assert obs.windows_sized_down is None
    assert phases.count("timing_warmup") == 2 and phases.count("timed_windows") >= 5 and "fingerprints" in phases
    # The warm-up's time split as the timed rounds' is, under its own names: its set-up, windows, fingerprints.
    warm = phases[:phases.index("timed_windows")]
    assert warm[0] == "warmup_setup" and {"warmup_windows", "warmup_fingerprints", "warmup_pauses"} <= set(warm)
    assert not {"fingerprints", "pauses"} & set(warm)
    check = obs.timed_outputs
    assert check is not None and not check.fingerprint_mismatches and check.fingerprinted == 5 * 10
    assert check.expected >= 2 and check.reported == check.expected and not check.calls  # read, not compared yet
    rounds.compare_handovers()
    assert trusted.commands[-1] == "judge_handovers" and rounds.checks.comparing
    assert rounds.handovers_compared() and len(check.calls) == check.expected == len(check.checked)
    assert not rounds.handovers_compared()  # collected once


def test_one_warm_up_round_sizes_the_windows_on_it_and_fingerprints_in_it(tmp_path):
    """With one warm-up round (HARNESS_TIMING_WARMUP_ROUNDS=1): the one-call window, one round of every kind sized on
    it, then the timed windows sized on that round's slower kind; the warm-up round fingerprints (its figures let go)
    as the last of two does."""
    trusted, candidate = FakeTrusted(call_ms=10.0), FakeCandidate(tmp_path / "outputs", call_ms=5.0)
    rounds, phases = _rounds(tmp_path, trusted, candidate, warmup_rounds=1)
    rounds.run()
    obs = rounds.obs
    assert len(candidate.windows) == 1 + 1 + 5 and set(candidate.windows[2:]) == {10}
    assert phases.count("timing_warmup") == 1
    assert obs.candidate_timing is not None and obs.candidate_timing.n == 5
    assert obs.candidate_timing.median_ms == pytest.approx(5.0 + (0.8 - 0.2 - 0.3) / 10)
    assert trusted.commands.count("fingerprint") == 6  # the warm-up round's and the five timed rounds'


def test_fingerprints_off_the_references_are_mismatches_and_their_honest_twin_has_none(tmp_path):
    honest, _ = _rounds(tmp_path, FakeTrusted(), FakeCandidate(tmp_path / "a"))
    honest.run()
    forged, _ = _rounds(tmp_path, FakeTrusted(), FakeCandidate(tmp_path / "b", off_by=50.0))
    forged.run()
    assert honest.obs.timed_outputs is not None and not honest.obs.timed_outputs.fingerprint_mismatches
    assert forged.obs.timed_outputs is not None and len(forged.obs.timed_outputs.fingerprint_mismatches) == 5 * 10


def test_a_candidate_slower_than_eager_sizes_the_windows_down_and_says_so_only_when_they_fall_short(tmp_path):
    """A candidate at 50 ms a call sizes windows to 2 calls (eager's speed asks for 10); timed at that speed they last
    the 100 ms aimed at: nothing to say."""
    rounds, _ = _rounds(tmp_path, FakeTrusted(call_ms=10.0), FakeCandidate(tmp_path / "o", call_ms=50.0))
    rounds.run()
    assert rounds.obs.candidate_timing is not None and rounds.obs.candidate_timing.calls_per_window == 2
    assert rounds.obs.windows_sized_down is None


def _slow_until_timed(candidate: FakeCandidate, untimed: int, call_ms: list[float]) -> list[int]:
    """The candidate's calls take `call_ms[0]` in its first `untimed` windows (the one-call window and the warm-up
    rounds), then each next entry for the next window, the last from then on."""
    real, seen = candidate.request, candidate.windows

    def speed(command: Any, *args: Any, **kwargs: Any) -> Message:
        if command.cmd == "window":
            candidate.call_ms = call_ms[max(0, min(len(seen) - untimed + 1, len(call_ms) - 1))]
        return real(command, *args, **kwargs)

    candidate.request = speed  # type: ignore[method-assign]
    return seen


def test_a_candidate_slow_only_while_the_windows_are_sized_is_said_with_the_untimed_windows_it_was_sized_on(tmp_path):
    """Slow (50 ms a call) in its one-call window and both warm-up rounds, fast (5 ms) once timed: the windows are
    sized down to 2 calls where eager asks for 10 and last 11 ms when timed. Without a second timing they are not
    ranked; the reason names the untimed windows that sized them, each kind's kept in the observations (a report
    then says why)."""
    candidate = FakeCandidate(tmp_path / "o", call_ms=50.0)
    rounds, _ = _rounds(tmp_path, FakeTrusted(call_ms=10.0), candidate)
    rounds.plan = dataclasses.replace(rounds.plan, retime=False)
    _slow_until_timed(candidate, 3, [50.0, 5.0])
    rounds.run()
    obs = rounds.obs
    assert obs.candidate_timing is not None and obs.candidate_timing.calls_per_window == 2
    warm = obs.warmup_windows
    assert [c for c, _ in warm["candidate"]] == [1, 2, 2] and warm["candidate"][0][1] == pytest.approx(51.0)
    assert len(warm["eager"]) == len(warm["empty"]) == 2
    assert obs.warmup_own_ms["candidate"] == [[1.0, None]] * 3 and obs.warmup_own_ms["eager"] == [[1.0, None]] * 2
    assert obs.windows_sized_down is not None and obs.windows_retimed is None
    assert "its untimed windows: 1 call in 51 ms, 2 calls in 101 ms, 2 calls in 101 ms" in obs.windows_sized_down


def test_windows_sized_down_that_ran_short_are_timed_again_on_windows_sized_on_their_calls(tmp_path):
    """The same candidate, as level3/27's and 32's on an H100 (untimed windows slow and steady, timed ones 3-6 times
    faster): its first timed rounds count as one more warm-up, the windows are sized again on them (eager's 10 calls)
    and timed once more: ranked, the first timing said in the observations. The checks of both timings stand (every
    output fingerprinted, numbered apart), what charges a window is the second's alone, and the second makes a
    hand-over and a trace of its own (credit from a window whose time ranks)."""
    candidate = FakeCandidate(tmp_path / "o", call_ms=50.0)
    rounds, _ = _rounds(tmp_path, FakeTrusted(call_ms=10.0), candidate, traced=True)
    seen = _slow_until_timed(candidate, 3, [50.0, 5.0])
    rounds.run()
    obs = rounds.obs
    assert obs.windows_sized_down is None and obs.windows_retimed is not None
    assert "windows of 2 calls (eager's speed asks for 10)" in obs.windows_retimed
    assert seen == [1, 2, 2] + [2] * 5 + [10] * 5
    assert obs.candidate_timing is not None and obs.candidate_timing.calls_per_window == 10
    assert obs.candidate_timing.n == 5 and obs.candidate_timing.median_ms == pytest.approx(5.0, rel=0.01)
    assert [c for c, _ in obs.warmup_windows["candidate"]] == [1, 2, 2, 2]
    check = obs.timed_outputs
    assert check is not None and check.fingerprinted == 5 * 2 + 5 * 10 and not check.fingerprint_mismatches
    assert len(check.fingerprint_ms) == len(check.reference_fingerprint_own_ms) == 5
    assert any(n >= 5 * 10 for n in rounds.checks.deferred)  # a hand-over of the second timing's (windows 5-9)
    assert len(candidate.traced) == 2 and candidate.traced[0] < 5 <= candidate.traced[1] < 10
    g = grading.grade(_passing(candidate_timing=obs.candidate_timing, eager_timing=obs.eager_timing,
                               windows_sized_down=obs.windows_sized_down), TOL)
    assert g.flags == [] and g.speedup_vs_eager == pytest.approx(2.0, rel=0.02)


def test_windows_timed_again_that_still_ran_short_are_not_ranked(tmp_path):
    """Faster again in the second timing (20 ms a call in the first, 1 in the second): timed once more at most, the
    figure is not ranked."""
    candidate = FakeCandidate(tmp_path / "o", call_ms=50.0)
    rounds, _ = _rounds(tmp_path, FakeTrusted(call_ms=10.0), candidate)
    seen = _slow_until_timed(candidate, 3, [50.0, 20.0, 20.0, 20.0, 20.0, 20.0, 1.0])
    rounds.run()
    obs = rounds.obs
    assert obs.windows_retimed is not None and obs.windows_sized_down is not None
    assert len(seen) == 3 + 5 + 5


def _warming(candidate: FakeCandidate, per_window_ms: list[float]) -> list[int]:
    """The candidate's windows take `per_window_ms` a call in turn (the last from then on): a process warming up."""
    real = candidate.request

    def warming(command: Any, *args: Any, **kwargs: Any) -> Message:
        if command.cmd == "window":
            candidate.call_ms = per_window_ms[min(len(candidate.windows), len(per_window_ms) - 1)]
        return real(command, *args, **kwargs)

    candidate.request = warming  # type: ignore[method-assign]
    return candidate.windows


def test_a_candidate_still_warming_up_gets_more_untimed_rounds_until_its_calls_settle(tmp_path):
    """The candidate takes 50, 30 and 12 ms a call in its one-call window and the two warm-up rounds, then 5: sized on
    those, its windows would hold 2 calls where eager's speed asks for 10 (as level3/8's did on an H100). Each warm-up
    window faster a call than the one before gets another round, until the last two agree: the timed windows hold
    eager's 10 calls, nothing marked."""
    candidate = FakeCandidate(tmp_path / "o")
    seen = _warming(candidate, [50.0, 30.0, 12.0, 5.0])
    rounds, phases = _rounds(tmp_path, FakeTrusted(call_ms=10.0), candidate)
    rounds.run()
    obs = rounds.obs
    warm = obs.warmup_windows["candidate"]
    assert [round((ms - 1.0) / calls) for calls, ms in warm] == [50, 30, 12, 5, 5]  # two rounds settling
    assert len(obs.warmup_windows["eager"]) == len(obs.warmup_windows["empty"]) == 4
    assert phases.count("timing_warmup") == 4 and len(seen) == 5 + 5
    assert obs.candidate_timing is not None and obs.candidate_timing.calls_per_window == 10
    assert obs.windows_sized_down is None


def test_a_candidate_that_never_settles_gets_the_plans_further_rounds_at_most(tmp_path):
    """Faster in every window: the plan's 2 warm-up rounds and its 4 further ones, then the timed rounds, whatever
    it does; with none allowed (settle_rounds=0) the 2 alone."""
    for settle, untimed in ((4, 1 + 2 + 4), (0, 1 + 2)):
        candidate = FakeCandidate(tmp_path / f"o{settle}")
        seen = _warming(candidate, [60.0 * 0.7 ** k for k in range(20)])
        rounds, _ = _rounds(tmp_path, FakeTrusted(call_ms=10.0), candidate)
        rounds.plan = dataclasses.replace(rounds.plan, settle_rounds=settle, retime=False)
        rounds.run()
        assert len(rounds.obs.warmup_windows["candidate"]) == untimed and len(seen) == untimed + 5


def test_eager_still_warming_up_gets_more_untimed_rounds_too(tmp_path):
    """Eager's first warm-up window slow (80 ms a call), its next at its speed: one more round, since the windows are
    sized on it as well; a kind settled from the start (the candidate) asks for none."""
    trusted = FakeTrusted(call_ms=10.0)
    real = trusted.timed_call
    eager_windows: list[int] = []

    def eager_warming(command: dict[str, Any], *args: Any, **kwargs: Any) -> tuple[float, dict[str, Any]]:
        if command["cmd"] == "window" and command["kind"] == "eager":
            trusted.call_ms = 80.0 if not eager_windows else 10.0
            eager_windows.append(len(command["seeds"]))
        return real(command, *args, **kwargs)

    trusted.timed_call = eager_warming  # type: ignore[method-assign]
    rounds, phases = _rounds(tmp_path, trusted, FakeCandidate(tmp_path / "o", call_ms=5.0))
    rounds.run()
    assert len(rounds.obs.warmup_windows["eager"]) == 3 and phases.count("timing_warmup") == 3
    assert rounds.obs.eager_timing is not None and rounds.obs.eager_timing.calls_per_window == 10

    steady, phases = _rounds(tmp_path, FakeTrusted(call_ms=10.0), FakeCandidate(tmp_path / "p", call_ms=5.0))
    steady.run()
    assert phases.count("timing_warmup") == 2


def test_a_compile_baseline_that_cannot_compile_is_dropped_and_said(tmp_path):
    rounds, _ = _rounds(tmp_path, FakeTrusted(compile_fails=True), FakeCandidate(tmp_path / "o"),
                        kinds=("candidate", "eager", "empty", "compile"))
    rounds.run()
    assert rounds.obs.compile_timing is None and rounds.obs.compile_baseline_error == "InductorError: no compiler"
    assert rounds.obs.candidate_timing is not None and rounds.obs.candidate_timing.n == 5


def test_the_traced_round_is_one_timed_round_and_only_where_traced(tmp_path):
    candidate = FakeCandidate(tmp_path / "o")
    _rounds(tmp_path, FakeTrusted(), candidate, traced=True)[0].run()
    assert len(candidate.traced) == 1 and 0 <= candidate.traced[0] < 5
    untraced = FakeCandidate(tmp_path / "p")
    _rounds(tmp_path, FakeTrusted(), untraced)[0].run()
    assert untraced.traced == []


def test_windows_that_agree_end_the_rounds_at_the_fewest_with_their_trace_and_a_hand_over(tmp_path):
    """Windows of a steady candidate and eager know their ratio at once: after the fewest rounds (3 of the most 12)
    the rounds end, the traced window and at least one hand-over among them, whatever the draws."""
    for seed in range(6):
        candidate = FakeCandidate(tmp_path / f"o{seed}")
        rounds, _ = _rounds(tmp_path, FakeTrusted(), candidate, rounds=12, traced=True, least_rounds=3,
                            known_to=0.01)
        rounds.draw = random.Random(seed)
        rounds.run()
        obs = rounds.obs
        assert obs.candidate_timing is not None and obs.candidate_timing.n == 3
        assert len(candidate.windows) == 1 + 2 + 3 and len(candidate.traced) == 1 and 0 <= candidate.traced[0] < 3
        assert obs.timed_outputs is not None and obs.timed_outputs.expected >= 1
        assert obs.timing_known_to == pytest.approx(0.0)


def test_windows_that_disagree_run_every_round_and_say_what_the_ratio_is_known_to(tmp_path):
    """A candidate whose calls take 5 ms +-30%, drawn window by window: its ratio is not known to 1% by the most
    rounds (8), so all 8 run; what it is known to then is recorded. With the aim off, every round runs too."""
    noisy = FakeCandidate(tmp_path / "o", jitter=0.3)
    rounds, _ = _rounds(tmp_path, FakeTrusted(), noisy, rounds=8, least_rounds=3, known_to=0.01)
    rounds.run()
    obs = rounds.obs
    assert obs.candidate_timing is not None and obs.candidate_timing.n == 8
    assert obs.timing_known_to is not None and obs.timing_known_to > 0.01
    off, _ = _rounds(tmp_path, FakeTrusted(), FakeCandidate(tmp_path / "p"), rounds=8, least_rounds=3)
    off.run()
    assert off.obs.candidate_timing is not None and off.obs.candidate_timing.n == 8


def test_a_ratio_not_known_to_the_ranking_aim_runs_extra_rounds_until_it_is(tmp_path):
    """A candidate whose calls take 5 ms +-5%, drawn window by window, does not know its ratio to 3% after the plan's
    8 rounds: extra rounds run until the windows so far say it is, fewer than the 24 allowed (on an H100
    level3/15's paired spread of 7% after 12 rounds left its A/A at 1.051x, known to +-4.5%, unmarked). At +-30% it
    never is: every extra round runs. A steady candidate, and a plan with no extra rounds (rounds asked for by
    number), run none."""
    def run(jitter: float, extra: int, name: str) -> int:
        rounds, _ = _rounds(tmp_path, FakeTrusted(), FakeCandidate(tmp_path / name, jitter=jitter), rounds=8,
                            least_rounds=3, known_to=0.01, extra_rounds=extra, rank_known_to=0.03)
        rounds.run()
        assert rounds.obs.candidate_timing is not None and rounds.obs.timing_known_to is not None
        return rounds.obs.candidate_timing.n

    assert run(0.05, 0, "a") == 8
    assert 8 < run(0.05, 24, "b") < 32
    assert run(0.3, 24, "c") == 32
    assert run(0.0, 24, "d") == 3


def test_a_host_that_slows_every_window_of_a_round_alike_moves_each_kind_but_not_the_paired_speedup(tmp_path):
    """Every other round the host runs both sides' windows at half speed, as a launch-bound network's calls on an
    H200's host ran at 7.5 or 16 ms for seconds at a time: each kind's windows spread wide, the candidate's speedup
    over eager, paired by round, is the 2x it is, known at once: the rounds end at the fewest, and the grade ranks it.
    Graded on each kind's windows, as results stored before paired speedups are, the same rounds are marked."""
    trusted, candidate = FakeTrusted(call_ms=10.0), FakeCandidate(tmp_path / "o", call_ms=5.0)
    candidate.host = trusted.host
    rounds, _ = _rounds(tmp_path, trusted, candidate, rounds=12, least_rounds=4, known_to=0.01)
    timed_round = rounds._round

    def slowed(r: int, *args: Any, **kwargs: Any) -> None:
        trusted.host[0] = 2.0 if r % 2 else 1.0
        timed_round(r, *args, **kwargs)

    rounds._round = slowed  # type: ignore[method-assign]
    rounds.run()
    obs = rounds.obs
    ct, et = obs.candidate_timing, obs.eager_timing
    assert ct is not None and et is not None and ct.n == 4
    assert ct.spread > grading.SPREAD_LIMIT and et.spread > grading.SPREAD_LIMIT  # type: ignore[operator]
    assert et.paired_speedup == pytest.approx(2.0, rel=0.01) and et.paired_spread < 0.01  # type: ignore[operator]
    g = grading.grade(_passing(candidate_timing=ct, eager_timing=et), TOL)
    assert g.speedup_vs_eager == pytest.approx(2.0, rel=0.01) and g.flags == []
    g = grading.grade(_passing(candidate_timing=ct, eager_timing=et.model_copy(
        update={"paired_speedup": None, "paired_spread": None})), TOL)
    assert "timing_unreliable" in [f.check for f in g.flags] and "candidate" in g.flags[0].detail


def test_a_processs_first_fingerprint_is_paid_in_the_warm_up_and_charged_to_no_window(tmp_path):
    """An honest candidate whose first fingerprint takes 50 ms more (its kernels' first loads, as on an H200 in every
    row): the last warm-up round fingerprints too, its figures let go, so no timed window is charged for it. Its
    twin that leaves its first timed window's work to the fingerprint is still charged there."""
    candidate, trusted = FakeCandidate(tmp_path / "o"), FakeTrusted()
    candidate.first_fingerprint_s = 0.05
    rounds, _ = _rounds(tmp_path, trusted, candidate)
    rounds.run()
    timing, check = rounds.obs.candidate_timing, rounds.obs.timed_outputs
    assert timing is not None and check is not None
    assert max(timing.charged_ms) < 1.0, timing.charged_ms
    assert len(check.fingerprint_ms) == len(check.reference_fingerprint_own_ms) == 5  # the timed rounds' alone
    assert trusted.commands.count("fingerprint") == 6  # and the warm-up's
    lazy = FakeCandidate(tmp_path / "p")

    def late(command: Any, *args: Any, **kwargs: Any) -> Message:
        msg = FakeCandidate.request(lazy, command, *args, **kwargs)
        if command.cmd == "fingerprint" and len(lazy.windows) == 4:  # the first timed window's work, left undone
            return Message(msg.event, msg.fields, msg.received_at + 0.05)
        return msg

    lazy.request = late  # type: ignore[method-assign]
    charged, _ = _rounds(tmp_path, FakeTrusted(), lazy)
    charged.run()
    assert charged.obs.candidate_timing is not None and charged.obs.candidate_timing.charged_ms[0] > 45.0


def test_the_candidate_is_paused_after_every_turn_and_after_each_fingerprint(tmp_path):
    """After the one-call window, after each window of a warm-up round and the last one's fingerprint, and after
    each timed round's window and its fingerprint (the round trip after it is measured with the candidate stopped),
    and after each hand-over (the trusted side copies the outputs out of the exchange as they were handed over, not
    as rewritten since)."""
    candidate, trusted = FakeCandidate(tmp_path / "o"), FakeTrusted()
    _rounds(tmp_path, trusted, candidate)[0].run()
    handovers = trusted.commands.count("check_handover")
    assert handovers >= 1 and candidate.pauses == 1 + 2 + 1 + 5 * 2 + handovers


def test_on_cuda_the_trusted_side_waits_for_an_idle_gpu_before_and_after_each_reference_window(tmp_path):
    trusted = FakeTrusted()
    rounds, _ = _rounds(tmp_path, trusted, FakeCandidate(tmp_path / "o"), device="cuda", idle_wait_s=10.0)
    rounds.run()
    reference_windows = sum(c in ("eager", "empty") for c in trusted.commands)
    assert trusted.commands.count("wait_idle") == 2 * reference_windows == len(rounds.obs.gpu_idle_waits_ms)
    assert rounds.obs.gpu_busy_windows == 0 and not rounds.obs.ran_while_paused


def test_on_cpu_or_with_the_wait_off_nothing_is_waited_for(tmp_path):
    """On the CPU nothing is probed. On CUDA with the wait off, the trusted side still probes the GPU once before and
    after each reference window (a wait of no time, nothing observed): its windows start with its own GPU context
    the device's last, as the candidate's do after its wake, so that turning the wait off favours neither side."""
    trusted = FakeTrusted()
    _rounds(tmp_path, trusted, FakeCandidate(tmp_path / "cpu"), device="cpu", idle_wait_s=10.0)[0].run()
    assert "wait_idle" not in trusted.commands
    trusted = FakeTrusted()
    rounds = _rounds(tmp_path, trusted, FakeCandidate(tmp_path / "cuda"), device="cuda", idle_wait_s=0.0)[0]
    rounds.run()
    reference_windows = sum(c in ("eager", "empty") for c in trusted.commands)
    assert trusted.commands.count("wait_idle") == 2 * reference_windows
    assert not rounds.obs.gpu_idle_waits_ms and not rounds.obs.gpu_shared_waits_ms


def test_gpu_work_after_a_reference_window_times_it_again_and_is_said(tmp_path):
    """The wait after a reference window found 38 ms of another process's work: that window is timed again."""
    trusted = FakeTrusted(idle=[{"waited_ms": 38.5, "busy": False}])
    rounds, _ = _rounds(tmp_path, trusted, FakeCandidate(tmp_path / "o"), device="cuda", idle_wait_s=10.0)
    assert rounds.reference_window("eager", [1], [2], r=0) is not None
    assert rounds.obs.gpu_idle_waits_ms == [38.5, 0.06, 0.06]  # after it, before the retry, after the retry
    assert rounds.obs.ran_while_paused == ["the eager window of round 0: another process's GPU work ran after it (the "
                                           "trusted side waited 38.5 ms for an idle GPU)"]


def test_a_reference_window_disturbed_every_time_stops_the_timing(tmp_path):
    rounds, _ = _rounds(tmp_path, FakeTrusted(), FakeCandidate(tmp_path / "o", cpu_used=[5] * DISTURBED_TRIES))
    with pytest.raises(CandidateStopped):
        rounds.reference_window("empty", [1], [2], r=-1)
    assert len(rounds.obs.ran_while_paused) == DISTURBED_TRIES + 1 and rounds.obs.paused_cpu_windows == DISTURBED_TRIES


def test_a_comparison_under_way_at_a_cut_short_end_is_let_finish(tmp_path):
    trusted = FakeTrusted()
    rounds, _ = _rounds(tmp_path, trusted, FakeCandidate(tmp_path / "o"))
    rounds.run()
    rounds.compare_handovers()
    rounds.settle()
    assert trusted.pending is None and not rounds.checks.comparing
    assert rounds.obs.timed_outputs is not None and not rounds.obs.timed_outputs.calls  # not recorded


LONG = {"waited_ms": 38.5, "busy": False}
STUCK = {"waited_ms": 10000.0, "busy": True}


def _cuda_rounds(tmp_path: Path, idle: list[dict[str, Any]], gpu_processes: Callable[[], list[list[int]]],
                 cpu_used: list[int] | None = None, idle_processes: list[int] | None = None) -> TimedRounds:
    rounds = _rounds(tmp_path, FakeTrusted(idle=idle), FakeCandidate(tmp_path / "o", cpu_used=cpu_used),
                     device="cuda", idle_wait_s=10.0, gpu_processes=gpu_processes)[0]
    rounds.idle_processes = lambda: list(idle_processes or [])
    return rounds


def _flags(rounds: TimedRounds) -> list[str]:
    """The result's flags, were the rest of the evaluation a clean pass (its trials are not these tests' business)."""
    from tests.test_integrity_grading import TOL as GRADE_TOL
    from tests.test_integrity_grading import _passing, _window_timing

    o = rounds.obs
    obs = _passing(candidate_timing=_window_timing(1.0)).model_copy(update={
        k: getattr(o, k) for k in ("gpu_idle_waits_ms", "gpu_busy_windows", "gpu_shared_waits_ms", "gpu_shared_busy",
                                   "gpu_sharers", "gpu_unattributed", "ran_while_paused", "paused_cpu_windows")})
    return [f.check for f in grading.grade(obs, GRADE_TOL).flags]


def test_gpu_work_with_only_the_candidate_beside_the_trusted_side_is_its_leftover_work(tmp_path):
    """Before a reference window the wait took 38.5 ms, and after it 10 s, busy still: NVML lists only the trusted side
    and the candidate on the GPU (another process on another GPU), so the work was the candidate's: the window is timed
    again, and the result is leftover_gpu_work, as before."""
    rounds = _cuda_rounds(tmp_path, [LONG, STUCK], lambda: [[TRUSTED_PID, *CANDIDATE_PIDS], [OTHER_PID]])
    rounds.wait_idle()
    rounds.reference_window("eager", [1], [2])
    assert rounds.obs.gpu_idle_waits_ms == [38.5, 10000.0, 0.06, 0.06] and rounds.obs.gpu_busy_windows == 1
    assert len(rounds.obs.ran_while_paused) == 1
    assert not rounds.obs.gpu_shared_waits_ms and rounds.obs.gpu_sharers == []
    assert _flags(rounds)[:1] == ["leftover_gpu_work"]


def test_gpu_work_with_another_process_on_the_gpu_is_a_shared_gpu_never_leftover_work(tmp_path):
    """Another evaluation computes on the same GPU: the long waits are kept apart, the window after which the GPU was
    busy is timed again without blaming the candidate, and the result is shared_gpu, not flagged."""
    rounds = _cuda_rounds(tmp_path, [LONG, STUCK], lambda: [[TRUSTED_PID, OTHER_PID, *CANDIDATE_PIDS]])
    rounds.wait_idle()
    assert rounds.reference_window("eager", [1], [2]) is not None
    assert rounds.obs.gpu_shared_waits_ms == [38.5, 10000.0] and rounds.obs.gpu_shared_busy == 1
    assert rounds.obs.gpu_idle_waits_ms == [0.06, 0.06] and rounds.obs.gpu_busy_windows == 0
    assert rounds.obs.gpu_sharers == [OTHER_PID] and rounds.obs.ran_while_paused == []
    assert _flags(rounds) == ["shared_gpu"]


def test_the_slots_own_idle_processes_on_the_gpu_leave_the_candidates_work_its_own(tmp_path):
    """A worker's slot keeps warm trusted processes of other problems and spare candidates not yet given their
    submission: NVML lists them on the GPU (their contexts) though they run nothing. The candidate's work left
    running is still its leftover work (in the GPU suite, where such a pool is always there, it had been taken for a
    shared GPU); a process that is not the slot's still makes the GPU shared."""
    idle_pool = [OTHER_PID, OTHER_PID + 1]
    rounds = _cuda_rounds(tmp_path, [LONG, STUCK], lambda: [[TRUSTED_PID, *idle_pool, *CANDIDATE_PIDS]],
                          idle_processes=idle_pool)
    rounds.wait_idle()
    rounds.reference_window("eager", [1], [2])
    assert rounds.obs.gpu_idle_waits_ms[:2] == [38.5, 10000.0] and not rounds.obs.gpu_shared_waits_ms
    assert _flags(rounds)[:1] == ["leftover_gpu_work"]
    foreign = _cuda_rounds(tmp_path, [LONG, STUCK], lambda: [[TRUSTED_PID, *idle_pool, 4000, *CANDIDATE_PIDS]],
                           idle_processes=idle_pool)
    foreign.wait_idle()
    foreign.reference_window("eager", [1], [2])
    assert foreign.obs.gpu_sharers == [4000] and _flags(foreign) == ["shared_gpu"]


def test_a_window_other_processes_disturb_every_time_is_kept_and_marked_not_stopped(tmp_path):
    rounds = _cuda_rounds(tmp_path, [STUCK, STUCK, STUCK, STUCK, STUCK], lambda: [[TRUSTED_PID, OTHER_PID]])
    assert rounds.reference_window("eager", [1], [2]) is not None
    assert rounds.obs.ran_while_paused == [] and _flags(rounds) == ["shared_gpu"]


def test_the_candidates_cpu_time_while_paused_counts_against_it_on_a_shared_gpu_too(tmp_path):
    rounds = _cuda_rounds(tmp_path, [], lambda: [[TRUSTED_PID, OTHER_PID]], cpu_used=[900])
    rounds.reference_window("eager", [1], [2], r=2)
    assert rounds.obs.paused_cpu_windows == 1 and _flags(rounds) == ["ran_while_paused"]


def test_the_candidates_own_long_waits_beside_shared_ones_are_still_its_own(tmp_path):
    """While another process came and went: the waits while it computed there are shared, the one while the GPU held
    only the candidate's work is the candidate's."""
    lists = iter([[[TRUSTED_PID, OTHER_PID, *CANDIDATE_PIDS]], [[TRUSTED_PID, *CANDIDATE_PIDS]]])
    rounds = _cuda_rounds(tmp_path, [LONG, LONG], lambda: next(lists))
    rounds.wait_idle()
    rounds.wait_idle()
    assert rounds.obs.gpu_shared_waits_ms == [38.5] and rounds.obs.gpu_idle_waits_ms == [38.5]
    assert _flags(rounds) == ["leftover_gpu_work"]


def test_without_nvml_long_waits_cannot_be_told_apart_and_never_blame_the_candidate(tmp_path):
    def unavailable() -> list[list[int]]:
        raise NvmlUnavailable("no NVML binding (the nvidia-ml-py package) in the harness's environment")

    rounds = _cuda_rounds(tmp_path, [LONG], unavailable)
    rounds.wait_idle()
    rounds.wait_idle()  # short: NVML not asked, the candidate's as always
    assert rounds.obs.gpu_shared_waits_ms == [38.5] and rounds.obs.gpu_idle_waits_ms == [0.06]
    assert rounds.obs.gpu_unattributed is not None and "no NVML binding" in rounds.obs.gpu_unattributed
    assert _flags(rounds) == ["shared_gpu"]


def test_short_waits_never_ask_nvml(tmp_path):
    def never() -> list[list[int]]:
        raise AssertionError("asked")

    rounds = _cuda_rounds(tmp_path, [{"waited_ms": 1.4, "busy": False}], never)
    rounds.run()
    assert rounds.obs.gpu_idle_waits_ms[0] == 1.4 and not rounds.obs.gpu_shared_waits_ms


def test_staged_windows_inputs_reach_the_candidate_only_once_its_windows_clock_runs(tmp_path):
    """Staged: before each candidate window the trusted side makes its inputs, the candidate runs its lead-in on the
    last window's, is paused, and only then are the new inputs written where it maps them; its window's clock starts
    before it is continued. The window segment's layout goes with a lead-in only where it changed, a new segment with
    the lead-in after it was made. Its honest fingerprints match (it computed on the inputs filled)."""
    trusted, candidate = FakeTrusted(call_ms=10.0), FakeCandidate(tmp_path / "o", call_ms=5.0)
    rounds, phases = _rounds(tmp_path, trusted, candidate, staged=True)
    rounds.run()
    ev = trusted.events
    windows = [i for i, e in enumerate(ev) if e.startswith("candidate window")]
    assert ev[windows[0]] == "candidate window"  # the one-call window that sizes the first: unstaged
    for i in windows[1:]:
        assert ev[i] == "candidate window (clock from resume)"
        assert ev[i - 4:i] == ["trusted stage_window", "candidate lead_in", "candidate paused", "trusted fill_window"]
    assert "lead_ins" in phases and rounds.obs.windows_unstaged is None
    check = rounds.obs.timed_outputs
    assert check is not None and not check.fingerprint_mismatches and check.fingerprinted == 5 * 10
    # Layouts: sent with the first lead-in and where the calls changed; the segment when it grew.
    sent = [c for c in candidate.lead_ins if c.layout is not None]
    assert sent and len(sent) < len(candidate.lead_ins) and candidate.lead_ins[0].segments
    # A lead-in of 20 ms at the windows' pace (100 ms over 10 calls): 2 calls, before every window of every kind in the
    # 2 warm-up and 5 timed rounds.
    assert [c.calls for c in candidate.lead_ins] == [2] * 7 and trusted.lead_in_calls == [2] * 14
    # Every reference window ran on inputs staged for it, after a lead-in of its own, paused as the candidate is
    # (for as long as the candidate's inputs took to write), continued on the window's clock.
    for i, e in enumerate(ev):
        if e == "trusted lead_in":
            assert ev[i - 1] == "trusted stage_window" and ev[i + 1] == "trusted paused"
    assert rounds.fill_s == pytest.approx(0.3e-3)


def test_inputs_that_cannot_be_staged_are_made_in_every_window_and_said(tmp_path):
    trusted, candidate = FakeTrusted(stageable=False), FakeCandidate(tmp_path / "o")
    rounds, _ = _rounds(tmp_path, trusted, candidate, staged=True, device="cuda")
    rounds.run()
    assert "trusted fill_window" not in trusted.events and "trusted lead_in" not in trusted.events
    # The candidate is only woken before each window (a lead-in of no call), as without staging on CUDA.
    assert [c.calls for c in candidate.lead_ins] == [0] * 7
    assert trusted.events.count("trusted stage_window") == 1  # asked once; from then on, every window makes its own
    assert rounds.obs.windows_unstaged and "no plain dense tensor" in rounds.obs.windows_unstaged
    assert rounds.obs.timed_outputs is not None and not rounds.obs.timed_outputs.fingerprint_mismatches


def test_windows_that_make_their_own_inputs_start_with_the_candidate_woken_off_the_clock(tmp_path):
    """Unstaged, on every device, the paused candidate is continued before each of its windows and answers a lead-in
    of no call (on CUDA one tiny kernel and a wait, timing.touch) before the window's clock starts, as the trusted
    side's idle probe runs before each reference window. Without it, on an H100, one-call windows (level1/19, 43, 47,
    48) came out at 0.92x-0.94x in an A/A with equal CUDA-event times per call."""
    trusted, candidate = FakeTrusted(), FakeCandidate(tmp_path / "o")
    rounds, _ = _rounds(tmp_path, trusted, candidate, staged=False, device="cuda")
    rounds.run()
    ev = trusted.events
    windows = [i for i, e in enumerate(ev) if e == "candidate window"]
    assert len(windows) == 8  # the sizing window, 2 warm-up rounds and 5 timed
    assert all(ev[i - 1] == "candidate lead_in" for i in windows[1:]) and ev[windows[0] - 1] != "candidate lead_in"
    assert [c.calls for c in candidate.lead_ins] == [0] * 7 and not trusted.lead_in_calls
    # On the CPU too: the wake is where the candidate lets its last window's outputs go, off the clock (letting them
    # go in the window cost its round trip 1-3 ms in a third of the CPU A/A runs).
    trusted, candidate = FakeTrusted(), FakeCandidate(tmp_path / "cpu")
    _rounds(tmp_path, trusted, candidate, staged=False)[0].run()
    assert [c.calls for c in candidate.lead_ins] == [0] * 7


def test_both_sides_window_threads_are_kept_to_the_plans_core_for_the_rounds_and_the_trusted_side_let_go_after(
        tmp_path):
    """Before the first window, the trusted side and the candidate are each told the plan's core (the candidate
    paused again after); after the last, the trusted side gets its own cores back. Without a core, nothing is said."""
    trusted, candidate = FakeTrusted(), FakeCandidate(tmp_path / "o")
    rounds, _ = _rounds(tmp_path, trusted, candidate, device="cuda", core=3)
    rounds.run()
    events = trusted.events
    assert events[:3] == ["trusted pin", "candidate pin", "candidate paused"], events[:5]
    assert events.index("candidate pin") < events.index("candidate window")
    assert trusted.pins == [[3], None] and events[-1] == "trusted pin"
    assert rounds.obs.timing_core == 3 and rounds.obs.timing_core_refused is None
    plain_trusted, plain = FakeTrusted(), FakeCandidate(tmp_path / "p")
    unpinned, _ = _rounds(tmp_path, plain_trusted, plain, device="cuda")
    unpinned.run()
    assert plain_trusted.pins == [] and "candidate pin" not in plain_trusted.events
    assert unpinned.obs.timing_core is None


def test_the_plans_busy_core_spins_through_every_round_and_stops_with_them(tmp_path, monkeypatch):
    """The spinner starts before the first window (the warm-up's included) and ends after the last, before the
    trusted side is given its cores back; the observations name its core. Without one, none starts."""
    trusted, candidate = FakeTrusted(), FakeCandidate(tmp_path / "o")

    class Recorded(busy_core.BusyCore):
        def __enter__(self) -> busy_core.BusyCore:
            trusted.events.append(f"busy {self.core}")
            self.kept = self.core is not None
            return self

        def __exit__(self, *exc: object) -> None:
            trusted.events.append("busy end")

    monkeypatch.setattr(busy_core, "BusyCore", Recorded)
    rounds, _ = _rounds(tmp_path, trusted, candidate, device="cuda", core=3, busy_core=0)
    rounds.run()
    events = trusted.events
    assert events[0] == "busy 0" and events[-2:] == ["busy end", "trusted pin"], (events[:3], events[-3:])
    windows = [i for i, e in enumerate(events) if e.endswith(" window")]
    assert windows and windows[0] > 0 and windows[-1] < events.index("busy end")
    assert rounds.obs.busy_core == 0
    plain_trusted = FakeTrusted()
    trusted = plain_trusted
    unbusy, _ = _rounds(tmp_path, plain_trusted, FakeCandidate(tmp_path / "p"), device="cuda", core=3)
    unbusy.run()
    assert plain_trusted.events[0] == "busy None" and unbusy.obs.busy_core is None


def test_the_cpus_one_core_rounds_hold_the_candidate_there_and_run_both_sides_on_one_thread(tmp_path):
    """Held (the CPU with a cpuset): before either side is pinned every process of the candidate's is held to the
    core, then both sides are told one thread; after the last window the candidate is let go and the trusted side
    given its cores and threads back. A cpuset that refuses is said, and both sides keep their threads: a
    reference on one thread is never timed against a candidate free to use the other cores."""
    trusted, candidate = FakeTrusted(), FakeCandidate(tmp_path / "o")
    rounds, _ = _rounds(tmp_path, trusted, candidate, core=1, held=True)
    rounds.run()
    events = trusted.events
    assert events[:4] == ["candidate held to [1]", "trusted pin", "candidate pin", "candidate paused"], events[:5]
    assert trusted.pin_threads == [1, None] and candidate.threads == [1]
    assert events[-2:] == ["trusted pin", "candidate held to None"], events[-3:]
    assert rounds.obs.timing_core_held and rounds.obs.timing_core_refused is None
    refusing_trusted, refusing = FakeTrusted(), FakeCandidate(tmp_path / "p")
    refusing.holdable = False
    refused, _ = _rounds(tmp_path, refusing_trusted, refusing, core=1, held=True)
    refused.run()
    assert refusing_trusted.pin_threads == [None, None] and refusing.threads == [None]
    assert not refused.obs.timing_core_held and refusing.held == [[1]]
    assert refused.obs.timing_core_refused == "the candidate's processes could not be held to the core (its cpuset " \
                                              "refused)"
    assert refused.obs.candidate_timing is not None
    cuda_trusted, cuda = FakeTrusted(), FakeCandidate(tmp_path / "q")
    _rounds(tmp_path, cuda_trusted, cuda, device="cuda", core=1)[0].run()
    assert cuda.held == [] and cuda.threads == [None] and cuda_trusted.pin_threads == [None, None]


def test_a_side_that_cannot_be_kept_to_the_core_is_said_and_timed_where_it_runs(tmp_path):
    """A candidate whose cgroup holds cores 0-1 only, told core 3: its reply names where it may run, and the rounds go
    on; the observations say which side was not kept there."""
    candidate = FakeCandidate(tmp_path / "o")
    candidate.cores = [0, 1]
    rounds, _ = _rounds(tmp_path, FakeTrusted(), candidate, device="cuda", core=3)
    rounds.run()
    assert rounds.obs.timing_core == 3
    assert rounds.obs.timing_core_refused == "the candidate's window thread may run on [0, 1]"
    assert rounds.obs.candidate_timing is not None and rounds.obs.candidate_timing.n == 5


def test_a_candidate_that_answers_the_pin_with_anything_is_said_bounded_and_timed(tmp_path):
    """Its reply is its own words: a megabyte where its cores should be is shown cut to 200 characters."""
    candidate = FakeCandidate(tmp_path / "o")
    candidate.cores = ["x" * (1 << 20)]  # type: ignore[list-item]
    rounds, _ = _rounds(tmp_path, FakeTrusted(), candidate, device="cuda", core=3)
    rounds.run()
    refused = rounds.obs.timing_core_refused or ""
    assert refused.startswith("the candidate's window thread may run on ['xxx") and len(refused) < 300
    assert rounds.obs.candidate_timing is not None


class FakeEager(FakeCandidate):
    """Eager's own process (eager_process.EagerProcess over a candidate's handle): the candidate's fake, whose empty
    windows call nothing and which gives its outputs' scales; its commands named 'eager' in the shared events."""

    def __init__(self, outputs: Path, call_ms: float = 10.0):
        super().__init__(outputs, call_ms=call_ms)
        self.obs = Observations()

    def request(self, command: Any, limit_s: float, phase: Any, clock_from_resume: bool = False) -> Message:
        if command.cmd == "scales":
            self.events.append("eager scales")
            return Message("scaled", {"scales": [[1.0]] * len(self.last_seeds)}, self.sent_at + 0.0001)
        events, self.events = self.events, []
        try:
            if command.cmd == "window" and command.empty:
                self.last_seeds = list(self.segment()) if command.staged else list(command.seeds)
                events.append("eager window (empty)" + (" (clock from resume)" if clock_from_resume else ""))
                return Message("window_done", {"host_ms": 1.0}, self.sent_at + 1.0 / 1e3)
            msg = super().request(command, limit_s, phase, clock_from_resume)
            events += [e.replace("candidate", "eager") for e in self.events]
            return msg
        finally:
            self.events = events

    def pause(self) -> None:
        self.pauses += 1
        self.events.append("eager paused")

    def processes(self) -> list[int]:
        return [EAGER_PID]


EAGER_PID = 4000


def test_eager_and_empty_windows_run_in_eagers_own_process_and_its_fingerprints_are_the_reference(tmp_path):
    """With eager's own process, eager's and the empty windows are its (none of the trusted side's), torch.compile's
    stays the trusted side's, eager's fingerprints and scales judge the candidate's, an honest fingerprint costs what
    eager's own took (nothing is charged to the honest candidate), and before every window of either child the
    trusted side probes the GPU, then the child is woken: the same steps for both. Its process is held and pinned as
    the candidate's, its GPU work is the harness's own (no shared_gpu), and it is paused after each turn."""
    from harness.evaluation.eager_process import EagerProcess

    trusted = FakeTrusted(call_ms=10.0)
    candidate, eager = FakeCandidate(tmp_path / "c", call_ms=5.0), FakeEager(tmp_path / "e", call_ms=10.0)
    rounds, _ = _rounds(tmp_path, trusted, candidate, device="cuda", idle_wait_s=10.0, core=3,
                        kinds=("candidate", "eager", "empty", "compile"),
                        gpu_processes=lambda: [[TRUSTED_PID, *CANDIDATE_PIDS, EAGER_PID]])
    rounds.eager = EagerProcess(eager)  # type: ignore[arg-type]
    eager.events = trusted.events
    rounds.run()
    obs = rounds.obs
    assert "eager" not in trusted.commands and "empty" not in trusted.commands and "compile" in trusted.commands
    assert "fingerprint" not in trusted.commands  # eager's own process fingerprints its outputs
    assert obs.eager_timing is not None and obs.eager_timing.median_ms == pytest.approx(10.0)
    assert obs.candidate_timing is not None and obs.candidate_timing.median_ms == pytest.approx(5.0)
    assert obs.compile_timing is not None and obs.compile_timing.paired_speedup is not None
    check = obs.timed_outputs
    assert check is not None and check.fingerprinted == 5 * 10 and not check.fingerprint_mismatches
    assert check.reference_fingerprint_own_ms == [pytest.approx(0.6)] * 5 and set(obs.candidate_timing.charged_ms) \
        == {0.0}
    events = trusted.events
    for i, e in enumerate(events):
        if e in ("candidate lead_in", "eager lead_in"):
            assert events[i - 1] == "trusted wait_idle", events[i - 3:i + 1]
    assert eager.threads and eager.held == [] and "eager pin" in events
    assert not obs.gpu_sharers and not obs.gpu_shared_waits_ms
    assert eager.pauses >= 2 * 7


def test_the_baselines_pay_an_honest_fingerprints_noise_only_where_eagers_process_fingerprints(tmp_path):
    """Eager's own process fingerprints as the candidate's does; two of its five timed fingerprints take 0.4 ms more
    (a host's wake-up). Its windows and torch.compile's are charged that excess over the median of its own (as the
    candidate's are over the same median), window by window: the same noise on both sides of the ratio. With eager
    in the trusted process, whose fingerprint is its own clock's step, no baseline is charged."""
    from harness.evaluation.eager_process import EagerProcess

    trusted = FakeTrusted(call_ms=10.0)
    candidate, eager = FakeCandidate(tmp_path / "c", call_ms=10.0), FakeEager(tmp_path / "e", call_ms=10.0)
    fingerprints = 0

    def noisy(command: Any, *args: Any, **kwargs: Any) -> Message:
        nonlocal fingerprints
        msg = FakeEager.request(eager, command, *args, **kwargs)
        if command.cmd == "fingerprint":
            fingerprints += 1  # the warm-up's last round, then the five timed
            if fingerprints in (3, 5):
                return Message(msg.event, msg.fields, msg.received_at + 0.0004)
        return msg

    eager.request = noisy  # type: ignore[method-assign]
    rounds, _ = _rounds(tmp_path, trusted, candidate, device="cuda", kinds=("candidate", "eager", "empty", "compile"))
    rounds.eager = EagerProcess(eager)  # type: ignore[arg-type]
    rounds.run()
    obs, check = rounds.obs, rounds.obs.timed_outputs
    assert check is not None and obs.eager_timing is not None and obs.compile_timing is not None
    assert obs.eager_timing.charged_ms == obs.compile_timing.charged_ms == pytest.approx([0, 0.4, 0, 0.4, 0], abs=1e-3)
    assert obs.eager_timing.charged_ms == windows.honest_charges(check.reference_fingerprint_own_ms)
    alone = _rounds(tmp_path, FakeTrusted(call_ms=10.0), FakeCandidate(tmp_path / "d", call_ms=10.0))[0]
    alone.run()
    assert alone.obs.eager_timing is not None and alone.obs.eager_timing.charged_ms == []


def test_a_forged_fingerprint_is_caught_against_eagers_own_process(tmp_path):
    from harness.evaluation.eager_process import EagerProcess

    trusted = FakeTrusted(call_ms=10.0)
    candidate, eager = FakeCandidate(tmp_path / "c", off_by=50.0), FakeEager(tmp_path / "e", call_ms=10.0)
    rounds, _ = _rounds(tmp_path, trusted, candidate, device="cuda")
    rounds.eager = EagerProcess(eager)  # type: ignore[arg-type]
    rounds.run()
    check = rounds.obs.timed_outputs
    assert check is not None and len(check.fingerprint_mismatches) == 5 * 10


def _staged_with_eagers_process(tmp_path: Path, candidate: FakeCandidate, trusted: FakeTrusted,
                                kinds: tuple[str, ...] = ("candidate", "eager", "empty")) -> tuple[TimedRounds, Any]:
    from harness.evaluation.eager_process import EagerProcess

    eager = FakeEager(tmp_path / "e", call_ms=10.0)
    rounds, _ = _rounds(tmp_path, trusted, candidate, staged=True, kinds=kinds)
    rounds.eager = EagerProcess(eager)  # type: ignore[arg-type]
    eager.events, eager.segment = trusted.events, lambda: trusted.eager_segment
    rounds.run()
    return rounds, eager


def test_staged_windows_in_eagers_own_process_take_the_steps_the_candidates_take(tmp_path):
    """Staged with eager's own process: before eager's and the empty window the trusted side stages their inputs,
    eager's process runs its lead-in, is paused, the trusted side writes the inputs into eager's own window segment,
    and the window's clock starts before it is continued: the candidate's steps, in a process started as the
    candidate's. torch.compile's window stays the trusted side's, led in there."""
    trusted = FakeTrusted(call_ms=10.0)
    rounds, eager = _staged_with_eagers_process(tmp_path, FakeCandidate(tmp_path / "c", call_ms=5.0), trusted,
                                                kinds=("candidate", "eager", "empty", "compile"))
    ev = trusted.events
    for kind in ("eager window (clock from resume)", "eager window (empty) (clock from resume)"):
        at = [i for i, e in enumerate(ev) if e == kind]
        assert len(at) == 7  # 2 warm-up and 5 timed rounds, every one staged
        for i in at:
            assert ev[i - 4:i] == ["trusted stage_window", "eager lead_in", "eager paused",
                                   "trusted fill_window (eager's)"]
    assert "eager window" not in ev and "eager window (empty)" not in ev  # none made its own inputs
    # torch.compile's lead-ins only in the trusted process; eager's and the empty window's in eager's, as many calls.
    assert len(trusted.lead_in_calls) == 7 and [c.calls for c in eager.lead_ins] == [
        n for n in trusted.lead_in_calls for _ in range(2)]
    # Eager's window segment reached eager's process, under the candidate's name, with its first lead-in; the
    # candidate's lead-ins name only the candidate's.
    assert [s["name"] for s in eager.lead_ins[0].segments] == ["window"] and eager.lead_ins[0].layout is not None
    assert all(s["name"] == "window" for c in rounds.candidate.lead_ins for s in c.segments)
    assert sum(len(c.segments) for c in rounds.candidate.lead_ins) == sum(len(c.segments) for c in eager.lead_ins)
    check = rounds.obs.timed_outputs
    assert check is not None and check.fingerprinted == 5 * 10 and not check.fingerprint_mismatches
    assert rounds.obs.eager_timing is not None and rounds.obs.eager_timing.median_ms == pytest.approx(10.0)


def test_the_candidates_lead_in_never_reads_the_inputs_of_its_coming_window(tmp_path):
    """Found by the corpus's content-keyed cache (timed at 0.51 ms a call, not 20): with one window segment for both
    processes, where eager's window ran first in a round the segment still held that round's inputs when the
    candidate's lead-in ran on it. Eager's process has a segment of its own: whatever the order drawn, what the
    candidate's lead-ins could read is never the inputs its window is then given."""
    trusted, candidate = FakeTrusted(call_ms=10.0), FakeCandidate(tmp_path / "c", call_ms=5.0)
    _staged_with_eagers_process(tmp_path, candidate, trusted)
    ev = trusted.events
    leads = [i for i, e in enumerate(ev) if e == "candidate lead_in"]
    eager_first = [i for i in leads if "eager window (clock from resume)" in ev[max(0, i - 12):i]]
    assert eager_first  # rounds where eager's window came before the candidate's: where the leak was
    staged = candidate.window_inputs[-len(leads):]  # the one-call window before them makes its own inputs
    assert len(leads) == len(candidate.seen_in_lead_ins) == len(staged) == 7
    for seen, inputs in zip(candidate.seen_in_lead_ins, staged, strict=True):
        assert seen != inputs, (seen, inputs)
