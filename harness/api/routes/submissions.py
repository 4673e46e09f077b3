"""/api/submissions: submit, poll, list; admin: delete, re-evaluate one."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Response, status

from harness.api.deps import AdminDep, RegistryDep, SessionDep, SettingsDep, WriterDep
from harness.api.errors import ProblemNotFound, unknown_problem_detail
from harness.api.schemas import (
    ErrorBody,
    Page,
    ReevalOne,
    SubmissionAccepted,
    SubmissionCreate,
    SubmissionPublic,
    SubmissionSummary,
)
from harness.api.views import submission_public, submission_summary, waits_for, worker_silence
from harness.config import Settings
from harness.db import crud, queries
from harness.db.models import JobStatus, Token
from harness.problems import Registry, UnknownProblem
from harness.problems.spec import ProblemSpec
from harness.requirements import needs_of_extracted
from harness.service.reeval import REEVAL_PRIORITY, regrade_matching
from harness.submission import InvalidSubmission, extract
from harness.verdicts import Verdict

router = APIRouter(prefix="/api/submissions", tags=["submissions"])

_DB_INT_MAX = 2**63 - 1  # larger numbers cannot reach the database: 422, not a driver's OverflowError
SubmissionId = Annotated[int, Path(ge=1, le=_DB_INT_MAX)]


def find_problem(registry: Registry, name: str) -> ProblemSpec:
    try:
        return registry.get(name)
    except UnknownProblem as e:
        raise ProblemNotFound(unknown_problem_detail(e, registry), e.suggestions) from None


def problem_filter(registry: Registry, name: str | None) -> str | None:
    """A known alias filters by its problem's id; anything else is taken as a stored id."""
    if name is None:
        return None
    try:
        return registry.get(name).id
    except UnknownProblem:
        return name


def _queue_limit(token: Token | None, settings: Settings) -> int | None:
    """How many unfinished submissions the caller may have; None for an admin, who has no limit."""
    if token is not None and token.is_admin:
        return None
    return token.max_queued if token is not None and token.max_queued else settings.max_queued_per_token


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=SubmissionAccepted, responses={
    400: {"model": ErrorBody, "description": "The body is not UTF-8."},
    401: {"model": ErrorBody}, 404: {"model": ErrorBody, "description": "Unknown problem (with suggestions)."},
    413: {"model": ErrorBody}, 422: {"model": ErrorBody}, 429: {"model": ErrorBody, "description": "Queue limit."}})
def create_submission(body: SubmissionCreate, session: SessionDep, settings: SettingsDep, registry: RegistryDep,
                      token: WriterDep) -> SubmissionAccepted:
    """Store a submission and queue its evaluation. It is stored before the answer, and evaluated even
    when its text holds no usable code (that is the verdict invalid_submission)."""
    spec = find_problem(registry, body.problem)
    limit = _queue_limit(token, settings)
    # The cheap refusal before the costly reading: a 429 costs one count, never a parse. The count is only a
    # first look; the write below counts again under its lock.
    if limit is not None and crud.unfinished_count(session, token) >= limit:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(crud.QueueLimitReached(limit)))
    text, kind = body.text_and_kind
    warning = None
    try:
        source: str | None = extract(text).source
    except InvalidSubmission as e:
        source, warning = None, f"{e}; it is stored and will be judged invalid_submission"
    new = crud.NewSubmission(problem_id=spec.id, problem_version=spec.version, text=text, text_kind=kind,
                             submitter=body.submitter, model=body.model, tags=body.tags, meta=body.metadata,
                             precision=body.precision)
    try:
        sub, job = crud.create_submission(session, new, token=token, queue_limit=limit,
                                          max_attempts=settings.max_attempts, needs=needs_of_extracted(source))
    except crud.QueueLimitReached as e:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(e)) from None
    waits = waits_for(session, settings.worker_silent_after_s, job)
    if waits is not None:
        warning = f"{warning}; {waits}" if warning else f"it {waits}: it is stored and queued until one is"
    return SubmissionAccepted(id=sub.id, status=sub.status, problem_id=spec.id,
                              position=queries.queue_position(session, job), url=f"/api/submissions/{sub.id}",
                              warning=warning)


@router.get("/{submission_id}", response_model=SubmissionPublic, responses={404: {"model": ErrorBody}})
def get_submission(submission_id: SubmissionId, session: SessionDep, settings: SettingsDep) -> SubmissionPublic:
    sub = queries.get_submission(session, submission_id)
    if sub is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no submission {submission_id}")
    job = queries.latest_job(session, sub.id)
    position = queries.queue_position(session, job) if job else None
    waiting = worker_silence(job, queries.db_now(session), settings.worker_silent_after_s)
    waits = waits_for(session, settings.worker_silent_after_s, job)
    return submission_public(sub, queries.get_result(session, sub.current_result_id), job, position, waiting, waits)


@router.get("", response_model=Page[SubmissionSummary])
def list_submissions(session: SessionDep, registry: RegistryDep,
                     problem: str | None = None, verdict: Verdict | None = None, submitter: str | None = None,
                     model: str | None = None, status_: Annotated[JobStatus | None, Query(alias="status")] = None,
                     since: datetime | None = None,
                     limit: Annotated[int, Query(ge=1, le=500)] = 50,
                     offset: Annotated[int, Query(ge=0, le=_DB_INT_MAX)] = 0) -> Page[SubmissionSummary]:
    """Submissions, newest first, filtered by problem, current verdict, submitter, model or status."""
    f = queries.SubmissionFilter(problem_id=problem_filter(registry, problem),
                                 verdict=verdict.value if verdict else None, submitter=submitter, model=model,
                                 status=status_.value if status_ else None, since=since)
    rows, total = queries.list_submissions(session, f, limit=limit, offset=offset)
    return Page[SubmissionSummary](items=[submission_summary(s, r) for s, r in rows], total=total, limit=limit,
                                   offset=offset)


@router.delete("/{submission_id}", status_code=status.HTTP_204_NO_CONTENT,
               responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 404: {"model": ErrorBody}})
def delete_submission(submission_id: SubmissionId, session: SessionDep, _admin: AdminDep) -> Response:
    """Delete a submission with its results (admin)."""
    if not crud.delete_submission(session, submission_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no submission {submission_id}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{submission_id}/reeval", response_model=ReevalOne, responses={
    401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 404: {"model": ErrorBody},
    409: {"model": ErrorBody, "description": "Already queued or running."}})
def reeval_submission(submission_id: SubmissionId, session: SessionDep, settings: SettingsDep, registry: RegistryDep,
                      request_response: Response, _admin: AdminDep, regrade_only: bool = False) -> ReevalOne:
    """Evaluate one submission again (202), or with regrade_only grade its stored figures again (200)."""
    sub = queries.get_submission(session, submission_id)
    if sub is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no submission {submission_id}")
    if regrade_only:
        regrade_matching(session, registry, queries.SubmissionFilter(ids=[sub.id]))
        sub = queries.get_submission(session, submission_id)
        return ReevalOne(submission_id=submission_id, verdict=sub.verdict if sub else None)
    jobs = crud.enqueue(session, [sub.id], reason="reeval", max_attempts=settings.max_attempts,
                        priority=REEVAL_PRIORITY)
    if not jobs:
        raise HTTPException(status.HTTP_409_CONFLICT, f"submission {submission_id} is already queued or running")
    request_response.status_code = status.HTTP_202_ACCEPTED
    return ReevalOne(submission_id=submission_id, job_id=jobs[0].id, position=queries.queue_position(session, jobs[0]))
