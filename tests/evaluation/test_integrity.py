"""Integrity checks (issue 6 work in progress): each exploit fixture gets its flag; honest twins pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.evaluation import windows
from harness.evaluation.runner import EvalOptions, evaluate
from harness.problems import get_registry
from harness.verdicts import Verdict

ADVERSARIAL = Path(__file__).parents[1] / "fixtures" / "adversarial"


def _run(settings, problem: str, name: str, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("size", "small")
    return evaluate(get_registry().get(problem), (ADVERSARIAL / name).read_text(), EvalOptions(**kw), settings)


@pytest.mark.parametrize("deferred", [True, False])
def test_call_counting_fast_path_is_caught_by_checking_timed_outputs(settings, monkeypatch, deferred):
    """The hand-overs compared after the rounds (their bytes within HANDOVER_BYTES) or each at once (past it)."""
    if not deferred:
        monkeypatch.setattr(windows, "HANDOVER_BYTES", 0)
    r = _run(settings, "level2/30", "call_counting_fast_path.py")
    assert r.verdict == Verdict.flagged, r.message
    assert [f.check for f in r.flags] == ["timed_outputs"]
    check = r.observations.timed_outputs
    assert check.checked and all(c.outputs[0].max_abs_err > 1e-4 for c in check.calls)
    assert len(check.calls) == check.expected == check.reported


def test_honest_model_passes_the_timed_output_check(run_fixture):
    r = run_fixture("level2/30", "l30_pytorch_correct.py")
    assert r.verdict == Verdict.passed, r.message
    check = r.observations.timed_outputs
    assert check.reported == check.expected and check.checked and all(c.outputs[0].max_abs_err <= 1e-4
                                                                       for c in check.calls)


def test_patching_the_timers_is_flagged_by_the_static_precheck(settings):
    r = _run(settings, "level2/30", "timer_patch.py")
    assert r.verdict == Verdict.flagged, r.message
    assert {f.check for f in r.flags} == {"static:monkey_patch"}
    assert "torch.cuda.Event.elapsed_time" in r.log_excerpt and "time.perf_counter_ns" in r.log_excerpt
    # The parent's clock is out of the patch's reach: the windows took real time (net of the empty window, a call
    # this small can come to about 0 on a loaded host; the raw time per call cannot).
    assert r.observations.candidate_timing.raw_median_ms > 0.01


def test_walking_the_callers_frames_is_flagged_and_finds_nothing(settings):
    r = _run(settings, "level2/30", "frame_walk.py")
    assert r.verdict == Verdict.flagged and {f.check for f in r.flags} == {"static:introspection"}


def test_a_structural_failure_is_not_hidden_behind_a_static_flag(run_fixture):
    r = run_fixture("level2/30", "l30_hang_forward.py", run_timeout_s=5)  # imports subprocess, then hangs
    assert r.verdict == Verdict.timeout
    assert [f.rule for f in r.observations.static_findings] == ["subprocess"]


def test_windows_too_noisy_to_rank_pass_marked_timing_unreliable(settings):
    r = _run(settings, "level2/30", "erratic_timing_honest.py", compile_baseline="off")
    assert r.verdict == Verdict.passed, r.message
    (detail,) = [f.detail for f in r.flags if f.check == "timing_unreliable"]
    # Marked for the candidate's own windows: spread over the limit, or sized down on its slow warm-up windows
    # (on a loaded 2-core host its three timed windows once spread only 4%, and it was marked all the same).
    assert "candidate" in detail, detail


def test_a_tolerance_that_outputs_computing_nothing_pass_is_degenerate_and_the_result_unranked(settings):
    """Softmax over 4096 columns: every output is about 2.4e-4, so at KernelBench v0.1's 1e-2 zeros pass."""
    from harness.problems.spec import V01_TOLERANCE

    spec = get_registry(Path(__file__).parents[1] / "fixtures" / "problems").get("level1/23")
    text = (ADVERSARIAL / "constant_once_timed_honest.py").read_text()
    loose = evaluate(spec, text, EvalOptions(device="cpu", tolerance=V01_TOLERANCE, timing=False), settings)
    assert loose.verdict == Verdict.passed, loose.message
    assert [f.check for f in loose.flags] == ["degenerate_tolerance"]
    assert "zeros" in loose.flags[0].detail and "row mean" in loose.flags[0].detail
    strict = evaluate(spec, text, EvalOptions(device="cpu", timing=False), settings)  # 1e-4: nothing trivial passes
    assert strict.verdict == Verdict.passed and strict.flags == []
    assert {t.kind for t in strict.observations.trivial_outputs} == {"zeros", "constant", "row mean"}


def test_an_output_constant_along_its_rows_is_not_degenerate_at_the_strict_tolerance(run_fixture):
    """level2/75's output has a last dimension of 1: each row's mean is the output itself, which proves nothing
    about the tolerance (on the H100 at the default size it was once flagged degenerate for that)."""
    r = run_fixture("level2/75", "l75_pytorch_correct.py", timing=False)
    assert r.verdict == Verdict.passed and "degenerate_tolerance" not in [f.check for f in r.flags]
    assert {t.kind for t in r.observations.trivial_outputs} == {"zeros", "constant"}


def test_a_single_number_output_is_not_degenerate_for_being_its_own_mean(settings):
    """KernelBench's losses (level1/94 to 100) output one number: its mean is itself, so it proves nothing."""
    spec = get_registry(Path(__file__).parents[1] / "fixtures" / "problems").get("level1/94")
    text = spec.source().replace("class Model(", "class ModelNew(")
    r = evaluate(spec, text, EvalOptions(device="cpu", timing=False), settings)
    assert r.verdict == Verdict.passed and r.flags == [], r.message
    assert [t.kind for t in r.observations.trivial_outputs] == ["zeros"]
