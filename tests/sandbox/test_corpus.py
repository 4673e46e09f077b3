"""Every exploit in the adversarial corpus gets its verdict; every honest twin passes.

CPU entries run here (small sizes, no GPU); the whole corpus, GPU entries included, runs on CUDA
under the `gpu` marker. docs/integrity.md must list every class.
"""

from __future__ import annotations

import pytest

from harness.problems import get_registry
from harness.sandbox.runner import EvalOptions, evaluate
from harness.schema import EvalResult
from harness.verdicts import Verdict

from .corpus import CORPUS, ROOT, Exploit

CPU = [e for e in CORPUS if not e.gpu]
TWINS = sorted({(e.problem, e.twin) for e in CORPUS})
CPU_TWINS = sorted({(e.problem, e.twin) for e in CPU})


def _evaluate(settings, problem: str, path: str, device: str) -> EvalResult:
    # No torch.compile baseline: it costs ~15 s an evaluation and no exploit here needs it.
    text = (ROOT / path).read_text()
    return evaluate(get_registry().get(problem), text,
                    EvalOptions(device=device, size="small", compile_baseline="off"), settings)


def _show(tag: str, r: EvalResult) -> None:
    print(f"\n{tag}: {r.verdict.value} {[f.check for f in r.flags]} :: {r.message[:200]}")
    for f in r.flags:
        print(f"    {f.check}: {f.detail[:300]}")
    k = r.observations.kernels
    if k is not None and (k.error or k.names is None):
        print(f"    kernel trace failed: {k.error}")


def _check(e: Exploit, r: EvalResult) -> None:
    verdicts = e.verdict.split("|")
    assert r.verdict.value in verdicts, f"{e.name}: {r.verdict.value}: {r.message}\n{r.log_excerpt}"
    checks = [f.check for f in r.flags]
    if e.flag is not None:
        optional = e.flag.endswith("?")
        flag = e.flag.rstrip("?")
        if not optional or r.verdict == Verdict.flagged:
            assert flag in checks, f"{e.name}: flags {checks}: {r.message}"
    if e.message_has:
        assert e.message_has in r.message + r.log_excerpt, f"{e.name}: {r.message}"
    if e.name == "content-keyed cache":  # every timed lookup missed: the 20 ms slow path was timed
        assert r.observations.candidate_timing.median_ms >= 19.0, r.observations.candidate_timing


def _twin_passes(r: EvalResult, path: str) -> None:
    assert r.verdict == Verdict.passed, f"{path}: {r.verdict.value}: {r.message}\n{r.log_excerpt}"
    assert not {f.check for f in r.flags} - {"no_custom_kernel"}, r.flags


@pytest.mark.parametrize("e", CPU, ids=[e.name for e in CPU])
def test_exploit_gets_its_verdict_on_the_cpu(settings, e):
    _check(e, _evaluate(settings, e.problem, e.fixture, "cpu"))


@pytest.mark.parametrize(("problem", "path"), CPU_TWINS, ids=[p for _, p in CPU_TWINS])
def test_honest_twin_passes_on_the_cpu(settings, problem, path):
    _twin_passes(_evaluate(settings, problem, path, "cpu"), path)


@pytest.mark.gpu
@pytest.mark.parametrize("e", CORPUS, ids=[e.name for e in CORPUS])
def test_exploit_gets_its_verdict_on_the_gpu(settings, e):
    r = _evaluate(settings, e.problem, e.fixture, "cuda")
    _show(f"CORPUS {e.name!r}", r)
    _check(e, r)


@pytest.mark.gpu
@pytest.mark.parametrize(("problem", "path"), TWINS, ids=[p for _, p in TWINS])
def test_honest_twin_passes_on_the_gpu(settings, problem, path):
    r = _evaluate(settings, problem, path, "cuda")
    _show(f"TWIN {path}", r)
    _twin_passes(r, path)
    if path.startswith("reference_solutions/"):
        assert r.observations.kernels.custom, r.observations.kernels


def test_docs_list_every_exploit_class():
    doc = (ROOT / "docs" / "integrity.md").read_text()
    for e in CORPUS:
        assert f"| {e.name} |" in doc, e.name
        assert e.fixture.rsplit("/", 1)[-1] in doc, e.fixture
