"""Evaluations at fp16 and bf16 on a GPU: the A/A (each built-in reference resubmitted as its own ModelNew) passes at
each half precision at the problems' own size, with a speedup near 1 against the eager reference at that precision;
a CUDA kernel that takes the dtype it is given passes with its kernel credited; torch.compile's baseline is timed at
the precision too. Marked `gpu`."""

from __future__ import annotations

import pytest

from harness.problems import get_registry
from harness.verdicts import Verdict

from ..conftest import SUBMISSIONS, evaluates

pytestmark = pytest.mark.gpu

HALF = ["fp16", "bf16"]
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def _reference_copy(problem: str, precision: str):
    spec = get_registry().get(problem)
    source = spec.source().replace("class Model(", "class ModelNew(")
    return spec, source, {"size": "default", "compile_baseline": "off", "precision": precision}


@pytest.mark.alone
@evaluates(_reference_copy)
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("problem", [s.kernelbench_id for s in get_registry().all()])
def test_the_reference_copy_passes_at_a_half_precision_at_full_size(problem, precision, evaluated):
    r = evaluated
    print(f"\n[gpu] {problem} {precision} {r.verdict.value}: {r.message}")
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    assert r.problem.precision == precision and r.tolerance.atol == r.tolerance.rtol == 1e-2
    assert all(o.got_dtype == DTYPES[precision] for t in r.observations.trials for o in t.outputs)
    assert 0.8 < r.speedup_vs_eager < 1.25  # the same forward on both sides, both at this precision


def _cuda_any_precision(precision: str):
    return get_registry().get("level2/30"), (SUBMISSIONS / "l30_cuda_any_precision.py").read_text(), \
        {"size": "small", "compile_baseline": "on", "precision": precision}


@pytest.mark.long
@evaluates(_cuda_any_precision)
@pytest.mark.parametrize("precision", HALF)
def test_a_cuda_kernel_of_the_inputs_dtype_passes_at_a_half_precision_with_both_baselines(precision, evaluated):
    r = evaluated
    print(f"\n[gpu] {precision} {r.verdict.value}: {r.message}")
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    o = r.observations
    assert o.compile_timing is not None, o.compile_baseline_error  # torch.compile of the reference at this precision
    assert o.kernels is not None and any("hardtanh_any_kernel" in n for n in o.kernels.custom), o.kernels
    check = o.timed_outputs
    assert check is not None and check.calls
    assert all(c.outputs[0].got_dtype == DTYPES[precision] for c in check.calls)
