"""A slot's warm trusted process (harness/evaluation/warm.py): kept between evaluations of one problem, it changes no
verdict and carries nothing of one evaluation into the next. CPU, small sizes."""

from __future__ import annotations

import time

import pytest

from harness.evaluation.runner import EvalOptions, evaluate
from harness.evaluation.warm import TrustedPool
from harness.verdicts import Verdict

from ..conftest import SUBMISSIONS


@pytest.fixture
def pool(settings):
    p = TrustedPool(settings)
    yield p
    p.close()


def _run(registry, settings, problem: str, name: str, pool: TrustedPool, **kw):
    options = EvalOptions(device="cpu", size="small", trusted_pool=pool, **kw)
    return evaluate(registry.get(problem), (SUBMISSIONS / name).read_text(), options, settings)


def _drawn(result) -> dict[int, float | None]:
    """The reference's value at each trial's worst element: differs where the inputs or parameters do."""
    return {t.trial: t.outputs[0].worst_expected for t in result.observations.trials}


def test_a_warm_trusted_process_serves_the_next_evaluation_of_the_problem_with_the_same_verdicts(
        registry, settings, pool):
    first = _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool)
    assert first.verdict == Verdict.passed, first.message + first.log_excerpt
    assert not first.observations.trusted_warm and pool.started == 1 and len(pool.kept) == 1
    # Warm: no trusted start and no probe, and the honest submission still passes, the wrong one still fails.
    second = _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool)
    assert second.verdict == Verdict.passed, second.message + second.log_excerpt
    assert second.observations.trusted_warm and pool.started == 1 and pool.reused == 1
    assert "probe" not in second.observations.phases
    assert second.observations.phases["reference_start"] < first.observations.phases["reference_start"]
    wrong = _run(registry, settings, "level2/30", "l30_guessed_hardtanh.py", pool)
    assert wrong.verdict == Verdict.wrong_answer and wrong.observations.trusted_warm, wrong.message
    affine = _run(registry, settings, "level2/30", "l30_drops_affine.py", pool)
    assert affine.verdict == Verdict.wrong_answer, affine.message  # fresh parameters in every evaluation
    # Each evaluation drew its own inputs and parameters: the expected outputs differ from one to the next.
    assert _drawn(first) != _drawn(second)
    assert second.provenance is not None and second.provenance.device == "cpu"


def test_the_warm_reference_is_the_state_as_built_each_time_not_the_last_evaluations(registry, settings, pool):
    """Fresh parameters are drawn from the Model as built, not from the last evaluation's draw (which would drift
    each tensor's scale further with every evaluation), and KernelBench's own parameters (fresh_parameters off)
    are exactly a cold build's: with the seeds fixed, a warm evaluation's expected outputs are a cold one's."""
    for fresh in (True, False):
        cold = _run(registry, settings, "level2/30", "l30_pytorch_correct.py", None, fresh_parameters=fresh, seed=7)
        _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool, seed=7)
        warm = _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool, fresh_parameters=fresh, seed=7)
        assert warm.observations.trusted_warm
        assert warm.verdict == cold.verdict == Verdict.passed
        assert _drawn(warm) == _drawn(cold)


def test_each_problem_keeps_a_warm_process_of_its_own_up_to_the_bound(registry, settings):
    """Problems in turn (a mixed batch): each finds its own trusted process warm again; with room for one, the other
    problem's evaluation ends it (the least recently used goes)."""
    for room, warm_again in ((2, True), (1, False)):
        pool = TrustedPool(settings.model_copy(update={"warm_trusted_per_slot": room}))
        try:
            _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool)
            other = _run(registry, settings, "level2/75", "l75_pytorch_correct.py", pool)
            again = _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool)
        finally:
            pool.close()
        assert other.verdict == again.verdict == Verdict.passed, (other.message, again.message)
        assert not other.observations.trusted_warm and again.observations.trusted_warm == warm_again
        assert pool.started == (2 if warm_again else 3) and pool.reused == (1 if warm_again else 0)


def test_the_pools_idle_processes_are_its_kept_trusted_ones_and_none_serving(registry, settings):
    """Between evaluations the pool's warm trusted processes run nothing: it names them (a GPU's list of processes
    shows them beside an evaluation's own, gpu_sharing.sharing); the one an evaluation takes is no longer idle."""
    pool = TrustedPool(settings.model_copy(update={"warm_trusted_per_slot": 2}))
    try:
        assert pool.idle_processes() == []
        _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool)
        _run(registry, settings, "level2/75", "l75_pytorch_correct.py", pool)
        kept = {key: warm.trusted.proc.proc.pid for key, warm in pool.kept.items()}
        assert len(kept) == 2 and set(kept.values()) <= set(pool.idle_processes())
        taken = pool.take(next(iter(kept)))
        assert taken is not None and taken.trusted.proc.proc.pid not in pool.idle_processes()
        pool.keep(taken)
    finally:
        pool.close()


def test_a_trusted_side_that_failed_is_never_kept(registry, settings, pool, monkeypatch):
    from harness.evaluation import runner
    from harness.evaluation.handles import TrustedFailed

    def fail(self):
        raise TrustedFailed("the judge failed")

    _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool)
    with monkeypatch.context() as m:
        m.setattr(runner._Evaluation, "judge", fail)
        r = _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool)
    assert r.verdict == Verdict.infra_error and r.observations.trusted_warm
    assert not pool.kept  # ended, not kept
    after = _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool)
    assert after.verdict == Verdict.passed and not after.observations.trusted_warm and pool.started == 2


def test_an_evaluation_cut_short_while_its_hand_overs_are_compared_keeps_its_trusted_process_in_step(
        registry, settings, pool, monkeypatch):
    """The hand-overs are compared after the timed rounds, while the candidate is traced and ends. Where the candidate
    stops in its trace, the trusted side's answer is still collected: the process is kept warm and in step, and the
    next evaluation gets its own answers, not the last one's."""
    from harness.evaluation import runner
    from harness.evaluation.handles import CandidateStopped

    def stopped(self):
        assert self.rounds is not None and self.rounds.checks.comparing  # the comparison is under way
        raise CandidateStopped

    _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool)
    with monkeypatch.context() as m:
        m.setattr(runner._Evaluation, "trace_kernels", stopped)
        cut = _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool)
    assert cut.verdict != Verdict.passed and cut.observations.trusted_warm
    assert len(pool.kept) == 1 and pool.started == 1  # in step: kept
    after = _run(registry, settings, "level2/30", "l30_pytorch_correct.py", pool)
    assert after.verdict == Verdict.passed and after.observations.trusted_warm, after.message
    check = after.observations.timed_outputs
    assert check is not None and len(check.calls) == check.expected == check.reported


def test_a_candidate_started_ahead_imports_its_submission_only_when_its_evaluation_begins(registry, settings, pool):
    """The next evaluation's candidate process starts while the slot is busy: torch imported, no submission code.
    Its evaluation then waits only for the submission's own import, and gets the same verdicts."""
    from harness.evaluation.prebuild import probe_device
    from harness.evaluation.starts import prestart

    target = probe_device("cpu", settings)
    spec = registry.get("level2/30")
    text = (SUBMISSIONS / "l30_pytorch_correct.py").read_text() + "\nprint('SUBMISSION-IMPORTED', flush=True)\n"
    options = EvalOptions(device="cpu", size="small", target=target, trusted_pool=pool)
    assert prestart(spec, text, options, settings)
    (spare,) = pool.spares
    assert spare.candidate.proc.proc.poll() is None
    log = spare.job / "candidate.log"
    time.sleep(4)  # long enough for torch's import: the submission's must still wait for its evaluation
    assert spare.candidate.proc.proc.poll() is None and "SUBMISSION-IMPORTED" not in log.read_text()
    # As a worker's slot does: the next job's process starts before this evaluation begins, which takes its own.
    other_text = (SUBMISSIONS / "l30_guessed_hardtanh.py").read_text()
    assert prestart(spec, other_text, options, settings)
    (_, following) = pool.spares
    # Eager's own process started ahead beside each (the CPU's default), neither waiting on the other's build dir.
    assert spare.eager is not None and following.eager is not None
    r = evaluate(spec, text, options, settings)
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    assert "SUBMISSION-IMPORTED" in log.read_text() and pool.spares == [following]
    assert r.job_dir == str(spare.job) and not spare.work.exists()  # its own job and scratch dirs, then removed
    assert r.observations.candidate_import_s is not None and r.observations.candidate_import_s < 1.0
    # The next evaluation finds its own waiting, with the same verdict as a cold one.
    wrong = evaluate(spec, other_text, options, settings)
    assert wrong.verdict == Verdict.wrong_answer, wrong.message
    assert wrong.job_dir == str(following.job) and not pool.spares
    assert wrong.observations.candidate_import_s is not None and wrong.observations.candidate_import_s < 1.0

    # A spare no evaluation takes is ended when newer ones replace it, or when the pool ends. One of a source whose
    # build dir another process holds (a spare of the same source waiting) is not started: it never waits for it.
    # The pool keeps the current evaluation's and `prestart_depth` next ones' (3): a fourth ends the first.
    names = ("l30_pytorch_correct.py", "l30_drops_affine.py", "l30_guessed_hardtanh.py", "l30_renamed_affine.py")
    assert pool.max_spares == settings.prestart_depth + 1 == len(names) - 1
    started = []
    for name in names:
        assert prestart(spec, (SUBMISSIONS / name).read_text(), options, settings)
        started.append(pool.spares[-1])
    assert not prestart(spec, (SUBMISSIONS / "l30_renamed_affine.py").read_text(), options, settings)
    assert pool.spares == started[1:] and started[0].candidate.proc.proc.poll() is not None
    assert not started[0].work.exists() and not started[0].job.exists()
    pool.close()
    assert all(s.candidate.proc.proc.poll() is not None and not s.work.exists() for s in started)
    assert not pool.spares


def test_a_trusted_process_started_ahead_serves_its_evaluation_as_a_cold_one_would(registry, settings):
    """The next problem's trusted process, started while the slot is busy (starts.prestart_trusted): torch imported,
    unprobed, no Model. Its evaluation takes it and has it build the Model under the evaluation's own seed: with the
    seeds fixed, its expected outputs are a cold evaluation's (one built under the seed it was started with would
    differ), and the verdicts are the same. A pool that keeps none warm ends it with its evaluation."""
    from harness.evaluation.starts import prestart_trusted

    spec = registry.get("level2/30")
    cold = _run(registry, settings, "level2/30", "l30_pytorch_correct.py", None, seed=7)
    pool = TrustedPool(settings, keep_warm=False)
    try:
        options = EvalOptions(device="cpu", size="small", trusted_pool=pool, seed=7)
        assert prestart_trusted(spec, options, settings)
        assert not prestart_trusted(spec, options, settings)  # one for its key
        (waiting,) = pool.ahead.values()
        proc = waiting.trusted.proc.proc
        assert proc.poll() is None and proc.pid in pool.idle_processes() and not waiting.probed
        ahead = evaluate(spec, (SUBMISSIONS / "l30_pytorch_correct.py").read_text(), options, settings)
        assert ahead.verdict == cold.verdict == Verdict.passed, ahead.message + ahead.log_excerpt
        assert ahead.observations.trusted_ahead and not ahead.observations.trusted_warm
        assert "probe" in ahead.observations.phases and _drawn(ahead) == _drawn(cold)
        assert pool.started == 1 and pool.reused == 0 and not pool.kept and not pool.ahead
        assert proc.poll() is not None  # ended with its evaluation: its problem does not come again
        # Started ahead for the wrong submission's evaluation: the same verdict as a cold one.
        assert prestart_trusted(spec, options, settings)
        wrong = _run(registry, settings, "level2/30", "l30_guessed_hardtanh.py", pool, seed=7)
        assert wrong.verdict == Verdict.wrong_answer and wrong.observations.trusted_ahead, wrong.message
        # Those no evaluation takes end with the pool.
        assert prestart_trusted(registry.get("level2/75"), options, settings)
        (unused,) = pool.ahead.values()
    finally:
        pool.close()
    assert unused.trusted.proc.proc.poll() is not None and not pool.ahead


def test_eagers_own_process_starts_ahead_beside_the_candidate_and_serves_its_evaluation(registry, settings):
    """Where eager runs in a process of its own, a candidate started ahead has one started beside it, in the same
    scratch dir: its evaluation takes both (no wait for eager's import there), and a spare no evaluation takes ends
    both."""
    from harness.evaluation.prebuild import probe_device
    from harness.evaluation.starts import prestart
    from harness.evaluation.warm import TrustedPool

    own = settings.model_copy(update={"eager_process_cpu": "own"})
    pool = TrustedPool(own)
    target = probe_device("cpu", own)
    spec = registry.get("level2/30")
    text = (SUBMISSIONS / "l30_pytorch_correct.py").read_text()
    options = EvalOptions(device="cpu", size="small", target=target, trusted_pool=pool)
    try:
        assert prestart(spec, text, options, own)
        (spare,) = pool.spares
        assert spare.eager is not None and spare.eager.proc.proc.proc.poll() is None
        eager = spare.eager
        time.sleep(4)  # torch imported by both
        r = evaluate(spec, text, options, own)
        assert r.verdict == Verdict.passed, r.message + r.log_excerpt
        assert r.observations.eager_process == "own" and r.observations.phases["eager_ready"] < 1.0
        assert eager.proc.ended and (spare.job / "eager.log").exists()
        assert prestart(spec, text, options, own)
        # A second job of the same problem started ahead beside it gets its eager process too, not waiting on the
        # first's: every evaluation of a problem at a size has the same eager source, and with one build dir shared
        # by them all this start waited at its lock (held until the first constructs its model) for good.
        assert prestart(spec, (SUBMISSIONS / "l30_guessed_hardtanh.py").read_text(), options, own)
        (unused, second) = pool.spares
        assert second.eager is not None and second.eager.proc.proc.proc.poll() is None
    finally:
        pool.close()
    assert unused.eager is not None and unused.eager.proc.ended and not unused.work.exists()
