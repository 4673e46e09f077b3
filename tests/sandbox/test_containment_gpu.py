"""Hostile submissions on a GPU: a CUDA fault or a hung kernel kills that child only and the GPU passes
the worker's health check afterwards; a 200 GB allocation is an error; the sandbox user can use the GPU.
Marked `gpu` (scripts/device-hostile.sh runs them on an H100 host)."""

from __future__ import annotations

import pytest

from harness.evaluation.runner import EvalOptions, evaluate
from harness.problems import get_registry
from harness.sandbox import capabilities
from harness.service.health import gpu_health_check
from harness.verdicts import Verdict

from ..conftest import FIXTURES, SUBMISSIONS

pytestmark = pytest.mark.gpu
GPU0 = {"CUDA_VISIBLE_DEVICES": "0"}


def _run(settings, problem, path, **kw):
    kw.setdefault("device", "cuda")
    kw.setdefault("size", "small")
    return evaluate(get_registry().get(problem), path.read_text(), EvalOptions(**kw), settings)


@pytest.mark.long
@pytest.mark.parametrize("fixture, verdict", [("l30_cuda_illegal_access.py", Verdict.crashed),
                                              ("l30_cuda_hung_kernel.py", Verdict.timeout)])
def test_a_cuda_fault_kills_that_child_only_and_the_gpu_passes_its_health_check(settings, fixture, verdict):
    r = _run(settings, "level2/30", SUBMISSIONS / fixture, timing=False, run_timeout_s=20)
    print(f"\n[gpu] {fixture}: {r.verdict.value}: {r.message}")
    assert r.verdict == verdict, r.message
    assert gpu_health_check(GPU0, settings) is None


def test_allocating_200_gb_on_the_gpu_is_a_runtime_error(settings):
    r = _run(settings, "level2/75", FIXTURES / "hostile" / "alloc_200gb.py", timing=False)
    print(f"\n[gpu] alloc_200gb: {r.verdict.value}: {r.message}")
    assert r.verdict == Verdict.runtime_error, r.message
    assert "out of memory" in (r.message + r.log_excerpt).lower()
    assert gpu_health_check(GPU0, settings) is None


def test_the_sandbox_user_runs_cuda_code(settings):
    r = _run(settings, "level2/30", SUBMISSIONS / "l30_cuda_correct.py", timing=False)
    print(f"\n[gpu] sandbox platform: {capabilities.platform().describe()}; {r.verdict.value}: {r.message}")
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
