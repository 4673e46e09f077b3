"""Every exploit in the adversarial corpus gets its verdict; every honest twin passes.

CPU entries run here (small sizes, no GPU); the whole corpus, GPU entries included, runs on CUDA
under the `gpu` marker. docs/integrity.md must list every class.
"""

from __future__ import annotations

import os
import re

import pytest

from harness.evaluation.runner import EvalOptions, evaluate
from harness.problems import get_registry
from harness.schema import EvalResult
from harness.verdicts import Verdict

from ..conftest import evaluates
from .corpus import CORPUS, ROOT, Exploit

CPU = [e for e in CORPUS if not e.gpu]
# On the GPU, a twin that is a reference solution is the evaluation tests/reference_solutions makes of it (passed,
# unflagged, its own kernels traced): it is not made twice.
TWINS = sorted({(e.problem, e.twin, e.problems_dir or "") for e in CORPUS
                if not e.twin.startswith("reference_solutions/")})
CPU_TWINS = sorted({(e.problem, e.twin, e.problems_dir or "") for e in CPU})
# An entry whose verdict is an unflagged pass is judged on its timing too (the hand-over's time, the spread): like
# the honest twins, it runs in the GPU suite's stage of evaluations one at a time, not beside seven others; so does
# one whose check needs the GPU to itself.
# The entries that take a minute on an H100 (computing each window's outputs when asked, 5 s a window).
LONG = {"forged window: no work, computed when asked"}
GPU_ENTRIES = [pytest.param(e, id=e.name, marks=[pytest.mark.alone] if e.verdict == "passed" or e.alone else
                            [pytest.mark.long] if e.name in LONG else [])
               for e in CORPUS]
assert LONG.issubset(e.name for e in CORPUS), LONG - {e.name for e in CORPUS}


def _plan(problem: str, path: str, problems_dir: str | None = None):
    """What an entry's evaluation is made of. No torch.compile baseline: it costs ~15 s an evaluation and no exploit
    here needs it."""
    spec = get_registry(ROOT / problems_dir if problems_dir else None).get(problem)
    size = "small" if "small" in spec.sizes else "default"
    return spec, (ROOT / path).read_text(), {"size": size, "compile_baseline": "off"}


def _evaluate_on_cpu(settings, problem: str, path: str, problems_dir: str | None = None) -> EvalResult:
    spec, text, options = _plan(problem, path, problems_dir)
    return evaluate(spec, text, EvalOptions(device="cpu", **options), settings)


def _show(tag: str, r: EvalResult) -> None:
    """The verdict line, printed, and appended to $HARNESS_CORPUS_LOG where set (parallel runs print nothing)."""
    lines = [f"{tag}: {r.verdict.value} {[f.check for f in r.flags]} :: {r.message[:200]}"]
    lines += [f"    {f.check}: {f.detail[:600]}" for f in r.flags]
    k = r.observations.kernels
    if k is not None and (k.error or k.names is None):
        lines.append(f"    kernel trace failed: {k.error}")
    print("\n" + "\n".join(lines))
    if os.environ.get("HARNESS_CORPUS_LOG"):
        with open(os.environ["HARNESS_CORPUS_LOG"], "a") as log:
            log.write(" | ".join(lines) + "\n")


def _check(e: Exploit, r: EvalResult) -> None:
    verdicts = e.verdict.split("|")
    assert r.verdict.value in verdicts, f"{e.name}: {r.verdict.value}: {r.message}\n{r.log_excerpt}"
    checks = [f.check for f in r.flags]
    if e.flag is not None:
        optional = e.flag.endswith("?")
        flag = e.flag.rstrip("?")
        if not optional or r.verdict == Verdict.flagged:
            assert flag in checks, f"{e.name}: flags {checks}: {r.message}"
    if e.message_has:  # one of its phrases, where it names several ("a|b": either proves the verdict)
        assert any(p in r.message + r.log_excerpt for p in e.message_has.split("|")), f"{e.name}: {r.message}"
    if e.least_call_ms is not None:  # the work it sleeps is paid for in its time, wherever it was done
        timing = r.observations.candidate_timing
        assert timing is not None and timing.median_ms >= e.least_call_ms, timing
    if e.name == "SIGCONT timer lifting the pause":
        _held_whatever_it_signals(r)
    if e.name == "redefined problem sizes" and "lead_ins" not in r.observations.phases:
        # Windows not staged make their inputs in the candidate's process, from the copy of the problem it shrank.
        assert "timed_outputs" in checks, f"{e.name}: flags {checks}: {r.message}"


def _held_whatever_it_signals(r: EvalResult) -> None:
    """Its burning thread never ran beside the reference (it would have used a whole window's CPU time). Held by v1's
    freezer or a ptrace-stop it used none; frozen by v2's cgroup.freeze, its own SIGCONT wakes it for the kernel to
    freeze it again, microseconds that the check after the window counts."""
    o = r.observations
    used = [int(us) for line in o.ran_while_paused for us in re.findall(r"used (\d+) µs", line)]
    assert o.pause_method is not None and all(us < 1000 for us in used), o.ran_while_paused
    assert o.pause_method == "cgroup_freeze" or not o.ran_while_paused, (o.pause_method, o.ran_while_paused)


def _twin_passes(r: EvalResult, path: str) -> None:
    assert r.verdict == Verdict.passed, f"{path}: {r.verdict.value}: {r.message}\n{r.log_excerpt}"
    # Unranked, not failed: a pure-PyTorch twin, or windows a busy host made too noisy to rank.
    assert not {f.check for f in r.flags} - {"no_custom_kernel", "timing_unreliable"}, r.flags
    # Its time is its windows' plus what each window's fingerprints took beyond the trusted side's: stored per window.
    t = r.observations.candidate_timing
    assert t is not None and len(t.charged_ms) == t.n and t.windows_alone_median_ms is not None
    assert t.median_ms >= t.windows_alone_median_ms, t


@pytest.mark.parametrize("e", CPU, ids=[e.name for e in CPU])
def test_exploit_gets_its_verdict_on_the_cpu(settings, e):
    _check(e, _evaluate_on_cpu(settings, e.problem, e.fixture, e.problems_dir))


@pytest.mark.parametrize(("problem", "path", "problems_dir"), CPU_TWINS, ids=[p for _, p, _ in CPU_TWINS])
def test_honest_twin_passes_on_the_cpu(settings, problem, path, problems_dir):
    _twin_passes(_evaluate_on_cpu(settings, problem, path, problems_dir or None), path)


@pytest.mark.gpu
@evaluates(lambda e: _plan(e.problem, e.fixture, e.problems_dir))
@pytest.mark.parametrize("e", GPU_ENTRIES)
def test_exploit_gets_its_verdict_on_the_gpu(e, evaluated):
    # As a worker's slot evaluates: against a warm trusted process, one exploit after another (none may leave it
    # anything that changes the next one's verdict), its candidate's process started during the evaluation before.
    r = evaluated
    _show(f"CORPUS {e.name!r}", r)
    _check(e, r)


@pytest.mark.gpu
@pytest.mark.alone
@pytest.mark.parametrize(("problem", "path", "problems_dir"), TWINS, ids=[p for _, p, _ in TWINS])
@evaluates(lambda problem, path, problems_dir: _plan(problem, path, problems_dir or None))
def test_honest_twin_passes_on_the_gpu(problem, path, problems_dir, evaluated):
    r = evaluated
    _show(f"TWIN {path}", r)
    _twin_passes(r, path)


def test_docs_show_the_corpus_as_it_is_in_code():
    from .corpus import markdown_table

    assert markdown_table() in (ROOT / "docs" / "integrity.md").read_text(), \
        "docs/integrity.md's corpus table is not tests/evaluation/corpus.py's markdown_table()"
