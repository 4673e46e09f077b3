"""Stored rows for tests: results whose verdicts come from `grading.grade` over figures (not typed in),
and a submission seeded through the real queue path (create, claim, complete)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from harness import grading
from harness.config import Settings
from harness.db import crud
from harness.db.models import ResultOrigin
from harness.db.session import Database
from harness.schema import (
    ChildError,
    DeterminismFigures,
    EvalResult,
    Observations,
    OutputFigures,
    ProblemRef,
    Provenance,
    TimingStats,
    Tolerance,
    TrialFigures,
    TrivialOutput,
)
from harness.verdicts import Phase

TOL = Tolerance(atol=1e-4, rtol=1e-4)
SOURCE = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def timing(ms: float, clock: str = "cuda_event") -> TimingStats:
    return TimingStats(clock=clock, n=100, median_ms=ms, mean_ms=ms * 1.01, min_ms=ms * 0.98, max_ms=ms * 1.1,
                       std_ms=ms * 0.01)


def eval_result(*, problem: str = "gemm-groupnorm-min-biasadd", kb: str = "level2/75", device: str | None = "cuda",
                precision: str = "fp32",
                candidate_ms: float | None = 1.0, eager_ms: float = 2.0, compile_ms: float | None = 1.5,
                max_rel_err: float = 1e-6, tolerance: Tolerance = TOL, static_error: str | None = None,
                compiler_error: str | None = None, log_tail: str = "",
                zeros_rel_err: float | None = None) -> EvalResult:
    """A whole EvalResult graded from figures: a tiny max_rel_err passes, a large one is wrong_answer; a
    static or compiler error leaves no figures. With `zeros_rel_err`, all-zero outputs are that far off."""
    obs = Observations(static_error=static_error, log_tail=log_tail)
    if compiler_error is not None:
        obs.candidate_error = ChildError(phase=Phase.compile, exc_type="RuntimeError",
                                         message=f"Error building extension 'k'\n{compiler_error}")
    elif static_error is None:
        fig = OutputFigures(index=0, got_type="Tensor", got_shape=[1, 256, 128, 1], got_dtype="torch.float32",
                            got_device=device, expected_shape=[1, 256, 128, 1], expected_dtype="torch.float32",
                            nonfinite_mismatches=0, max_abs_err=max_rel_err * 2, max_rel_err=max_rel_err,
                            min_atol_at_rtol={"0": max_rel_err * 2}, worst_index=[0, 3, 7, 0], worst_got=1.0,
                            worst_expected=1.0 + max_rel_err, mismatches_at_eval_tolerance=0, numel=32768,
                            err_vs_fp64=3e-7, ref_err_vs_fp64=3e-7)
        obs.trials_expected = 5
        obs.trials = [TrialFigures(trial=i, outputs=[fig]) for i in range(5)]
        obs.determinism = DeterminismFigures(bitwise_equal=True, max_rel_diff=0.0)
        if zeros_rel_err is not None:
            zeros = fig.model_copy(update={"max_abs_err": zeros_rel_err, "max_rel_err": zeros_rel_err})
            obs.trivial_outputs = [TrivialOutput(kind="zeros", outputs=[zeros])]
        clock = "cuda_event" if device == "cuda" else "perf_counter"
        if candidate_ms is not None:
            obs.candidate_timing = timing(candidate_ms, clock)
            obs.eager_timing = timing(eager_ms, clock)
            obs.compile_timing = timing(compile_ms, clock) if compile_ms is not None else None
    g = grading.grade(obs, tolerance)
    prov = None
    if device is not None:
        prov = Provenance(harness_version="0.1.0", device=device,
                          device_name="NVIDIA H100 80GB HBM3" if device == "cuda" else "x86_64",
                          compute_capability="9.0" if device == "cuda" else None, torch_version="2.13.0",
                          python_version="3.11.9", hostname="test", started_at=datetime.now(timezone.utc))
    return EvalResult(**g.result_fields(),
                      problem=ProblemRef(id=problem, version=1, kernelbench_id=kb,
                                         size="default" if device == "cuda" else "small", source="x.py",
                                         precision=precision),
                      tolerance=tolerance, submission_sha256="0" * 64, observations=obs, provenance=prov)


def new_submission(problem: str = "gemm-groupnorm-min-biasadd", *, submitter: str = "alice", model: str = "m1",
                   text: str = SOURCE, tags: list[str] | None = None,
                   meta: dict[str, Any] | None = None, precision: str = "fp32") -> crud.NewSubmission:
    return crud.NewSubmission(problem_id=problem, problem_version=1, text=text, text_kind="source",
                              submitter=submitter, model=model, tags=tags or [], meta=meta or {}, precision=precision)


def seed(db: Database, result: EvalResult, *, submitter: str = "alice", model: str = "m1",
         settings: Settings | None = None, origin: ResultOrigin = ResultOrigin.sandbox,
         tags: list[str] | None = None, meta: dict[str, Any] | None = None) -> int:
    """Store a submission and its result through the queue (create, claim, complete); returns its id."""
    batch = f"seed-{uuid.uuid4().hex[:8]}"  # claim exactly this job, whatever else is queued
    with db.session() as s:
        sub, _ = crud.create_submission(s, new_submission(result.problem.id, submitter=submitter, model=model,
                                                          tags=tags, meta=meta, precision=result.problem.precision),
                                        token=None, queue_limit=None, max_attempts=3, batch=batch)
        claim = crud.claim_job(s, "seeder", 60, batch=batch)
        assert claim is not None
        assert crud.complete_job(s, claim.job_id, claim.claim_token, result, origin) is not None
    return sub.id
