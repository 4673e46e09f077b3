"""The CUDA paths: load_inline CUDA builds, CUDA faults, hung kernels, event timing. Marked `gpu`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.evaluation.runner import EvalOptions, evaluate
from harness.problems import get_registry
from harness.verdicts import Verdict

from ..conftest import SUBMISSIONS, evaluates

pytestmark = pytest.mark.gpu


def _run(settings, problem, name, **kw):
    kw.setdefault("device", "cuda")
    kw.setdefault("size", "small")
    return evaluate(get_registry().get(problem), (SUBMISSIONS / name).read_text(), EvalOptions(**kw), settings)


def test_a_cuda_build_sealed_after_its_evaluation_is_found_ready_and_keeps_its_kernels_credit(settings):
    """The build dir keeps only its build's outputs, as the harness's own read-only copies (sandbox/builds.py): a CUDA
    build's objects, library and ninja files all stay, so the same text evaluated again is not rebuilt, and its
    kernels are still read from the sealed library's fatbin."""
    source = (SUBMISSIONS / "l30_cuda_correct.py").read_text()
    first = evaluate(get_registry().get("level2/30"), source, EvalOptions(device="cuda", size="small"), settings)
    assert first.verdict == Verdict.passed, first.message + first.log_excerpt
    sos = list(settings.builds_dir.glob("*/kh_test_cuda_hardtanh/*.so"))
    assert len(sos) == 1, "the build's library was not kept"
    ninja_log = sos[0].parent / ".ninja_log"
    built_at, edges = sos[0].stat().st_mtime_ns, ninja_log.read_text()
    second = evaluate(get_registry().get("level2/30"), source, EvalOptions(device="cuda", size="small"), settings)
    assert second.verdict == Verdict.passed, second.message + second.log_excerpt
    assert sos[0].stat().st_mtime_ns == built_at and ninja_log.read_text() == edges, "an identical source was rebuilt"
    for r in (first, second):
        k = r.observations.kernels
        assert k is not None and any(n.startswith("hardtanh_kernel(") for n in k.custom), k


@pytest.mark.long
def test_cuda_load_inline_kernel_passes_with_window_timing_and_both_baselines(settings):
    r = _run(settings, "level2/30", "l30_cuda_correct.py", compile_baseline="on")
    print(f"\n[gpu] {r.verdict.value}: {r.message}")
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    o = r.observations
    assert o.candidate_timing.clock == "parent_window" and o.eager_timing.clock == "parent_window"
    assert o.compile_timing is not None, o.compile_baseline_error
    assert r.speedup_vs_eager and r.speedup_vs_compile
    assert r.provenance.compute_capability and r.provenance.device_name
    # Its kernel named by CUPTI's launch callbacks in a timed window, by the handle of its own build's stub.
    assert o.kernels is not None and any(n.startswith("hardtanh_kernel(") for n in o.kernels.custom), o.kernels
    assert o.kernels.window is not None and 0 <= o.kernels.window < o.candidate_timing.n, o.kernels
    launched = {launch.handle for launch in o.kernels.launches if launch.name.startswith("hardtanh_kernel(")}
    assert launched & {h for n, hs in o.kernels.own_build.items() if n.startswith("hardtanh_kernel(") for h in hs}
    assert o.phases["kernel_trace"] < 1.0, o.phases


@pytest.mark.long
def test_a_kernel_run_only_inside_a_cuda_graph_is_not_credited(settings):
    """A graph's launch names none of its kernels, nor the host stub or handle that would tie one to the submission's
    build: a kernel that runs only inside a CUDA graph is shown to be no one's, and the result is not ranked."""
    r = _run(settings, "level2/30", "l30_cuda_graph_correct.py", compile_baseline="off")
    print(f"\n[gpu] {r.verdict.value}: {r.message}")
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    kernels = r.observations.kernels
    assert kernels is not None and kernels.graph and kernels.custom == [], kernels
    flag = next(f for f in r.flags if f.check == "no_custom_kernel")
    assert "CUDA graph" in flag.detail, flag.detail


@pytest.mark.long
def test_the_triton_add_example_keeps_its_credit(settings):
    """KernelBench's Triton backend example: its @triton.jit add kernel, launched in the traced timed window, is
    compiled from a function of its own file: its own (no name pattern decides it)."""
    spec = get_registry(Path(__file__).parents[1] / "fixtures" / "problems").get("level1/151")
    r = evaluate(spec, (SUBMISSIONS / "l151_triton_add.py").read_text(),
                 EvalOptions(device="cuda", size="default", compile_baseline="off"), settings)
    print(f"\n[gpu] {r.verdict.value}: {r.message}")
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    assert not {f.check for f in r.flags} - {"timing_unreliable"}, r.flags
    kernels = r.observations.kernels
    assert kernels is not None and kernels.custom == ["add_kernel"], kernels
    assert kernels.own_triton.get("add_kernel"), kernels


def test_illegal_memory_access_is_crashed_and_the_next_evaluation_is_unaffected(settings):
    r = _run(settings, "level2/30", "l30_cuda_illegal_access.py", timing=False)
    print(f"\n[gpu] {r.verdict.value}: {r.message}")
    assert r.verdict == Verdict.crashed, r.message
    assert "illegal memory access" in (r.message + r.log_excerpt).lower()
    after = _run(settings, "level2/30", "l30_pytorch_correct.py", timing=False)
    assert after.verdict == Verdict.passed, after.message


@pytest.mark.long
def test_hung_kernel_is_timeout_and_the_next_evaluation_is_unaffected(settings):
    t0 = time.monotonic()
    r = _run(settings, "level2/30", "l30_cuda_hung_kernel.py", run_timeout_s=10, timing=False)
    print(f"\n[gpu] {r.verdict.value}: {r.message} ({time.monotonic() - t0:.1f} s)")
    assert r.verdict == Verdict.timeout and "correctness phase" in r.message
    after = _run(settings, "level2/30", "l30_cuda_correct.py", timing=False)
    assert after.verdict == Verdict.passed, after.message


def _reference_copy(problem: str):
    spec = get_registry().get(problem)
    source = spec.source().replace("class Model(", "class ModelNew(")
    return spec, source, {"size": "default", "compile_baseline": "off"}


@pytest.mark.alone
@evaluates(_reference_copy)
@pytest.mark.parametrize("problem", [s.kernelbench_id for s in get_registry().all()])
def test_pure_pytorch_reference_copy_passes_at_full_size(problem, evaluated):
    """The reference's own forward, renamed ModelNew: must pass at 1e-4 with a speedup near 1."""
    r = evaluated
    print(f"\n[gpu] {problem} {r.verdict.value}: {r.message}")
    assert r.verdict == Verdict.passed, r.message
    assert 0.8 < r.speedup_vs_eager < 1.25
