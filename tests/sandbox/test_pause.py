"""The candidate's pause between its turns (sandbox/pause.py): SIGSTOP, which a timer of its own lifts, against the
cgroup freezer (v2 and v1) and the ptrace-stop, on a child that arms a SIGCONT timer and spins
(tests/sandbox/sigcont_spinner.py); and the runner's check after each reference window."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness.evaluation.runner import EvalOptions, evaluate
from harness.problems import get_registry
from harness.sandbox import cgroups, pause, process
from harness.verdicts import Verdict
from tests.evaluation.test_corpus import _held_whatever_it_signals

ROOT = Path(__file__).parents[2]
SPIN_S = 0.4


def _spinner(tmp_path: Path, idle: bool = False) -> subprocess.Popen:
    ready = tmp_path / f"ready-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPIN_READY": str(ready), **({"SPIN_IDLE": "1"} if idle else {})}
    child = subprocess.Popen([sys.executable, "-m", "tests.sandbox.sigcont_spinner"], cwd=ROOT, env=env,
                             start_new_session=True)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert child.poll() is None and time.monotonic() < deadline, "the spinner did not start"
        time.sleep(0.02)
    return child


def _freezer(version: str) -> tuple[Path, Path | None, list[Path]]:
    if os.geteuid() != 0 or cgroups.own_dirs().get("unified" if version == "v2" else "freezer") is None:
        pytest.skip(f"no cgroup {version} freezer to make a cgroup in here")
    try:
        return cgroups.create_freezer(version, [])
    except OSError as e:
        pytest.skip(f"no cgroup {version} freezer to make a cgroup in here: {e}")


@contextlib.contextmanager
def _paused_by(method: str, child: subprocess.Popen):
    """The pause `method` of `child` (put in a cgroup of its own for the freezers), with its CPU clock."""
    made: list[Path] = []
    try:
        if method == "ptrace":
            def pids() -> list[int]:
                return pause.session_processes(child.pid)
            yield pause.PtraceStop(pids, child, pause.ProcCpu(pids))
            return
        freezer, clock, made = _freezer("v2" if method == "cgroup_freeze" else "v1")
        for cg in made:
            (cg / "cgroup.procs").write_text(str(child.pid))
        assert clock is not None
        yield pause.CgroupFreeze(freezer, pause.CgroupCpu(clock))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        for cg in made:
            cgroups.empty(cg)
        child.wait()
        for cg in made:
            cgroups.remove(cg)


def _used_us(clock: pause.CgroupCpu | pause.ProcCpu, during=lambda: None) -> int:
    mark = clock.mark()
    time.sleep(SPIN_S / 2)
    during()
    time.sleep(SPIN_S / 2)
    return clock.used_since(mark)


METHODS = ["cgroup_freeze", "cgroup_v1_freezer", "ptrace"]


@pytest.mark.parametrize("method", METHODS)
def test_a_sigcont_timer_lifts_sigstop_but_not_the_pause(tmp_path, method):
    """The exploit's mechanism, and each pause against it: a SIGSTOPped child whose timers send it SIGCONT runs on (its
    clock counts CPU while 'stopped'); paused it runs nothing, and it runs again once resumed. (A recent kernel drops a
    timer whose SIGCONT a stop flushed, and a busy host may run the thread that sets them again too late: here one
    SIGSTOP in a few is lifted, where the host the exploit was found on lifted every one.)

    Held by the v1 freezer or a ptrace-stop it uses no CPU at all, SIGCONT sent by hand included. Frozen by v2's
    cgroup.freeze, each signal wakes a thread for the kernel to freeze it again, which its clock counts: microseconds
    for its timers' SIGCONT, against the whole time it spins when it runs. That is why the runner's check counts any
    CPU at all: an honest candidate sends itself no signal."""
    child = _spinner(tmp_path)
    with _paused_by(method, child) as held:
        assert held.method == method
        escaped: list[int] = []
        while len(escaped) < 8 and not any(us > SPIN_S * 1e6 / 10 for us in escaped):
            os.killpg(child.pid, signal.SIGSTOP)
            time.sleep(0.05)
            escaped.append(_used_us(held.clock))
            os.killpg(child.pid, signal.SIGCONT)
            time.sleep(0.05)
        assert any(us > SPIN_S * 1e6 / 10 for us in escaped), f"under SIGSTOP it used {escaped} µs in {SPIN_S} s"
        held.stop()
        paused = _used_us(held.clock, during=lambda: os.killpg(child.pid, signal.SIGCONT))
        if method == "cgroup_freeze":
            assert paused < 1000, f"frozen, it used {paused} µs in {SPIN_S} s"
        else:
            assert paused == 0
        held.resume()
        assert _used_us(held.clock) > SPIN_S * 1e6 / 10
        held.stop()  # again, as in every round
        assert _used_us(held.clock) < 1000
        held.close()  # lets it go
        assert _used_us(held.clock) > SPIN_S * 1e6 / 10


@pytest.mark.parametrize("method", METHODS)
def test_an_honest_child_uses_no_cpu_at_all_while_paused(tmp_path, method):
    """The honest twin (no timer, a thread asleep): paused by any of the three, its clock stands still, so the check
    after each reference window has nothing to say of an honest candidate."""
    child = _spinner(tmp_path, idle=True)
    with _paused_by(method, child) as held:
        for _ in range(3):
            held.stop()
            assert _used_us(held.clock) == 0
            held.resume()
        held.close()


def _traced_by_another(pid: int) -> subprocess.Popen:
    """A process that seizes `pid` and holds it (as a candidate's own helper would, to keep the harness out)."""
    code = ("import ctypes, sys, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]\n"
            f"assert libc.ptrace({pause.PTRACE_SEIZE}, {pid}, None, None) == 0, ctypes.get_errno()\n"
            "print('seized', flush=True)\ntime.sleep(60)\n")
    tracer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert tracer.stdout is not None and tracer.stdout.readline().strip() == "seized"
    return tracer


def test_a_candidate_already_traced_cannot_be_paused_and_that_is_its_failure(tmp_path, monkeypatch):
    """A process someone else already traces cannot be seized: the pause fails as the submission's doing (it is the
    candidate that let itself be traced), unless the harness cannot ptrace on this host at all."""
    if not pause.ptrace_capable():
        pytest.skip("this host gives the harness no ptrace")
    child = _spinner(tmp_path, idle=True)
    with _paused_by("ptrace", child) as held:
        tracer = _traced_by_another(child.pid)
        try:
            with pytest.raises(pause.PauseFailed, match="already traced") as failed:
                held.stop()
            assert not failed.value.harness
            held.resume()
            monkeypatch.setattr(pause, "ptrace_capable", lambda: False)
            with pytest.raises(pause.PauseFailed, match="cannot ptrace") as failed:
                held.stop()
            assert failed.value.harness
            held.close()
        finally:
            tracer.kill()  # before the child: a traced child's end is its tracer's to see first
            tracer.wait()


def test_a_child_with_a_freezer_is_frozen_and_one_without_is_ptrace_stopped(tmp_path):
    """Which pause a child gets, and what the result calls it: its jail's freezer (v2's or v1's, by the files its
    cgroup has) where it has one, counted by its cgroup's CPU clock; else a ptrace-stop."""
    from harness.config import Settings
    from harness.sandbox.limits import Jail

    child = _spinner(tmp_path, idle=True)
    try:
        assert process.pause_for(None, child).method == "ptrace"
        assert process.pause_for(Jail(Settings(data_dir=tmp_path), untrusted=True, uid=os.getuid()),
                                 child).method == "ptrace"
        for name, method in (("cgroup.freeze", "cgroup_freeze"), ("freezer.state", "cgroup_v1_freezer")):
            cg = tmp_path / method
            cg.mkdir()
            (cg / name).touch()
            jail = Jail(Settings(data_dir=tmp_path), untrusted=True, cgroups=[cg], freezer=cg, cpu_clock=cg / "cpu")
            held = process.pause_for(jail, child)
            assert held.method == method and isinstance(held.clock, pause.CgroupCpu)
    finally:
        child.kill()
        child.wait()


class _SigStop:
    """The pause before the freezer (SIGSTOP to each of the child's processes), with the child's real CPU clock."""

    method = "sigstop"

    def __init__(self, real: pause.CgroupFreeze | pause.PtraceStop, pids):
        self.clock, self.pids = real.clock, pids

    def stop(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def close(self) -> None:
        self.resume()


def _sigstop_pause(jail, leader):
    real = _real_pause_for(jail, leader)
    return _SigStop(real, jail.processes if jail is not None else lambda: pause.session_processes(leader.pid))


_real_pause_for = process.pause_for


def _evaluate(settings, path: str):
    spec = get_registry().get("level2/30")
    return evaluate(spec, (ROOT / path).read_text(), EvalOptions(device="cpu", size="small", compile_baseline="off"),
                    settings)


def test_a_candidate_that_runs_while_paused_has_its_reference_windows_timed_again_and_is_flagged(settings,
                                                                                                  monkeypatch):
    """Before the freezer: under SIGSTOP the SIGCONT timer's thread ran during the reference's windows. With the pause
    made a SIGSTOP again here, the check after each reference window sees its CPU time there, times the window again
    and flags it, saying how many µs during which window."""
    monkeypatch.setattr(process, "pause_for", _sigstop_pause)
    r = _evaluate(settings, "tests/fixtures/adversarial/sigcont_timer.py")
    assert r.verdict == Verdict.flagged, (r.verdict, r.message)
    assert [f.check for f in r.flags][:1] == ["ran_while_paused"], r.flags
    lines = r.observations.ran_while_paused
    assert lines and all("µs of CPU while paused (sigstop)" in line or "timing stopped" in line for line in lines)
    assert " window of " in lines[0] and "round" in lines[0]
    assert "(tid " in lines[0], lines[0]  # which of its threads ran


def test_the_threads_that_ran_are_named_with_their_cpu_time_and_the_rest_is_said():
    """What a disturbed window's line says of it: each thread whose CPU time grew since the mark, by name, busiest
    first, and the part of the pause's clock no live thread accounts for (a thread or process that ended since)."""
    import threading

    me = os.getpid()
    before = pause.ProcCpu(lambda: [me]).mark()
    assert isinstance(before, dict)

    def burn() -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

    t = threading.Thread(target=burn)
    t.start()
    t.join()  # ended: its time is the pause clock's, and no live thread's
    line = pause.users(before, [me], 80_000)
    assert "µs by no thread alive now" in line, line
    busy = threading.Event()
    done = threading.Event()

    def burn_until_done() -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        busy.set()
        done.wait()

    t = threading.Thread(target=burn_until_done)
    t.start()
    busy.wait()
    try:
        line = pause.users(before, [me], 0)
        first = line.split(" µs")[0]  # the busiest first: a thread that started since the mark
        assert f"(tid {t.native_id}, new)" in first, line
        us = int(first.rsplit(" ", 1)[1])
        assert us >= 40_000, line
    finally:
        done.set()
        t.join()


def test_the_same_candidate_under_the_pause_runs_nothing_beside_the_reference(settings):
    """Its pause holds (the host's freezer, or a ptrace-stop), and the result says which: its thread never runs beside
    the reference. Held by v1's freezer (this host's) or ptrace, no reference window is disturbed and it passes."""
    r = _evaluate(settings, "tests/fixtures/adversarial/sigcont_timer.py")
    assert r.observations.pause_method in ("cgroup_freeze", "cgroup_v1_freezer", "ptrace")
    _held_whatever_it_signals(r)
    if r.observations.pause_method != "cgroup_freeze":
        assert r.verdict == Verdict.passed, (r.verdict, r.message, r.log_excerpt)


def _ptrace_pause(jail, leader):
    """The pause of a host with no usable cgroup freezer."""
    return pause.PtraceStop(jail.processes, leader, pause.ProcCpu(jail.processes))


def test_where_candidates_are_paused_by_ptrace_one_that_traces_itself_is_flagged_and_its_twin_passes(settings,
                                                                                                    monkeypatch):
    """On a host with no usable cgroup freezer the pause is a ptrace-stop; a candidate whose own helper process
    already traces it cannot be seized, so it cannot be paused: flagged pause_refused, its own doing, never an
    infra_error. The honest twin is ptrace-stopped between its turns and passes, saying so."""
    monkeypatch.setattr(process, "pause_for", _ptrace_pause)
    r = _evaluate(settings, "tests/fixtures/adversarial/self_traced.py")
    assert r.verdict == Verdict.flagged and "pause_refused" in [f.check for f in r.flags], (r.verdict, r.message)
    assert "already traced" in r.message
    twin = _evaluate(settings, "tests/fixtures/submissions/l30_pytorch_correct.py")
    assert twin.verdict == Verdict.passed and twin.observations.pause_method == "ptrace", (twin.verdict, twin.message)
    assert not twin.observations.ran_while_paused and not {f.check for f in twin.flags} - {"timing_unreliable"}


class _FakeTrusted:
    def __init__(self):
        self.windows = 0

    def timed_call(self, command, reply):
        self.windows += 1
        return 50.0 + self.windows, {"window": self.windows}


class _FakeCandidate:
    """A paused candidate whose CPU clock moves by the next of `used` during each reference window."""

    def __init__(self, used: list[int]):
        self.used = used

    def cpu_mark(self):
        return 0

    def cpu_used_us(self, mark):
        return self.used.pop(0)

    def cpu_users(self, mark, used_us):
        return f"'python3' (tid 7) {used_us} µs"


def _evaluation(used: list[int]):
    """The timed rounds of a CPU evaluation, in this process, over a fake trusted side and a fake paused candidate."""
    import random

    from harness.evaluation.rounds import RoundsPlan, TimedRounds
    from harness.schema import Observations, Tolerance

    plan = RoundsPlan(device="cpu", rounds=3, kinds=("candidate", "eager", "empty"), window_ms=50.0, calls=1,
                      most_calls=1, output_bytes=4, tolerance=Tolerance(atol=1e-4, rtol=1e-4), idle_wait_s=0.0,
                      traced=False)
    return TimedRounds(plan, _FakeTrusted(), _FakeCandidate(used), Observations(pause_method="cgroup_freeze"),
                       deadline=lambda calls, write_bytes: 10.0,
                       seeds=random.Random(1), phase=lambda name: None)


def test_a_reference_window_the_candidate_disturbed_is_timed_again_and_only_the_clean_one_counts():
    """The window during which the paused candidate used CPU is not the one whose time is kept: it is timed again on
    the same seeds, and the line says which window, how many µs and which threads used them."""
    ev = _evaluation([0])
    assert ev.reference_window("eager", [1], [2], r=0) == (51.0, {"window": 1}) and not ev.obs.ran_while_paused
    ev = _evaluation([7, 0])
    assert ev.reference_window("eager", [1], [2], r=3) == (52.0, {"window": 2})
    assert ev.obs.ran_while_paused == ["the eager window of round 3: the candidate's processes used 7 µs of CPU "
                                       "while paused (cgroup_freeze): 'python3' (tid 7) 7 µs"]


def test_a_reference_window_disturbed_every_time_stops_the_timing():
    from harness.evaluation.handles import CandidateStopped

    ev = _evaluation([900, 800, 700])
    with pytest.raises(CandidateStopped):
        ev.reference_window("empty", [1], [2], r=-1)
    assert len(ev.obs.ran_while_paused) == 4 and ev.trusted.windows == 3
    assert ev.obs.ran_while_paused[-1] == "the empty window of warm-up round -1 was disturbed 3 times: timing stopped"
