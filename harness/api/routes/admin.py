"""/api/reeval: bulk re-evaluation (admin)."""

from __future__ import annotations

from collections import Counter

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
    """Queue the matching submissions again (202), re-grade their stored figures (200, no GPU), or undo their
    latest re-grade (200); `dry_run` reports what would happen and writes nothing."""
    f = queries.SubmissionFilter(problem_id=problem_filter(registry, body.problem),
                                 verdict=body.verdict.value if body.verdict else None, since=body.since)
    if body.regrade_only or body.undo:
        tolerance = reeval.tolerance_from(body.atol, body.rtol)
        s = reeval.undo_regrade(session, f, dry_run=body.dry_run) if body.undo else \
            reeval.regrade_matching(session, registry, f, tolerance=tolerance, dry_run=body.dry_run)
        transitions: Counter[str] = Counter()
        outcomes: Counter[str] = Counter()
        for (before, after, outcome), n in s.transitions.items():
            transitions[f"{before} -> {after}"] += n
            outcomes[outcome.value] += n
        return ReevalSummary(matched=s.matched, dry_run=s.dry_run, regraded=s.regraded,
                             verdicts_changed=s.verdicts_changed, unchanged=s.unchanged, skipped=s.skipped,
                             restored=s.restored, transitions=dict(sorted(transitions.items())),
                             outcomes=dict(sorted(outcomes.items())))
    if body.dry_run:
        return ReevalSummary(matched=len(queries.submission_ids(session, f)), dry_run=True)
    r = reeval.requeue(session, settings, f)
    response.status_code = status.HTTP_202_ACCEPTED
    return ReevalSummary(matched=r.matched, queued=len(r.job_ids), already_queued=r.already_queued)
