"""Integrity checks (issue 6 work in progress): each exploit fixture gets its flag; honest twins pass."""

from __future__ import annotations

from pathlib import Path

from harness.problems import get_registry
from harness.sandbox.runner import EvalOptions, evaluate
from harness.verdicts import Verdict

ADVERSARIAL = Path(__file__).parents[1] / "fixtures" / "adversarial"


def _run(settings, problem: str, name: str, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("size", "small")
    return evaluate(get_registry().get(problem), (ADVERSARIAL / name).read_text(), EvalOptions(**kw), settings)


def test_call_counting_fast_path_is_caught_by_checking_timed_outputs(settings):
    r = _run(settings, "level2/30", "call_counting_fast_path.py")
    assert r.verdict == Verdict.flagged, r.message
    assert [f.check for f in r.flags] == ["timed_outputs"]
    assert r.observations.timed_outputs.checked and r.observations.timed_outputs.mismatches


def test_honest_model_passes_the_timed_output_check(run_fixture):
    r = run_fixture("level2/30", "l30_pytorch_correct.py")
    assert r.verdict == Verdict.passed, r.message
    check = r.observations.timed_outputs
    assert check.reported == check.expected and check.checked and not check.mismatches
