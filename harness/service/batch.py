"""`harness eval-dir`: evaluate a folder of generations in KernelBench's layout and report fast_p.

Files are named `level_<L>_problem_<N>_sample_<S>_kernel.py` (KernelBench's runs/<name>/). Each is
stored as a submission in one batch, so the results land in the database like any other.
"""

from __future__ import annotations

import os
import re
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from harness import kernelbench_format as kbf
from harness import reporting
from harness.config import Settings
from harness.db import crud, queries
from harness.db.session import Database
from harness.problems import Registry, UnknownProblem
from harness.problems.spec import ProblemSpec
from harness.requirements import describe, met
from harness.service import kernelbench as kb
from harness.service.kernelbench import KernelBenchReport
from harness.service.outcomes import scored
from harness.verdicts import Verdict

KB_GENERATION = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
REPORT_SCHEMA_VERSION = 1


@dataclass
class Generation:
    path: Path
    level: int
    number: int
    sample: int
    spec: ProblemSpec | None  # None: no such problem here (pass --problems-dir)

    @property
    def kernelbench_id(self) -> str:
        return f"level{self.level}/{self.number}"


def scan(folder: Path, registry: Registry) -> tuple[list[Generation], list[Path]]:
    """Generations in the folder (with their problems where known), and the files that are not one."""
    gens: list[Generation] = []
    others: list[Path] = []
    for path in sorted(folder.iterdir()):
        if not path.is_file():
            continue
        m = KB_GENERATION.match(path.name)
        if not m:
            others.append(path)
            continue
        level, number, sample = map(int, m.groups())
        try:
            spec: ProblemSpec | None = registry.get(f"level{level}/{number}")
        except UnknownProblem:
            spec = None
        gens.append(Generation(path, level, number, sample, spec))
    gens.sort(key=lambda g: (g.level, g.number, g.sample))
    return gens, others


def store(db: Database, settings: Settings, gens: list[Generation], *, run: str, submitter: str,
          model: str, precision: str = "fp32") -> tuple[str, dict[int, Generation]]:
    """Store the known generations as submissions in a new batch, to be evaluated at `precision`; returns the batch
    and them by job id."""
    batch = f"eval-dir:{run}:{uuid.uuid4().hex[:8]}"
    by_job: dict[int, Generation] = {}
    with db.session() as s:
        for g in gens:
            if g.spec is None:
                continue
            text = read_generation(g)
            new = crud.NewSubmission(problem_id=g.spec.id, problem_version=g.spec.version, text=text,
                                     text_kind="source", submitter=submitter, model=model,
                                     tags=["eval-dir", run], meta={"file": g.path.name, "sample": g.sample, "run": run},
                                     precision=precision)
            _, job = crud.create_submission(s, new, token=None, queue_limit=None, max_attempts=settings.max_attempts,
                                            reason="eval-dir", batch=batch)
            by_job[job.id] = g
    return batch, by_job


def read_generation(g: Generation) -> str:
    # Replace undecodable bytes rather than refuse: the text is still stored and judged.
    return g.path.read_bytes().decode("utf-8", errors="replace")


def finished_before(db: Database, gens: list[Generation], *, model: str, precision: str = "fp32"
                    ) -> dict[Path, int]:
    """The generations of which an earlier run of this file (stopped or not) has a finished result for the same source,
    problem, model and precision: `--resume` reports those results instead of evaluating them again. A result that is
    the harness's fault (infra_error) does not count. By file: the submission whose result stands for it."""
    found: dict[Path, int] = {}
    with db.session() as s:
        for g in gens:
            if g.spec is None:
                continue
            same = queries.finished_like(s, g.spec.id, read_generation(g), model)
            mine = [sub.id for sub in same
                    if (sub.meta or {}).get("file") == g.path.name and sub.precision == precision]
            if mine:
                found[g.path] = mine[0]
    return found


def cancel_unfinished(db: Database, batch: str) -> int:
    """Remove the batch's submissions that have no result yet (queued, or held by a worker): a stopped run leaves
    nothing in the queue. `--resume` evaluates them next time. Returns how many."""
    with db.session() as s:
        return len(crud.delete_unfinished(s, batch))


def write_report(path: Path, rep: EvalDirReport) -> None:
    """Replace the JSON report at once: a reader, or a run stopped while it writes, never sees half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(rep.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)


def needing_more(db: Database, job_ids: list[int], accepts: set[str]) -> dict[int, str]:
    """The jobs (with what they need) that a worker meeting `accepts` cannot take: a CUDA extension for a CPU-only
    worker. They stay queued for a worker that meets them; a run evaluated here does not wait for them."""
    with db.session() as s:
        needs = {j: queries.get_job(s, j).needs for j in job_ids}
    return {j: n for j, n in needs.items() if n is not None and not met(n, accepts)}


def waiting_message(needs: str) -> str:
    return f"not evaluated here: it needs {describe(needs)}, and stays queued for one"


class SampleResult(BaseModel):
    sample: int
    file: str
    submission_id: int
    verdict: str | None
    message: str | None
    device: str | None
    speedup_vs_eager: float | None  # as measured: counts for fast_p only where `flags` leave it vouched for
    speedup_vs_compile: float | None
    flags: list[str] = []  # e.g. timing_unreliable: shown, never counted as faster (reporting.ranked)


class ProblemResult(BaseModel):
    problem_id: str
    kernelbench_id: str | None
    samples: list[SampleResult]


class FastP(BaseModel):
    problems: int
    eager: dict[str, float]
    compile: dict[str, float] | None  # None: no torch.compile baseline was timed


class EvalDirReport(BaseModel):
    schema_version: int = REPORT_SCHEMA_VERSION
    run: str
    folder: str
    batch: str
    submitter: str
    model: str
    precision: str = "fp32"  # every sample of the run was evaluated at it
    thresholds: list[float]
    fast_p_basis: str
    problems: list[ProblemResult]
    not_evaluated: list[str]  # files of problems this harness does not know
    fast_p: dict[str, FastP]  # by device class: "cuda", "cpu"; never mixed
    kernelbench: KernelBenchReport | None = None  # KernelBench's metrics of the run, by its definitions


def report(db: Database, batch: str, gens: list[Generation], *, run: str, folder: Path, submitter: str,
           model: str, reused: list[int] | None = None, precision: str = "fp32") -> EvalDirReport:
    """The run's report: the batch's submissions, and those of earlier runs that `--resume` reused."""
    with db.session() as s:
        rows = [*queries.batch_results(s, batch), *queries.submissions_with_results(s, reused or [])]
        needs = {sub.id: job.needs for sub, _ in rows if (job := queries.latest_job(s, sub.id)) is not None}
    by_problem: dict[str, list[SampleResult]] = defaultdict(list)
    kb_ids: dict[str, str | None] = {}
    results = []
    for sub, res in rows:
        meta = sub.meta or {}
        by_problem[sub.problem_id].append(SampleResult(
            sample=int(meta.get("sample", -1)), file=str(meta.get("file", "")), submission_id=sub.id,
            verdict=res.verdict if res else None,
            message=res.message if res else waiting_message(n) if (n := needs.get(sub.id)) else None,
            device=res.device if res else None, speedup_vs_eager=res.speedup_vs_eager if res else None,
            speedup_vs_compile=res.speedup_vs_compile if res else None, flags=list(res.flags or []) if res else []))
        if res is not None and res.verdict != Verdict.infra_error.value:
            results.append(scored(sub, res))
    for g in gens:
        if g.spec is not None:
            kb_ids[g.spec.id] = g.spec.kernelbench_id
    problems = [ProblemResult(problem_id=p, kernelbench_id=kb_ids.get(p), samples=sorted(v, key=lambda x: x.sample))
                for p, v in sorted(by_problem.items(), key=lambda kv: (kb_ids.get(kv[0]) or kv[0]))]
    return EvalDirReport(
        run=run, folder=str(folder), batch=batch, submitter=submitter, model=model, precision=precision,
        thresholds=list(reporting.FAST_P_THRESHOLDS),
        fast_p_basis="the harness's fast_p: the best sample of each problem; problems are those with a result; a "
                     "speedup counts above p = 0 only where its time is vouched for (no timing_unreliable, "
                     "shared_gpu, no_custom_kernel or degenerate_tolerance flag)",
        problems=problems, not_evaluated=[g.path.name for g in gens if g.spec is None],
        fast_p=fast_p_by_device(results))


def fast_p_by_device(results: list[reporting.Scored]) -> dict[str, FastP]:
    """fast_p per device class. A result with no device (nothing ran) is a failure in every class."""
    classes = sorted({r.device for r in results if r.device}) or ["none"]
    out = {}
    for device in classes:
        mine = [r for r in results if r.device in (device, None)]
        eager = reporting.best_per_problem(mine, "eager")
        compiled = reporting.best_per_problem(mine, "compile")
        out[device] = FastP(problems=len(eager), eager=reporting.fast_p_curve(eager, "eager") or {},
                            compile=reporting.fast_p_curve(compiled, "compile"))
    return out


def kernelbench_view(db: Database, registry: Registry, batch: str,
                     baseline_file: kbf.BaselineFile | None = None, baseline_label: str | None = None
                     ) -> tuple[KernelBenchReport, dict[int, dict[str, Any]]]:
    """KernelBench's metrics of the batch (by its definitions; the baseline from `baseline_file` where given, else
    the harness's vouched measurements), and the batch as KernelBench's eval results, per level."""
    with db.session() as s:
        samples, counts = kb.run_samples(registry, queries.results_for_export(s, queries.SubmissionFilter(), batch))
        report = kb.kernelbench_report(s, registry, samples, counts, baseline_file=baseline_file,
                                       baseline_label=baseline_label)
    return report, kb.eval_results_json(samples, report.device)
