"""`harness bench throughput`: one batch of distinct submissions, evaluated serially, pipelined and warm.

The submissions are variants of the reference solutions (load_inline builds) or, for a named problem without one (any
KernelBench problem, from `--problems-dir`), of the A/A copy of its own reference (`eager_process.aa_submission`: pure
PyTorch, nothing to build), each made distinct by a comment of its own.

Every mode runs the service's own worker (`service.worker.Worker`) on one slot, over the same sources:
  serial     no compile pool, a fresh build cache: the slot compiles each submission inside its evaluation;
  pipelined  a fresh build cache; the worker's compile pool precompiles ahead (`prebuild.precompile`) while the
             slot evaluates (taking the built jobs of the problem its trusted process is warm for first);
  warm       the same submissions again, their builds cached by the pipelined mode (built first, untimed, where
             that mode did not run), queued problem by problem
             (as an RL loop or a re-evaluation sends them): the slot's trusted process stays warm between them
             and the next candidate's process starts ahead. Its evaluations per hour are the warm target's.
The serial and pipelined modes measure builds: an A/A copy builds nothing, so a batch holding one runs the warm mode
only (`default_modes`, `check_modes`). Each mode reports, per problem, the median of its evaluations with the trusted
process warm (`ProblemFigures`). The worker's stage functions are wrapped to time them; nothing else differs. No torch
here: the sandbox's children do the torch work.
"""

from __future__ import annotations

import dataclasses
import re
import resource
import secrets
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from harness.config import Settings
from harness.db import crud, queries
from harness.db.session import Database
from harness.evaluation.prebuild import PrecompileResult, precompile, precompile_all
from harness.evaluation.runner import EvalOptions, evaluate
from harness.problems import Registry, UnknownProblem
from harness.problems.spec import ProblemSpec
from harness.sandbox import capabilities
from harness.schema import EvalResult, Provenance
from harness.service import reeval
from harness.service.devices import Slot, plan_slots, probe
from harness.service.selfcheck import aa_submission
from harness.service.worker import Worker, default_compile_workers

REPORT_SCHEMA_VERSION = 1
WALL_BAR = 1.25  # pipelined wall <= WALL_BAR x the slower stage
SPEEDUP_BAR = 5.0  # pipelined evaluations per hour >= SPEEDUP_BAR x serial
WARM_BAR = 600.0  # warm evaluations per hour on one GPU
WARM_MEDIAN_BAR_S = 2.5  # each problem's median warm evaluation, seconds (issue 35: 1,440 an hour)
REFERENCE_SOLUTIONS = Path(__file__).resolve().parents[2] / "reference_solutions"
_SOLUTION_NAME = re.compile(r"^level(\d+)_(\d+)_\w+\.py$")
_EXTENSION_HEADER = "#include <torch/extension.h>"

# A C++-only submission for level2/30 (GEMM, GroupNorm, Hardtanh) that builds without nvcc: the CPU stand-in
# for the reference solutions' CUDA. Its build is the same kind of work (a torch extension through ninja).
CPU_PROBLEM = "level2/30"
CPU_TEMPLATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor clamp_epilogue(torch::Tensor x, double lo, double hi) {
    return torch::clamp(x.contiguous(), lo, hi);
}
"""

ext = load_inline(name="kh_bench_clamp", cpp_sources=cpp_source, functions=["clamp_epilogue"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, num_groups, hardtanh_min, hardtanh_max):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        self.lo, self.hi = hardtanh_min, hardtanh_max

    def forward(self, x):
        return ext.clamp_epilogue(self.group_norm(self.gemm(x)), self.lo, self.hi)
'''


@dataclasses.dataclass
class Variant:
    spec: ProblemSpec
    origin: str  # the template it was made from: a reference solution's file, CPU_TEMPLATE, or aa_origin(spec)
    text: str
    aa: bool = False  # the A/A copy of the problem's own reference: pure PyTorch, it builds nothing


def make_variant(template: str, tag: str) -> str:
    """The template with a comment line after each torch extension header: every C++/CUDA source string of
    its extension differs, so its content hash, its build dir and the compiler's work differ too."""
    if _EXTENSION_HEADER not in template:
        raise ValueError(f"the template has no {_EXTENSION_HEADER!r} line to vary")
    return template.replace(_EXTENSION_HEADER, f"{_EXTENSION_HEADER}\n// kernelharness bench variant {tag}")


def aa_variant(spec: ProblemSpec, tag: str) -> str:
    """The A/A copy of the problem's reference with a first comment line naming the variant and the problem. It
    builds nothing, so its text (the submission's hash, the candidate's file) is all that has to differ."""
    return f"# kernelharness bench variant {tag}: {aa_origin(spec)}\n{aa_submission(spec.source(), {})}"


def aa_origin(spec: ProblemSpec) -> str:
    return f"A/A copy of {spec.id}'s reference"


def reference_templates(folder: Path, registry: Registry) -> list[tuple[ProblemSpec, str, str]]:
    """(problem, file name, source) of each reference solution in the folder whose problem is known."""
    out = []
    for path in sorted(folder.glob("level*_*.py")):
        m = _SOLUTION_NAME.match(path.name)
        if not m:
            continue
        try:
            spec = registry.get(f"level{m.group(1)}/{m.group(2)}")
        except UnknownProblem:
            continue
        out.append((spec, path.name, path.read_text()))
    return out


def make_variants(n: int, device: str, registry: Registry, solutions_dir: Path | None = None,
                  run_tag: str | None = None, problems: Sequence[str] = ()) -> list[Variant]:
    """N distinct submissions, cycling through the templates. With no `problems`: the reference solutions (CUDA) or
    the C++ template (CPU). Each named problem (as `registry` resolves it: UnknownProblem where it cannot): its
    reference solution in `solutions_dir` on CUDA where it has one, else the A/A copy of its own reference."""
    run_tag = run_tag or secrets.token_hex(4)
    folder = solutions_dir or REFERENCE_SOLUTIONS
    # (problem, origin, the solution's text, or None for the problem's A/A copy)
    templates: list[tuple[ProblemSpec, str, str | None]]
    if problems:
        specs = list({s.id: s for s in (registry.get(name) for name in problems)}.values())
        # A solution is filed under a KernelBench id, a problem named by any of its aliases.
        solutions = {s.kernelbench_id: (name, text) for s, name, text in reference_templates(folder, registry)} \
            if device == "cuda" else {}
        templates = [(s, *solutions[s.kernelbench_id]) if s.kernelbench_id in solutions else (s, aa_origin(s), None)
                     for s in specs]
    elif device == "cpu":
        templates = [(registry.get(CPU_PROBLEM), "CPU_TEMPLATE", CPU_TEMPLATE)]
    else:
        templates = [(s, name, text) for s, name, text in reference_templates(folder, registry)]
        if not templates:
            raise ValueError(f"no reference solution of a known problem in {folder}")
    variants = []
    for i in range(n):
        spec, origin, text = templates[i % len(templates)]
        tag = f"{i + 1} of {n} (run {run_tag})"
        variants.append(Variant(spec, origin, aa_variant(spec, tag), aa=True) if text is None
                        else Variant(spec, origin, make_variant(text, tag)))
    return variants


class ProblemFigures(BaseModel):
    evaluations: int
    warm: int  # of which with the trusted process warm (an earlier evaluation of the problem on the slot kept it)
    median_warm_s: float | None  # their median seconds in the slot; None where none was warm (its one evaluation)
    # Each evaluation's speedup over eager, in order (an A/A copy's is its A/A); empty in reports written before it.
    speedups_vs_eager: list[float] = []


def problem_figures(evaluations: Sequence[dict[str, Any]]) -> dict[str, ProblemFigures]:
    """Per problem, from a mode's evaluation records (`ModeReport.evaluations`): a problem's first evaluation starts
    its trusted process, so its median is over the others, what each further submission of it costs."""
    out = {}
    for problem in sorted({e["problem"] for e in evaluations}):
        mine = [e for e in evaluations if e["problem"] == problem]
        warm = [e["seconds"] for e in mine if e["trusted_warm"]]
        out[problem] = ProblemFigures(evaluations=len(mine), warm=len(warm),
                                      median_warm_s=round(statistics.median(warm), 3) if warm else None,
                                      speedups_vs_eager=[e["speedup_vs_eager"] for e in mine
                                                         if e.get("speedup_vs_eager") is not None])
    return out


class ModeReport(BaseModel):
    mode: str  # serial | pipelined | warm
    compile_workers: int
    submissions: int
    verdicts: dict[str, int]
    wall_s: float
    # Sum of the builds' wall seconds: the precompile children's (pool) or the candidates' import phase (in the
    # slot), both on the parent's clock and both including the child's interpreter and torch import.
    compile_s: float
    compile_where: str
    slot_s: float  # the device stage: sum of the evaluations' wall time in the slot (trusted + candidate children)
    slot_import_s: float  # of which the candidates' import phase (the whole build in serial mode)
    device_s: float  # slot_s - slot_import_s: the stage's time not spent importing or building
    device_busy_fraction: float  # device_s / wall_s
    evals_per_hour: float
    children_cpu_s: float  # RUSAGE_CHILDREN delta over the mode: every child, builds and evaluations alike
    # Seconds per evaluation phase (observations.phases), summed over the mode's evaluations: where the device
    # stage goes. Empty in reports written before it existed.
    phases_s: dict[str, float] = {}
    # The slot's wall seconds of each evaluation whose trusted process was warm (an earlier evaluation of its problem
    # on this slot kept it): what a loop sending one problem's submissions gets per evaluation once the first is in.
    trusted_warm_s: list[float] = []
    # Each evaluation in the order they ended: problem, seconds in the slot, verdict, flags, speedup_vs_eager,
    # trusted_warm, candidate_ahead, its phases (observations.phases) and what its timed windows cost
    # (Observations.window_costs).
    evaluations: list[dict[str, Any]] = []
    # `problem_figures(evaluations)`, by problem id: the median warm evaluation of each. Empty in reports written
    # before it existed.
    per_problem: dict[str, ProblemFigures] = {}

    def trusted_warm_per_hour(self) -> float | None:
        """Evaluations an hour at the median wall of those with the trusted process warm; None where none was."""
        return 3600.0 / statistics.median(self.trusted_warm_s) if self.trusted_warm_s else None


class BarCheck(BaseModel):
    stage_bound_s: float  # max(pipelined compile_s / compile workers, pipelined slot_s)
    wall_ok: bool  # pipelined wall_s <= WALL_BAR x stage_bound_s
    # pipelined evals_per_hour / serial evals_per_hour, and whether it is >= SPEEDUP_BAR; None without the serial mode
    speedup: float | None = None
    speedup_ok: bool | None = None
    warm_evals_per_hour: float | None = None  # the warm mode's; None in reports written before it existed
    warm_ok: bool | None = None  # the warm mode's rate with its trusted process warm (else its own) >= WARM_BAR


class ThroughputReport(BaseModel):
    schema_version: int = REPORT_SCHEMA_VERSION
    device: str
    device_name: str
    n: int
    # Serial evaluation is linear in the count, so it can be measured on the first `serial_n` of the N variants
    # (each template once when serial_n >= the number of templates) where N serial builds do not fit the time
    # at hand; its evaluations per hour are a rate either way. None: all N.
    serial_n: int | None = None
    distinct_sources: int
    origins: list[str]
    arch_list: str | None  # TORCH_CUDA_ARCH_LIST override; None: the worker's default (its GPU's arch only)
    modes: list[ModeReport]
    bar: BarCheck | None = None  # None until the pipelined mode ran (`--modes`, or a run cut off)


def bar_check(serial: ModeReport | None, pipelined: ModeReport, warm: ModeReport | None = None) -> BarCheck:
    bound = max(pipelined.compile_s / max(1, pipelined.compile_workers), pipelined.slot_s)
    speedup = None if serial is None else \
        pipelined.evals_per_hour / serial.evals_per_hour if serial.evals_per_hour else 0.0
    return BarCheck(stage_bound_s=bound, wall_ok=pipelined.wall_s <= WALL_BAR * bound, speedup=speedup,
                    speedup_ok=None if speedup is None else speedup >= SPEEDUP_BAR,
                    warm_evals_per_hour=warm.evals_per_hour if warm is not None else None,
                    warm_ok=(warm.trusted_warm_per_hour() or warm.evals_per_hour) >= WARM_BAR
                    if warm is not None else None)


class _Meter:
    """The worker's stage functions, timed; `extra_env` reaches every child (an arch list override)."""

    def __init__(self, extra_env: dict[str, str],
                 on_evaluation: Callable[[str, float, EvalResult | None], None] | None = None):
        self.extra_env = extra_env
        self.on_evaluation = on_evaluation  # (problem, seconds, result): as each evaluation ends
        self.evaluations: list[tuple[str, float, EvalResult | None]] = []  # (problem, seconds, result)
        self.builds: list[float] = []
        self._lock = threading.Lock()

    def evaluate(self, spec: ProblemSpec, text: str, options: EvalOptions, settings: Settings) -> EvalResult:
        options = dataclasses.replace(options, extra_env={**options.extra_env, **self.extra_env})
        t0 = time.monotonic()
        result = None
        try:
            result = evaluate(spec, text, options, settings)
            return result
        finally:
            seconds = time.monotonic() - t0
            with self._lock:
                self.evaluations.append((spec.kernelbench_id or spec.id, seconds, result))
            if self.on_evaluation is not None:
                self.on_evaluation(spec.kernelbench_id or spec.id, seconds, result)

    def precompile(self, text: str, target: Provenance, settings: Settings, **kw: Any) -> PrecompileResult:
        kw["extra_env"] = {**(kw.get("extra_env") or {}), **self.extra_env}
        r = precompile(text, target, settings, **kw)
        with self._lock:
            self.builds.append(r.seconds)
        return r


def run_mode(mode: str, variants: list[Variant], settings: Settings, registry: Registry, slot: Slot, *,
             compile_workers: int, extra_env: dict[str, str],
             progress: Callable[[int, int], None] | None = None,
             on_evaluation: Callable[[str, float, EvalResult | None], None] | None = None) -> ModeReport:
    """Queue the variants in `settings`' own database and evaluate them with a worker of `compile_workers`."""
    db = Database(settings)
    try:
        batch = f"bench:{mode}:{secrets.token_hex(4)}"
        job_ids = []
        with db.session() as s:
            for i, v in enumerate(variants):
                new = crud.NewSubmission(problem_id=v.spec.id, problem_version=v.spec.version, text=v.text,
                                         text_kind="source", submitter="harness-bench", model=f"bench-{mode}",
                                         tags=["bench", mode], meta={"variant": i, "origin": v.origin})
                # One attempt: a retried evaluation would distort the timings; its infra_error shows as such.
                _, job = crud.create_submission(s, new, token=None, queue_limit=None, max_attempts=1,
                                                reason="bench", batch=batch)
                job_ids.append(job.id)
        meter = _Meter(extra_env, on_evaluation)
        worker = Worker(db, settings, registry, [slot], compile_workers=compile_workers, batch=batch,
                        evaluate_fn=meter.evaluate, precompile_fn=meter.precompile)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        thread = threading.Thread(target=worker.run, name=f"bench-{mode}", daemon=True)
        thread.start()
        try:
            reeval.wait_for_jobs(db, job_ids, poll_s=0.1, progress=progress)
            wall = time.monotonic() - t0
        finally:
            worker.stop()
            thread.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        with db.session() as s:
            verdicts = Counter(res.verdict if res else "none" for _sub, res in queries.batch_results(s, batch))
    finally:
        db.dispose()
    slot_s = sum(secs for _, secs, _ in meter.evaluations)
    slot_import_s = sum(r.observations.candidate_import_s or 0.0 for _, _, r in meter.evaluations if r is not None)
    device_s = max(0.0, slot_s - slot_import_s)
    phases: dict[str, float] = {}
    for _, _, r in meter.evaluations:
        for name, secs in (r.observations.phases if r is not None else {}).items():
            phases[name] = phases.get(name, 0.0) + secs
    evaluations = [{"problem": p, "seconds": round(secs, 3), "verdict": r.verdict.value if r else None,
                    "flags": [f.check for f in r.flags] if r else [],
                    "speedup_vs_eager": round(r.speedup_vs_eager, 4) if r and r.speedup_vs_eager else None,
                    "trusted_warm": bool(r and r.observations.trusted_warm),
                    "candidate_ahead": bool(r and r.observations.candidate_ahead),
                    "phases": {k: round(v, 3) for k, v in (r.observations.phases if r else {}).items()},
                    "windows": r.observations.window_costs() if r else {}}
                   for p, secs, r in meter.evaluations]
    return ModeReport(
        mode=mode, compile_workers=compile_workers, submissions=len(variants), verdicts=dict(verdicts), wall_s=wall,
        compile_s=sum(meter.builds) if compile_workers else slot_import_s,
        compile_where="compile pool (precompile children)" if compile_workers else "slot (candidate import phase)",
        slot_s=slot_s, slot_import_s=slot_import_s, device_s=device_s,
        device_busy_fraction=min(1.0, device_s / wall) if wall > 0 else 0.0,
        evals_per_hour=len(variants) * 3600.0 / wall if wall > 0 else 0.0,
        children_cpu_s=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        phases_s={k: round(v, 3) for k, v in phases.items()},
        trusted_warm_s=[round(secs, 3) for _, secs, r in meter.evaluations
                        if r is not None and r.observations.trusted_warm],
        evaluations=evaluations, per_problem=problem_figures(evaluations),
    )


def bench_slot(device: str, gpu: int, settings: Settings) -> Slot:
    """The one slot the bench evaluates on, probed (its target is what the compile pool builds for)."""
    slots = probe(plan_slots("none" if device == "cpu" else str(gpu), settings), settings)
    if not slots:
        raise RuntimeError(f"no evaluation slot on {device} could start (see the log above)")
    return slots[0]


MODES = ("serial", "pipelined", "warm")
BUILD_MODES = ("serial", "pipelined")  # what they measure is the builds: where they run and what they overlap


def default_modes(variants: Sequence[Variant]) -> tuple[str, ...]:
    """All three; the warm mode alone where a submission is an A/A copy (see `check_modes`)."""
    return ("warm",) if any(v.aa for v in variants) else MODES


def check_modes(modes: Sequence[str], variants: Sequence[Variant] = ()) -> None:
    """The modes asked for exist, and fit the submissions: the serial and pipelined modes compare builds in the slot
    with builds ahead of it, and an A/A copy builds nothing, so their figures and bars would say nothing of it."""
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"the modes are {', '.join(MODES)} (got {', '.join(modes) or 'none'})")
    building = [m for m in modes if m in BUILD_MODES]
    aa = sorted({v.spec.id for v in variants if v.aa})
    if building and aa:
        raise ValueError(f"the {' and '.join(building)} mode{'s' if len(building) > 1 else ''} measure load_inline "
                         f"builds, and the submissions of {', '.join(aa)} (A/A copies of the reference, pure "
                         "PyTorch) build nothing: run the warm mode alone (--modes warm, the default for them)")


def prebuild(variants: list[Variant], settings: Settings, slot: Slot, workers: int,
             extra_env: dict[str, str]) -> list[PrecompileResult]:
    """The variants built into `settings`' cache as the pipelined mode's compile pool builds them, untimed: what
    the warm mode evaluates when the pipelined mode did not run before it."""
    assert slot.target is not None
    return precompile_all([v.text for v in variants], slot.target, settings, workers, extra_env=extra_env)


def run_bench(variants: list[Variant], settings: Settings, registry: Registry, work_dir: Path, *, device: str,
              gpu: int = 0, compile_workers: int | None = None, arch_list: str | None = None,
              serial_n: int | None = None, modes: Sequence[str] | None = None,
              progress: Callable[[str, int, int], None] | None = None,
              on_mode: Callable[[ThroughputReport], None] | None = None,
              on_evaluation: Callable[[str, str, float, EvalResult | None], None] | None = None) -> ThroughputReport:
    """Serial (on the first `serial_n` variants, all by default), then pipelined (on all), then warm, those of
    `modes` (`default_modes` when None), each in a fresh data dir under `work_dir` (which must not hold earlier runs).
    `on_mode` gets the report so far after each mode: a run cut off by a time limit still leaves the modes it
    finished."""
    modes = default_modes(variants) if modes is None else modes
    check_modes(modes, variants)
    if serial_n is not None and not 1 <= serial_n <= len(variants):
        raise ValueError(f"the serial sample must be 1 to {len(variants)} submissions, got {serial_n}")
    capabilities.check_safe(settings)
    slot = bench_slot(device, gpu, settings)
    if compile_workers is None:  # the worker's default; at least one, which a CPU-only worker would not run
        compile_workers = default_compile_workers(settings, [slot])
    extra_env = {"TORCH_CUDA_ARCH_LIST": arch_list} if arch_list else {}
    done: list[ModeReport] = []
    by_problem = sorted(variants, key=lambda v: v.spec.id)  # stable: each problem's in their order
    report: ThroughputReport | None = None
    for mode, workers, batch, data_dir in (
            ("serial", 0, variants[:serial_n] if serial_n else variants, work_dir / "serial"),
            ("pipelined", max(1, compile_workers), variants, work_dir / "pipelined"),
            ("warm", max(1, compile_workers), by_problem, work_dir / "pipelined")):  # its builds, cached
        if mode not in modes:
            continue
        if mode != "warm" and data_dir.exists() and any(data_dir.iterdir()):
            raise ValueError(f"{data_dir} is not empty: each mode needs a fresh build cache")
        # The mode's own database and build cache, whatever HARNESS_BUILD_CACHE_DIR shares elsewhere.
        mode_settings = settings.model_copy(update={"data_dir": data_dir, "database_url": None,
                                                    "build_cache_dir": None})
        if mode == "warm" and "pipelined" not in modes:  # the builds it evaluates again, made first, untimed
            prebuild([v for v in batch if not v.aa], mode_settings, slot, max(1, compile_workers), extra_env)
            if progress is not None:
                progress(mode, 0, len(batch))  # built
        done.append(run_mode(mode, batch, mode_settings, registry, slot, compile_workers=workers,
                             extra_env=extra_env,
                             progress=(lambda d, total, m=mode: progress(m, d, total)) if progress else None,
                             on_evaluation=(lambda p, secs, r, m=mode: on_evaluation(m, p, secs, r))
                             if on_evaluation else None))
        target = slot.target
        by_mode = {m.mode: m for m in done}
        report = ThroughputReport(
            device=device, device_name=target.device_name if target else device, n=len(variants),
            serial_n=serial_n if serial_n and serial_n < len(variants) and "serial" in by_mode else None,
            distinct_sources=len({v.text for v in variants}), origins=sorted({v.origin for v in variants}),
            arch_list=arch_list, modes=list(done),
            bar=bar_check(by_mode.get("serial"), by_mode["pipelined"], by_mode.get("warm"))
            if "pipelined" in by_mode else None)
        if on_mode is not None:
            on_mode(report)
    assert report is not None
    return report
