"""Results the service makes itself, and conversions between stored rows and report rows."""

from __future__ import annotations

import hashlib

from harness import grading
from harness import precision as precisions
from harness.db.models import Result, Submission
from harness.problems.spec import DEFAULT_TOLERANCE, ProblemSpec
from harness.reporting import Scored
from harness.schema import EvalResult, Observations, ProblemRef, Tolerance
from harness.verdicts import Verdict


def infra_result(submission: Submission, message: str, spec: ProblemSpec | None = None) -> EvalResult:
    """An infra_error result for a job that could not be evaluated (out of attempts, no such problem
    on this worker). Nothing was measured; the message is also the observations' reference error, so
    grading these figures again can only give infra_error."""
    precision = precisions.check(submission.precision or "fp32")
    return EvalResult(
        verdict=Verdict.infra_error, message=message,
        problem=ProblemRef(id=submission.problem_id, version=submission.problem_version,
                           kernelbench_id=spec.kernelbench_id if spec else None, size="n/a",
                           source=str(spec.source_path) if spec else "", precision=precision),
        tolerance=spec.tolerance_at(precision) if spec else precisions.tolerance(DEFAULT_TOLERANCE, precision),
        submission_sha256=hashlib.sha256(submission.text.encode("utf-8", "replace")).hexdigest(),
        observations=Observations(reference_error=message),
    )


def regrade(result: EvalResult, tolerance: Tolerance) -> EvalResult:
    """The same figures graded under `tolerance` (no GPU, no processes)."""
    g = grading.grade(result.observations, tolerance)
    return result.model_copy(update={**g.result_fields(), "tolerance": tolerance})


def scored(sub: Submission, res: Result) -> Scored:
    return Scored(submission_id=sub.id, problem_id=sub.problem_id, submitter=sub.submitter, model=sub.model,
                  verdict=res.verdict, device=res.device, device_name=res.device_name, size=res.size,
                  speedup_vs_eager=res.speedup_vs_eager, speedup_vs_compile=res.speedup_vs_compile,
                  candidate_ms=res.candidate_ms, created_at=res.created_at, precision=res.precision,
                  flags=list(res.flags or []))
