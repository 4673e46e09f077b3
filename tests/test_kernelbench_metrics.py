"""KernelBench's metrics by KernelBench's definitions (harness/kernelbench_metrics.py), and its baseline-time
files read back (harness/kernelbench_format.py): pure functions, no DB."""

from __future__ import annotations

import math

import pytest

from harness.kernelbench_format import BaselineFileError, read_baseline
from harness.kernelbench_metrics import Sample, level_metrics, pass_at_k


def ok(problem, sample=0, ms=1.0, vouched=True):
    return Sample(problem=problem, sample=sample, compiled=True, correct=True, runtime_ms=ms, vouched=vouched)


def bad(problem, sample=0, compiled=True):
    return Sample(problem=problem, sample=sample, compiled=compiled, correct=False)


def test_rates_and_fast_p_divide_by_every_problem_of_the_level_and_take_sample_0():
    # Ten problems; results for four; problem 4's sample 1 is correct and fast but only sample 0 counts.
    m = level_metrics(1, range(1, 11), [ok(1, ms=1.0), ok(2, ms=4.0), bad(3, compiled=False), bad(4),
                                        ok(4, sample=1, ms=0.1)],
                      {n: 2.0 for n in range(1, 11)}, baseline="test")
    assert (m.problems, m.evaluated, m.compiled, m.correct) == (10, 4, 3, 2)
    assert m.compilation_rate == 0.3 and m.correctness_rate == 0.2
    assert m.fast_p == {"0": 0.2, "0.5": 0.1, "0.8": 0.1, "1": 0.1, "1.5": 0.1, "2": 0.0}
    assert math.isclose(m.geomean_speedup_correct, math.sqrt(2.0 * 0.5))
    assert m.geomean_speedup_correct_and_faster == pytest.approx(2.0)


def test_a_time_not_vouched_for_is_correct_but_never_faster_nor_in_a_geometric_mean():
    m = level_metrics(2, [1, 2], [ok(1, ms=0.1, vouched=False), ok(2, ms=1.0)], {1: 1.8, 2: 3.0}, baseline="t")
    assert m.correct == 2 and m.unvouched == 1 and m.fast_p["0"] == 1.0 and m.fast_p["1"] == 0.5
    assert m.geomean_speedup_correct == pytest.approx(3.0) and m.geomean_over == 1


def test_a_correct_result_without_a_baseline_time_is_correct_and_named():
    m = level_metrics(2, [1, 2], [ok(1), ok(2)], {1: 2.0}, baseline="t")
    assert m.fast_p["0"] == 1.0 and m.fast_p["1"] == 0.5 and m.no_baseline == [2]


def test_two_results_for_one_sample_are_an_error_not_a_guess():
    with pytest.raises(ValueError, match="2 results for sample 0"):
        level_metrics(1, [1], [ok(1), bad(1)], {}, baseline="t")


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0  # fewer than k wrong: always a correct one
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
    m = level_metrics(1, [1, 2, 3], [ok(1), bad(1, 1), bad(2), bad(2, 1), ok(3)], {}, baseline="t", ks=(1, 2))
    assert m.pass_at_k == {"pass@1": pytest.approx((0.5 + 0 + 1) / 3), "pass@2": pytest.approx((1 + 0) / 2)}
    assert m.pass_at_k_problems == {"pass@1": 3, "pass@2": 2}


def test_a_kernelbench_baseline_file_reads_back_by_level_and_problem_number():
    got = read_baseline({"level1": {"1_Square_matrix_multiplication_.py": {
        "mean": 2.66, "std": 0.0199, "min": 2.65, "max": 2.86, "num_trials": 100, "hardware": "NVIDIA H100 80GB HBM3",
        "device": "cuda:0"}}, "level2": {"75_Gemm_GroupNorm_Min_BiasAdd.py": {"mean": 0.1}}})
    assert got.times(1) == {1: 2.66} and got.times(2) == {75: 0.1} and got.times(3) == {}
    assert got.hardware() == ["NVIDIA H100 80GB HBM3"] and got.names[2][75] == "75_Gemm_GroupNorm_Min_BiasAdd.py"


@pytest.mark.parametrize(("data", "says"), [
    ([], "expected an object of levels"),
    ({"L1": {}}, "'L1': a level key is level<N>"),
    ({"level1": {"matmul.py": {"mean": 1}}}, "level1/matmul.py: a problem is named by its file"),
    ({"level1": {"1_A.py": {"std": 1}}}, "level1/1_A.py: expected statistics with a 'mean'"),
    ({"level1": {"1_A.py": {"mean": -1}}}, "level1/1_A.py mean: expected a positive finite number"),
    ({"level1": {"1_A.py": {"mean": "2.6"}}}, "expected a positive finite number, got '2.6'"),
    ({"level1": {"1_A.py": {"mean": 1, "num_trials": 0}}}, "num_trials must be a positive integer"),
    ({"level1": {"1_A.py": {"mean": 1}, "01_A.py": {"mean": 2}}}, "problem 1 of level1 is given twice"),
])
def test_a_file_not_in_kernelbenchs_format_is_refused_with_the_entry_named(data, says):
    with pytest.raises(BaselineFileError, match=says.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        read_baseline(data)
