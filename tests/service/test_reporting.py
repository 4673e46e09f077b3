"""fast_p and leaderboard aggregation: pure functions over scored results."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from harness.reporting import Scored, best_per_problem, fast_p, fast_p_curve, fast_p_table, leaderboard

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
_ids = iter(range(1, 10_000))


def s(problem="p1", who="a", model="m", verdict="passed", eager=None, compile_=None, minutes=0) -> Scored:
    return Scored(submission_id=next(_ids), problem_id=problem, submitter=who, model=model, verdict=verdict,
                  device="cuda", speedup_vs_eager=eager, speedup_vs_compile=compile_,
                  created_at=T0 + timedelta(minutes=minutes))


def test_fast_p_is_the_share_correct_and_faster_than_p():
    results = [s("p1", eager=2.0), s("p2", eager=1.0), s("p3", eager=0.5), s("p4", verdict="wrong_answer", eager=9.0)]
    assert fast_p(results, 0) == 0.75  # fast_0 is plain correctness
    assert fast_p(results, 0.5) == 0.5  # strictly faster: 0.5x does not count at p = 0.5
    assert fast_p(results, 1.0) == 0.25
    assert fast_p(results, 2.0) == 0.0
    assert fast_p([], 1.0) == 0.0


def test_a_correct_but_untimed_result_counts_at_p0_only():
    assert fast_p_curve([s(eager=None)]) == {"0": 1.0, "0.5": 0.0, "0.8": 0.0, "1": 0.0, "1.5": 0.0, "2": 0.0}


def test_no_compile_baseline_gives_no_compile_curve():
    assert fast_p_curve([s(eager=2.0)], "compile") is None
    assert fast_p_curve([s(eager=2.0, compile_=1.2)], "compile")["1"] == 1.0


def test_best_per_problem_prefers_correct_then_fastest():
    picks = best_per_problem([s("p1", verdict="wrong_answer", eager=5.0), s("p1", eager=1.1), s("p1", eager=1.3),
                              s("p2", verdict="timeout")])
    assert [(b.problem_id, b.verdict, b.speedup_vs_eager) for b in picks] == [("p1", "passed", 1.3),
                                                                              ("p2", "timeout", None)]


def test_leaderboard_ranks_each_problem_and_keeps_one_row_per_pair():
    rows = leaderboard([s("p1", "a", eager=1.5), s("p1", "a", eager=3.0), s("p1", "b", eager=2.0),
                        s("p1", "c", verdict="wrong_answer", eager=10.0), s("p1", "d", eager=None),
                        s("p2", "b", eager=0.9)])
    assert [(r.problem_id, r.rank, r.submitter, r.speedup_vs_eager, r.submissions) for r in rows] == [
        ("p1", 1, "a", 3.0, 2), ("p1", 2, "b", 2.0, 1), ("p1", 3, "d", None, 1), ("p2", 1, "b", 0.9, 1)]


def test_an_earlier_result_wins_a_tie():
    rows = leaderboard([s(who="late", eager=2.0, minutes=5), s(who="early", eager=2.0, minutes=1)])
    assert [r.submitter for r in rows] == ["early", "late"]


def test_fast_p_table_is_per_pair_over_the_problems_it_attempted():
    table = fast_p_table([s("p1", "a", eager=2.0, compile_=1.5), s("p2", "a", verdict="compile_error"),
                          s("p1", "b", eager=0.7, compile_=0.3)])
    a, b = table
    assert (a.submitter, a.problems, a.correct, a.fast_p_eager["1"]) == ("a", 2, 1, 0.5)
    assert a.fast_p_compile is not None and a.fast_p_compile["1.5"] == 0.0 and a.fast_p_compile["1"] == 0.5
    assert (b.submitter, b.fast_p_eager["0"], b.fast_p_eager["0.5"], b.fast_p_eager["0.8"]) == ("b", 1.0, 1.0, 0.0)


@pytest.mark.parametrize("p", [0.0, 0.5, 0.8, 1.0, 1.5, 2.0])
def test_fast_p_never_rises_with_p(p):
    results = [s(f"p{i}", eager=e) for i, e in enumerate([0.1, 0.6, 0.9, 1.2, 1.7, 2.5, None])]
    assert fast_p(results, p) >= fast_p(results, p + 0.25)


def test_a_speedup_the_harness_does_not_vouch_for_counts_as_correct_but_never_as_faster():
    # The C++ hardtanh: 18x with windows spread 160% (timing_unreliable), beside the same pair's vouched 0.13x.
    noisy = replace(s("p1", eager=18.247, compile_=9.0), flags=["timing_unreliable"])
    assert fast_p_curve([noisy]) == {"0": 1.0, "0.5": 0.0, "0.8": 0.0, "1": 0.0, "1.5": 0.0, "2": 0.0}
    for flag in ("degenerate_tolerance", "no_custom_kernel"):
        assert fast_p([replace(noisy, flags=[flag])], 1.0) == 0.0
    # A flag that does not keep a result off the boards leaves its speedup counted.
    assert fast_p([replace(noisy, flags=["precision_below_fp32"])], 2.0) == 1.0
    vouched = s("p1", eager=0.1347)
    (pick,) = best_per_problem([noisy, vouched])
    assert pick is vouched  # the measured 18x does not make it the best
    (row,) = fast_p_table([noisy, vouched])
    assert row.fast_p_eager == {"0": 1.0, "0.5": 0.0, "0.8": 0.0, "1": 0.0, "1.5": 0.0, "2": 0.0}
    assert row.fast_p_compile is not None and row.fast_p_compile["1"] == 0.0


def test_the_leaderboard_ranks_each_precision_apart():
    fp32, bf16 = s("p1", who="a", eager=2.0), replace(s("p1", who="b", eager=5.0), precision="bf16")
    same_pair_bf16 = replace(s("p1", who="a", eager=9.0), precision="bf16")
    rows = leaderboard([fp32, bf16, same_pair_bf16])
    assert [(r.precision, r.rank, r.submitter, r.speedup_vs_eager) for r in rows] == [
        ("fp32", 1, "a", 2.0), ("bf16", 1, "a", 9.0), ("bf16", 2, "b", 5.0)]
