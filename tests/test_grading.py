"""Pure grading: verdicts from stored figures, and re-grading under another tolerance."""

from __future__ import annotations

import random
import traceback

import pytest

from harness.grading import grade, required_atol, summarise_traceback, within_tolerance
from harness.schema import (
    RTOL_GRID,
    ChildError,
    ChildExit,
    Observations,
    OutputFigures,
    TimingStats,
    Tolerance,
    TrialFigures,
)
from harness.verdicts import Phase, Verdict, classify_exception


def _figures(pairs: list[tuple[float, float]], **extra) -> OutputFigures:
    """Figures the judge would record for elementwise (got, expected) pairs."""
    diffs = [abs(a - b) for a, b in pairs]
    worst = max(range(len(pairs)), key=lambda i: diffs[i] / (1 + abs(pairs[i][1])))
    return OutputFigures(
        index=0, got_type="Tensor", got_shape=[len(pairs)], got_dtype="float32", expected_shape=[len(pairs)],
        expected_dtype="float32", nonfinite_mismatches=0, numel=len(pairs), max_abs_err=max(diffs),
        max_rel_err=max(d / (1 + abs(b)) for d, (_, b) in zip(diffs, pairs, strict=True)),
        min_atol_at_rtol={f"{r:g}": max(max(d - r * abs(b), 0.0) for d, (_, b) in zip(diffs, pairs, strict=True))
                          for r in RTOL_GRID},
        worst_index=[worst], worst_got=pairs[worst][0], worst_expected=pairs[worst][1], **extra,
    )


def _allclose(pairs, tol: Tolerance) -> bool:
    return all(abs(a - b) <= tol.atol + tol.rtol * abs(b) for a, b in pairs)


def _obs(fig: OutputFigures, **kw) -> Observations:
    return Observations(candidate_exit=ChildExit(finished=True), trials_expected=1,
                        trials=[TrialFigures(trial=0, outputs=[fig])], **kw)


def test_regrading_with_a_looser_tolerance_turns_wrong_answer_into_passed():
    obs = _obs(_figures([(1.0, 1.0 + 5e-3), (2.0, 2.0)]))
    assert grade(obs, Tolerance(atol=1e-4, rtol=1e-4)).verdict == Verdict.wrong_answer
    assert grade(obs, Tolerance(atol=1e-2, rtol=1e-2)).verdict == Verdict.passed


@pytest.mark.parametrize("seed", range(20))
def test_stored_figures_never_pass_what_allclose_fails(seed):
    rng = random.Random(seed)
    pairs = [(b + rng.gauss(0, 10 ** rng.uniform(-6, -2)), b) for b in (rng.uniform(-50, 50) for _ in range(200))]
    fig = _figures(pairs)
    for _ in range(50):
        tol = Tolerance(atol=10 ** rng.uniform(-6, -1), rtol=rng.choice([0.0, 10 ** rng.uniform(-6, -1)]))
        if within_tolerance(fig, tol):
            assert _allclose(pairs, tol), tol
        if tol.atol == tol.rtol or f"{tol.rtol:g}" in fig.min_atol_at_rtol:
            assert within_tolerance(fig, tol) == _allclose(pairs, tol)  # exact on the grid and on atol == rtol


def _figures_with_truth(triples: list[tuple[float, float, float]]) -> OutputFigures:
    """Figures for elementwise (got, expected, float64 truth) triples, the rule "within the tolerance of the
    reference or of the truth" included, as the judge records them."""
    fig = _figures([(a, b) for a, b, _ in triples])
    fig.max_rel_err_or_fp64 = max(min(abs(a - b) / (1 + abs(b)), abs(a - g) / (1 + abs(g))) for a, b, g in triples)
    fig.min_atol_at_rtol_or_fp64 = {f"{r:g}": max(max(min(abs(a - b) - r * abs(b), abs(a - g) - r * abs(g)), 0.0)
                                                  for a, b, g in triples) for r in RTOL_GRID}
    return fig


def _either_close(triples, tol: Tolerance) -> bool:
    return all(abs(a - b) <= tol.atol + tol.rtol * abs(b) or abs(a - g) <= tol.atol + tol.rtol * abs(g)
               for a, b, g in triples)


@pytest.mark.parametrize("seed", range(20))
def test_stored_figures_never_pass_an_element_within_the_tolerance_of_neither_reference_nor_truth(seed):
    """The reference is off its float64 truth by its own rounding; the candidate by its own. What the stored figures
    pass, every element passes against one of the two; exactly so on the grid of rtols and where atol == rtol."""
    rng = random.Random(seed)
    triples = []
    for _ in range(200):
        g = rng.uniform(-50, 50)
        b = g + rng.gauss(0, 10 ** rng.uniform(-7, -3))
        triples.append((g + rng.gauss(0, 10 ** rng.uniform(-7, -2)), b, g))
    fig = _figures_with_truth(triples)
    for _ in range(50):
        tol = Tolerance(atol=10 ** rng.uniform(-6, -1), rtol=rng.choice([0.0, 10 ** rng.uniform(-6, -1)]))
        if within_tolerance(fig, tol):
            assert _either_close(triples, tol), tol
        if tol.atol == tol.rtol or f"{tol.rtol:g}" in fig.min_atol_at_rtol_or_fp64:
            assert within_tolerance(fig, tol) == _either_close(triples, tol)


def test_between_grid_points_the_truths_rule_takes_the_lower_points_figure_not_a_chord():
    """max over elements of min(two errors) is not convex in rtol: a chord between grid points could lie under it and
    pass an element within the tolerance of neither. Here the chord at rtol 5e-4 says 1.7e-4, the figure at 1e-4
    says 3e-4: at atol 2e-4 it fails."""
    table = {"0": 3e-4, "1e-05": 3e-4, "0.0001": 3e-4, "0.001": 0.0, "0.01": 0.0, "0.1": 0.0}
    fig = _figures([(1.0, 1.0 + 5e-3)]).model_copy(update={"max_rel_err_or_fp64": 3e-4,
                                                          "min_atol_at_rtol_or_fp64": table})
    assert not within_tolerance(fig, Tolerance(atol=2e-4, rtol=5e-4))
    assert within_tolerance(fig, Tolerance(atol=1e-9, rtol=1e-3))


def test_an_element_within_the_tolerance_of_the_truth_passes_and_the_message_says_so():
    """Two fp32 orders of one long sum, then a normalisation: the reference is 1.5e-4 off the truth at one element,
    the candidate 0.3e-4 the other way. Against the reference alone it would fail; it passes, saying why. Results
    stored before the truth's figures are graded against the reference alone, and a NaN is never rescued."""
    tol = Tolerance(atol=1e-4, rtol=1e-4)
    fig = _figures_with_truth([(0.5 - 0.3e-4, 0.5 + 1.5e-4, 0.5), (2.0, 2.0, 2.0)])
    g = grade(_obs(fig), tol)
    assert g.verdict == Verdict.passed, g.message
    assert "trial 0 within the tolerance of the float64 truth" in g.message
    stored_before = fig.model_copy(update={"max_rel_err_or_fp64": None, "min_atol_at_rtol_or_fp64": None})
    assert grade(_obs(stored_before), tol).verdict == Verdict.wrong_answer
    assert grade(_obs(fig.model_copy(update={"nonfinite_mismatches": 1})), tol).verdict == Verdict.wrong_answer
    closer_to_neither = _figures_with_truth([(0.5 + 4e-4, 0.5 + 1.5e-4, 0.5)])
    assert grade(_obs(closer_to_neither), tol).verdict == Verdict.wrong_answer


def test_required_atol_is_exact_on_the_grid():
    pairs = [(1.0, 1.001), (10.0, 10.05)]
    fig = _figures(pairs)
    assert required_atol(fig, 1e-3) == pytest.approx(max(0.001 - 1e-3 * 1.001, 0.05 - 1e-3 * 10.05))


def test_nan_where_the_reference_is_finite_fails_at_any_tolerance():
    fig = _figures([(1.0, 1.0)]).model_copy(update={"nonfinite_mismatches": 1})
    assert grade(_obs(fig), Tolerance(atol=1.0, rtol=1.0)).verdict == Verdict.wrong_answer


def test_lower_precision_than_the_reference_is_flagged_but_passes_a_loose_tolerance():
    fig = _figures([(1.0, 1.0 + 3e-4)], err_vs_fp64=3e-4, ref_err_vs_fp64=1e-7)
    g = grade(_obs(fig), Tolerance(atol=1e-2, rtol=1e-2))
    assert g.verdict == Verdict.passed
    assert [f.check for f in g.flags] == ["precision_below_fp32"]


def test_speedups_come_from_medians():
    def stats(ms):
        return TimingStats(clock="cuda_event", n=3, median_ms=ms, mean_ms=ms, min_ms=ms, max_ms=ms, std_ms=0.0)

    obs = _obs(_figures([(1.0, 1.0)]), candidate_timing=stats(2.0), eager_timing=stats(3.0),
               compile_timing=stats(2.5))
    g = grade(obs, Tolerance(atol=1e-4, rtol=1e-4))
    assert g.speedup_vs_eager == pytest.approx(1.5) and g.speedup_vs_compile == pytest.approx(1.25)


def test_early_clean_exit_is_crashed_and_timeouts_name_their_phase():
    exited = Observations(candidate_exit=ChildExit(returncode=0, finished=False, phase=Phase.compile))
    assert grade(exited, Tolerance(atol=1e-4, rtol=1e-4)).verdict == Verdict.crashed
    hung = Observations(candidate_exit=ChildExit(timed_out=True, deadline_s=5, phase=Phase.timing))
    g = grade(hung, Tolerance(atol=1e-4, rtol=1e-4))
    assert g.verdict == Verdict.timeout and "timing phase" in g.message and "5 s" in g.message


def test_infra_failure_is_never_the_submissions_fault():
    g = grade(Observations(reference_error="trusted process died"), Tolerance(atol=1e-4, rtol=1e-4))
    assert g.verdict == Verdict.infra_error and not g.verdict.is_submission_fault


@pytest.mark.parametrize("phase, exc, msg, verdict", [
    (Phase.correctness, "RuntimeError", "CUDA error: an illegal memory access was encountered", Verdict.crashed),
    (Phase.correctness, "AcceleratorError", "CUDA error: unspecified launch failure", Verdict.crashed),
    (Phase.compile, "RuntimeError", "Error building extension 'x': nvcc error", Verdict.compile_error),
    (Phase.correctness, "RuntimeError", "Error building extension 'x'", Verdict.runtime_error),
    (Phase.correctness, "SystemExit", "the submission called sys.exit(0)", Verdict.crashed),
    (Phase.correctness, "ValueError", "bad shape", Verdict.runtime_error),
])
def test_the_one_exception_classifier(phase, exc, msg, verdict):
    assert classify_exception(phase, exc, msg) == verdict


def test_compile_error_message_quotes_the_first_compiler_error():
    err = ChildError(phase=Phase.compile, exc_type="RuntimeError", message=(
        "Error building extension 'k': [1/2] nvcc -c k.cu\nk.cu(12): error: identifier \"foo\" is undefined\n"
        "1 error detected\nninja: build stopped: subcommand failed."))
    g = grade(Observations(candidate_error=err), Tolerance(atol=1e-4, rtol=1e-4))
    assert g.verdict == Verdict.compile_error
    assert g.message == 'compilation failed: k.cu(12): error: identifier "foo" is undefined'


def _raise_in_the_harness() -> None:
    try:
        {}["device"]
    except KeyError:
        raise RuntimeError("probing device 'cuda' failed: no answer within 60 s") from None


def _traceback_of(fn) -> str:
    try:
        fn()
    except Exception:
        return traceback.format_exc()
    raise AssertionError("expected an exception")


def test_a_reference_side_failure_says_the_exception_and_where_not_traceback_most_recent_call_last():
    tb = _traceback_of(_raise_in_the_harness)
    g = grade(Observations(reference_error=tb), Tolerance(atol=1e-4, rtol=1e-4))
    assert g.verdict == Verdict.infra_error
    line = _raise_in_the_harness.__code__.co_firstlineno + 4
    assert g.message == ("the harness's reference side failed: RuntimeError: probing device 'cuda' failed: "
                         f"no answer within 60 s (at {__file__}:{line} in _raise_in_the_harness)")
    assert g.log_excerpt == tb.strip()  # the whole traceback stays in the log


def test_a_chained_traceback_is_summarised_by_its_last_exception():
    def chained():
        try:
            int("x")
        except ValueError as e:
            raise OSError("disk full") from e

    summary = summarise_traceback("OSError: disk full\n" + _traceback_of(chained))  # as the runner writes it
    line = chained.__code__.co_firstlineno + 4  # the raise of OSError, not the int() of the cause
    assert summary == f"OSError: disk full (at {__file__}:{line} in chained)"


def test_the_line_above_a_traceback_is_kept_as_context():
    ended = "the trusted process ended (code 1) during 'construct':\n" + _traceback_of(_raise_in_the_harness)
    assert summarise_traceback(ended).startswith(
        "the trusted process ended (code 1) during 'construct': RuntimeError: probing device")


def test_a_reference_error_without_a_traceback_is_its_first_line():
    assert summarise_traceback("no answer to 'construct' within 60 s") == "no answer to 'construct' within 60 s"
    assert summarise_traceback("\n") == "(no message)"
