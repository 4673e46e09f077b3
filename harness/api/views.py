"""Stored rows and specs rendered as wire models."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from harness.api.schemas import (
    ErrorFigures,
    ProblemPublic,
    ResultPublic,
    SizePublic,
    SubmissionPublic,
    SubmissionSummary,
    Timings,
    WorkerSilence,
)
from harness.db import queries
from harness.db.models import ACTIVE_STATUSES, Job, JobStatus, Result, Submission
from harness.precision import PRECISIONS
from harness.problems.spec import ProblemSpec
from harness.requirements import waiting_note
from harness.schema import EvalResult, Tolerance


def _errors(r: EvalResult) -> ErrorFigures:
    figs = [o for t in r.observations.trials for o in t.outputs]

    def worst(name: str) -> float | None:
        vals = [v for o in figs if (v := getattr(o, name)) is not None]
        return max(vals) if vals else None

    return ErrorFigures(trials=len(r.observations.trials), max_abs_err=worst("max_abs_err"),
                        max_rel_err=worst("max_rel_err"), err_vs_fp64=worst("err_vs_fp64"),
                        ref_err_vs_fp64=worst("ref_err_vs_fp64"))


def result_public(row: Result) -> ResultPublic:
    r = EvalResult.model_validate(row.payload)
    o = r.observations
    return ResultPublic(
        id=row.id, verdict=row.verdict, message=row.message, log_excerpt=r.log_excerpt, flags=r.flags,
        origin=row.origin, regraded_from=row.regraded_from, device=row.device, problem=r.problem,
        tolerance=r.tolerance, speedup_vs_eager=r.speedup_vs_eager, speedup_vs_compile=r.speedup_vs_compile,
        speedup_known_to=o.timing_known_to if r.speedup_vs_eager is not None else None, errors=_errors(r),
        timings=Timings(candidate=o.candidate_timing, eager=o.eager_timing, compile=o.compile_timing,
                        compile_baseline_error=o.compile_baseline_error),
        provenance=r.provenance, created_at=row.created_at,
    )


def worker_silence(job: Job | None, now: datetime, silent_after_s: float) -> WorkerSilence | None:
    """What a claimed job waits for when its worker has missed several heartbeats (it died, hung, or lost
    the database); None while the worker is heard from."""
    if job is None or job.status not in ACTIVE_STATUSES or job.heartbeat_at is None:
        return None
    silent_s = (now - job.heartbeat_at).total_seconds()
    if silent_s < silent_after_s:
        return None
    since = job.heartbeat_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    message = f"its worker {job.worker_id} has been silent since {since} ({silent_s:.0f} s)"
    if job.lease_expires_at is not None:
        at = job.lease_expires_at.strftime("%H:%M:%S UTC")
        message += (f"; the job goes back to the queue at {at}, when its lease expires, or sooner if a worker "
                    "restarts on that host" if job.lease_expires_at > now else
                    f"; its lease expired at {at}: the next worker that looks puts the job back in the queue")
    return WorkerSilence(worker_id=job.worker_id, silent_since=job.heartbeat_at, requeue_at=job.lease_expires_at,
                         message=message)


def waits_for(session: Session, silent_after_s: float, job: Job | None) -> str | None:
    """What a queued job waits for when no live worker can take it ("waits for a GPU worker; none is
    connected"); None when one can, or the job is not queued."""
    if job is None or job.status != JobStatus.queued.value:
        return None
    if queries.can_be_taken(queries.live_accepts(session, silent_after_s), job.needs):
        return None
    return waiting_note(job.needs)


def submission_public(sub: Submission, result: Result | None, job: Job | None, position: int | None,
                      waiting: WorkerSilence | None = None, waits_for: str | None = None) -> SubmissionPublic:
    return SubmissionPublic(
        id=sub.id, problem_id=sub.problem_id, problem_version=sub.problem_version, submitter=sub.submitter,
        model=sub.model, tags=sub.tags, metadata=sub.meta, text_kind=sub.text_kind, text=sub.text,
        precision=sub.precision, created_at=sub.created_at, status=sub.status, position=position,
        attempts=job.attempts if job else 0, verdict=sub.verdict, waiting=waiting, waits_for=waits_for,
        needs=job.needs if job else None, result=result_public(result) if result else None,
    )


def submission_summary(sub: Submission, result: Result | None) -> SubmissionSummary:
    return SubmissionSummary(
        id=sub.id, problem_id=sub.problem_id, submitter=sub.submitter, model=sub.model, tags=sub.tags,
        precision=sub.precision, created_at=sub.created_at, status=sub.status, verdict=sub.verdict,
        message=result.message if result else None, device=result.device if result else None,
        tolerance=Tolerance(atol=result.atol, rtol=result.rtol) if result else None,
        speedup_vs_eager=result.speedup_vs_eager if result else None,
        speedup_vs_compile=result.speedup_vs_compile if result else None,
    )


def problem_public(spec: ProblemSpec) -> ProblemPublic:
    return ProblemPublic(
        id=spec.id, version=spec.version, kernelbench_id=spec.kernelbench_id, name=spec.name,
        description=spec.description, tolerance=spec.tolerance,
        tolerances={p: spec.tolerance_at(p) for p in PRECISIONS},
        sizes={k: SizePublic(overrides=v.overrides, flops=v.flops, min_bytes=v.min_bytes)
               for k, v in spec.sizes.items()},
        compile_timeout_s=spec.compile_timeout_s, run_timeout_s=spec.run_timeout_s, init_args=spec.init_arg_names,
        stochastic=spec.stochastic,
    )
