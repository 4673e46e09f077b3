"""/api/reeval: bulk re-evaluation (admin)."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from harness.api.deps import AdminDep, RegistryDep, SessionDep, SettingsDep
from harness.api.routes.submissions import problem_filter
from harness.api.schemas import ErrorBody, ReevalRequest, ReevalSummary
from harness.db import queries
from harness.service import reeval

router = APIRouter(prefix="/api", tags=["admin"])


@router.post("/reeval", response_model=ReevalSummary,
             responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 422: {"model": ErrorBody}})
def reeval_matching(body: ReevalRequest, session: SessionDep, settings: SettingsDep, registry: RegistryDep,
                    response: Response, _admin: AdminDep) -> ReevalSummary:
    """Queue the matching submissions again (202), or re-grade their stored figures (200, no GPU)."""
    f = queries.SubmissionFilter(problem_id=problem_filter(registry, body.problem),
                                 verdict=body.verdict.value if body.verdict else None, since=body.since)
    if body.regrade_only:
        tolerance = reeval.tolerance_from(body.atol, body.rtol)
        s = reeval.regrade_matching(session, registry, f, tolerance=tolerance)
        return ReevalSummary(matched=s.matched, regraded=s.regraded, unchanged=s.unchanged, skipped=s.skipped,
                             transitions={f"{a} -> {b}": n for (a, b), n in sorted(s.transitions.items())})
    r = reeval.requeue(session, settings, f)
    response.status_code = status.HTTP_202_ACCEPTED
    return ReevalSummary(matched=r.matched, queued=len(r.job_ids), already_queued=r.already_queued)
