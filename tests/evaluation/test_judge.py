"""The judge's arithmetic in process (harness/evaluation/judge.py), no children: what it says of an output's
structure, its elements, trial 0 against its re-run, and the outputs that compute nothing."""

from __future__ import annotations

import torch

from harness.evaluation import judge

CPU = torch.device("cpu")
TOL = (1e-4, 1e-4)


def _one(got, exp, gt=None):
    return judge.output(got, exp, gt, CPU, *TOL)


def test_a_right_output_has_no_mismatch_and_a_wrong_one_counts_each_element():
    exp = torch.randn(4, 5)
    right = _one(exp.clone(), exp, exp.double())["outputs"][0]
    assert right["mismatches_at_eval_tolerance"] == 0 and right["max_abs_err"] == 0.0
    off = exp.clone()
    off[1, 2] += 1.0
    wrong = _one(off, exp)["outputs"][0]
    assert wrong["mismatches_at_eval_tolerance"] == 1 and wrong["worst_index"] == [1, 2]


def test_an_output_not_shaped_as_the_references_is_figures_never_a_failure_of_the_judge():
    exp = torch.randn(4, 5)
    assert _one((exp,), exp)["structure_error"].startswith("expected a Tensor")
    assert _one(exp, (exp, exp))["structure_error"].startswith("expected tuple")
    assert _one((exp,), (exp, exp))["structure_error"] == "expected 2 outputs, got 1"
    shape = _one(exp.reshape(5, 4), exp)["outputs"][0]
    assert shape["got_shape"] == [5, 4] and "mismatches_at_eval_tolerance" not in shape  # graded a shape mismatch
    dtype = _one(exp.double(), exp)["outputs"][0]
    assert dtype["got_dtype"] == "float64" and "mismatches_at_eval_tolerance" not in dtype
    assert _one({"file_error": "short"}, exp) == {"file_error": "short"}  # the take's figures pass through


def test_a_tensor_subclass_is_named_and_not_compared():
    class Lazy(torch.Tensor):
        pass

    exp = torch.randn(3)
    fig = _one(exp.clone().as_subclass(Lazy), exp)["outputs"][0]
    assert fig["got_type"] == "Lazy" and "got_shape" not in fig


def test_the_rerun_equal_to_trial_0_is_bitwise_equal_and_one_element_off_is_not():
    exp = torch.randn(8)
    trial0 = _one(exp.clone(), exp)
    assert judge.determinism(exp.clone(), exp.clone(), trial0, CPU) == {"bitwise_equal": True, "max_rel_diff": 0.0}
    nan = exp.clone()
    nan[0] = float("nan")
    assert judge.determinism(nan, nan.clone(), trial0, CPU)["bitwise_equal"]  # NaN where trial 0 had NaN
    off = exp.clone()
    off[3] += 0.5
    d = judge.determinism(exp.clone(), off, trial0, CPU)
    assert d is not None and not d["bitwise_equal"] and d["max_rel_diff"] > 0
    assert judge.determinism(exp.clone(), exp[:4].clone(), trial0, CPU) == {"bitwise_equal": False,
                                                                           "max_rel_diff": None}


def test_no_determinism_figure_where_trial_0_already_failed_or_the_rerun_saved_nothing():
    exp = torch.randn(8)
    failed = _one(exp.reshape(2, 4), exp)
    assert judge.determinism(exp.reshape(2, 4), exp.reshape(2, 4), failed, CPU) is None
    trial0 = _one(exp.clone(), exp)
    assert judge.determinism(exp.clone(), {"structure_error": judge.NO_OUTPUT}, trial0, CPU) is None


def test_the_outputs_that_compute_nothing_are_tried_only_where_they_differ_from_the_output():
    found: dict = {}
    varying = torch.randn(4, 6)
    judge.trivial_outputs(found, varying, None, CPU, *TOL)
    assert set(found) == {"zeros", "constant", "row mean"}
    assert all(fig[0]["mismatches_at_eval_tolerance"] > 0 for fig in (found[k] for k in found))
    rows = torch.randn(4, 1).expand(4, 6).contiguous()  # constant along its rows: its row mean is the work
    found = {}
    judge.trivial_outputs(found, rows, None, CPU, *TOL)
    assert set(found) == {"zeros", "constant"}
    found = {}
    judge.trivial_outputs(found, torch.zeros(5), None, CPU, *TOL)
    assert set(found) == {"zeros"} and found["zeros"][0]["mismatches_at_eval_tolerance"] == 0  # zeros pass: proves
    # nothing there, which grading says


def test_the_worst_over_trials_is_kept():
    found: dict = {}
    small, large = torch.full((4,), 1e-3), torch.full((4,), 10.0)
    small[0], large[0] = 2e-3, 20.0
    judge.trivial_outputs(found, large, None, CPU, *TOL)
    judge.trivial_outputs(found, small, None, CPU, *TOL)
    assert found["zeros"][0]["max_abs_err"] == 20.0
