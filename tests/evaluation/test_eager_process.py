"""Eager's windows in a process of their own (harness/evaluation/eager_process.py), on the CPU at the small sizes: the
honest submission passes as with the trusted process timing eager, the timed-window cheats are still caught against
it, a plan without room keeps eager in the trusted process, and its failures are the harness's."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from harness.evaluation import eager_process
from harness.evaluation.eager_process import EagerProcess
from harness.evaluation.handles import CandidateStopped, TrustedFailed
from harness.evaluation.protocol import Window
from harness.evaluation.runner import EvalOptions, evaluate
from harness.schema import ChildError, ChildExit, MemoryPlan, Observations
from harness.verdicts import Phase, Verdict

from ..conftest import SUBMISSIONS
from .corpus import CORPUS
from .test_corpus import _check, _plan, _twin_passes

# The corpus entries that cheat in the timed windows or against the pause, where eager's windows run elsewhere now.
TIMED = ["forged fingerprints", "constant with the right sums once timed",
         "half a window computed, the rest when asked", "SIGCONT timer lifting the pause"]
ENTRIES = [e for e in CORPUS if e.name in TIMED]
assert len(ENTRIES) == len(TIMED), {e.name for e in ENTRIES} ^ set(TIMED)


@pytest.fixture(scope="module")
def own(settings):
    """Eager's own process with windows that make their own inputs (CUDA's default)."""
    return settings.model_copy(update={"eager_process_cpu": "own", "window_inputs_staged_cpu": False})


def test_eager_in_its_own_process_passes_the_honest_submission_with_every_window_fingerprinted(own, settings,
                                                                                               registry):
    text = (SUBMISSIONS / "l75_pytorch_correct.py").read_text()
    r = evaluate(registry.get("level2/75"), text, EvalOptions(device="cpu", size="small"), own)
    assert r.verdict == Verdict.passed, r.message
    o = r.observations
    assert o.eager_process == "own" and o.eager_process_note is None
    assert "eager_ready" in o.phases
    assert o.eager_timing is not None and o.candidate_timing is not None
    assert o.eager_timing.n == o.candidate_timing.n and o.eager_timing.paired_speedup is not None
    check = o.timed_outputs
    assert check is not None and check.fingerprinted and not check.fingerprint_mismatches
    assert len(check.reference_fingerprint_own_ms) == len(check.fingerprint_ms) == o.candidate_timing.n
    job = r.job_dir
    assert job is not None and (Path(job) / "eager.log").exists()
    # Eager in the trusted process, where the settings ask for it: said so.
    trusted = settings.model_copy(update={"eager_process_cpu": "trusted"})
    r = evaluate(registry.get("level2/75"), text, EvalOptions(device="cpu", size="small"), trusted)
    assert r.verdict == Verdict.passed and r.observations.eager_process == "trusted", r.message


def test_staged_windows_give_eagers_process_a_window_segment_the_candidate_never_maps(own, registry):
    """Staged, eager's own process takes its windows' inputs from a window segment of its own, as the candidate does
    from its own: the honest submission passes, every window fingerprinted. With one segment for both, the corpus's
    content-keyed cache read its window's inputs in its lead-in where eager's window had run first in the round, and
    was timed at 0.51 ms a call, not its 20: it must be caught here, and the forged window's constant too."""
    staged = own.model_copy(update={"window_inputs_staged_cpu": True})  # the CPU's default
    text = (SUBMISSIONS / "l75_pytorch_correct.py").read_text()
    r = evaluate(registry.get("level2/75"), text, EvalOptions(device="cpu", size="small"), staged)
    assert r.verdict == Verdict.passed, r.message
    o = r.observations
    assert o.eager_process == "own" and o.eager_process_note is None and o.windows_unstaged is None
    assert "lead_ins" in o.phases
    check = o.timed_outputs
    assert check is not None and check.fingerprinted and not check.fingerprint_mismatches
    for name in ("content-keyed cache", "constant with the right sums once timed"):
        e = next(x for x in CORPUS if x.name == name)
        spec, text, options = _plan(e.problem, e.fixture, e.problems_dir)
        r = evaluate(spec, text, EvalOptions(device="cpu", **options), staged)
        assert r.observations.eager_process == "own" or r.verdict.value != "passed", r.observations.eager_process
        _check(e, r)


def test_untimed_evaluations_start_no_process_for_eager(own, registry):
    text = (SUBMISSIONS / "l75_pytorch_correct.py").read_text()
    r = evaluate(registry.get("level2/75"), text, EvalOptions(device="cpu", size="small", timing=False), own)
    assert r.verdict == Verdict.passed, r.message
    assert r.observations.eager_process is None and "eager_ready" not in r.observations.phases


@pytest.mark.parametrize("e", ENTRIES, ids=[e.name for e in ENTRIES])
def test_timed_window_cheats_are_caught_against_eagers_own_process(own, e):
    spec, text, options = _plan(e.problem, e.fixture, e.problems_dir)
    r = evaluate(spec, text, EvalOptions(device="cpu", **options), own)
    assert r.observations.eager_process == "own" or r.verdict.value != "passed", r.observations.eager_process
    _check(e, r)


@pytest.mark.parametrize("path", sorted({e.twin for e in ENTRIES}))
def test_their_honest_twins_pass_against_eagers_own_process(own, path):
    e = next(x for x in ENTRIES if x.twin == path)
    spec, text, options = _plan(e.problem, path, e.problems_dir)
    r = evaluate(spec, text, EvalOptions(device="cpu", **options), own)
    assert r.observations.eager_process == "own"
    _twin_passes(r, path)


def _plan_of(budget: int | None, needs: int, windows: int, reserve: int) -> MemoryPlan:
    return MemoryPlan(fits=True, message="", budget_bytes=budget, needs_bytes=needs, reserve_bytes=reserve,
                      phases_bytes={"candidate_windows": windows})


def test_eagers_own_process_needs_room_for_a_second_window_share_and_a_reserve():
    assert eager_process.fits(None) and eager_process.fits(_plan_of(None, 10 << 30, 1 << 30, 1 << 30))
    assert eager_process.fits(_plan_of(12 << 30, 10 << 30, 1 << 30, 1 << 30))
    assert not eager_process.fits(_plan_of(12 << 30 - 1, 10 << 30, 1 << 30, 1 << 30))
    # Staged, its inputs come through a window segment of its own: one window's inputs more (4 calls of 256 MiB).
    staged = _plan_of(13 << 30, 10 << 30, 1 << 30, 1 << 30).model_copy(update={"calls_per_window": 4,
                                                                               "input_bytes": 256 << 20})
    assert eager_process.fits(staged, staged=True)
    assert not eager_process.fits(staged.model_copy(update={"budget_bytes": (13 << 30) - 1}), staged=True)
    assert eager_process.fits(staged.model_copy(update={"budget_bytes": (13 << 30) - 1}))


def test_no_room_on_the_device_keeps_eager_in_the_trusted_process_and_says_why(own, registry, monkeypatch):
    monkeypatch.setattr(eager_process, "fits", lambda plan, staged=False: False)
    text = (SUBMISSIONS / "l75_pytorch_correct.py").read_text()
    r = evaluate(registry.get("level2/75"), text, EvalOptions(device="cpu", size="small"), own)
    assert r.verdict == Verdict.passed, r.message
    assert r.observations.eager_process == "trusted" and r.observations.eager_process_note == eager_process.NO_ROOM


class _Stopping:
    """A candidate handle whose process said an error and ended."""

    def __init__(self):
        self.obs = Observations(candidate_error=ChildError(phase="timing", exc_type="RuntimeError",
                                                           message="CUDA error: an illegal memory access"))
        self.exit = ChildExit(phase=Phase.timing)
        self.sent_at = 0.0

    def request(self, *args, **kwargs):
        raise CandidateStopped

    def await_imported(self, *args):
        raise CandidateStopped


def test_a_failure_of_eagers_own_process_is_the_harnesss_with_what_it_said():
    eager = EagerProcess(_Stopping())  # type: ignore[arg-type]
    with pytest.raises(TrustedFailed, match="eager's own process failed at 'window': RuntimeError: CUDA error"):
        eager.request(Window(seeds=[1], forward_seeds=[2]), 1.0)
    with pytest.raises(TrustedFailed, match="at 'import'"):
        eager.imported(1.0, 1.0)


def test_eagers_readying_failure_is_raised_where_the_rounds_wait_for_it():
    """Made ready in a thread beside the trials, eager's failure is still the harness's, raised to the evaluation."""
    eager = EagerProcess(_Stopping())  # type: ignore[arg-type]
    eager.begin_ready([], 1.0, 1.0, 1.0, (1, 2, 3), (1e-4, 1e-4))
    with pytest.raises(TrustedFailed, match="eager's own process failed at 'import': RuntimeError: CUDA error"):
        eager.await_ready()


class _Importing:
    """A handle whose process is still importing when the evaluation ends (the candidate failed its trials first)."""

    def __init__(self):
        self.obs, self.exit, self.sent_at, self.ended = Observations(), ChildExit(phase=Phase.compile), 0.0, False
        self.killed, self.said_exit = threading.Event(), False
        self.proc = self  # Candidate.proc: the process itself

    def await_imported(self, *args):
        self.killed.wait(10)
        raise CandidateStopped

    def kill(self):
        self.killed.set()

    def stop(self):  # `exit` on the channel the readying thread is using
        self.said_exit = True

    def finish(self):
        self.ended = True


def test_an_eager_process_still_being_readied_is_killed_not_told_to_exit():
    """The readying thread owns the channel while it runs: `exit` written beside its commands could interleave with
    them, so a process still being made ready is killed, the thread's failure let go, and it ends all the same."""
    handle = _Importing()
    eager = EagerProcess(handle)  # type: ignore[arg-type]
    eager.begin_ready([], 30.0, 30.0, 30.0, (1, 2, 3), (1e-4, 1e-4))
    eager.finish()
    assert handle.killed.is_set() and not handle.said_exit and handle.ended
    assert eager._readying is None or not eager._readying.is_alive()


def test_eagers_process_is_made_ready_before_the_candidates_trials_and_waited_for_after_the_judge(own, registry,
                                                                                                  monkeypatch):
    """Its build and first calls overlap the trials and the judge: begun before the first trial, waited for after the
    judge (on an H100 the build after the judge was 0.55-0.72 s of a warm level2/75 evaluation)."""
    from harness.evaluation import runner

    events: list[str] = []
    for cls, name in ((EagerProcess, "begin_ready"), (EagerProcess, "await_ready"),
                      (runner._Evaluation, "run_trials"), (runner._Evaluation, "judge")):
        real = getattr(cls, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):
            events.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, spy)
    text = (SUBMISSIONS / "l75_pytorch_correct.py").read_text()
    r = evaluate(registry.get("level2/75"), text, EvalOptions(device="cpu", size="small"), own)
    assert r.verdict == Verdict.passed, r.message
    assert events == ["begin_ready", "run_trials", "judge", "await_ready"]


def test_a_candidate_judged_wrong_ends_eagers_process_made_ready_beside_its_trials(own, registry):
    """Eager's process, built beside the trials, ends with the evaluation whose candidate failed them: the verdict is
    the candidate's, nothing the harness's."""
    text = (SUBMISSIONS / "l75_shape_b1.py").read_text()
    r = evaluate(registry.get("level2/75"), text, EvalOptions(device="cpu", size="small"), own)
    assert r.verdict in (Verdict.shape_mismatch, Verdict.wrong_answer), r.message
    assert r.observations.reference_error is None
    assert "eager_ready" not in r.observations.phases  # never waited for: no rounds
    job = r.job_dir
    assert job is not None and (Path(job) / "eager.log").exists()
