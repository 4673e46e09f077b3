"""Reads. Nothing here writes or commits (that is `crud`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Row, Text, and_, case, cast, func, or_, select
from sqlalchemy.orm import Session, defer

from harness.db.crud import db_now, hash_token
from harness.db.models import ACTIVE_STATUSES, UNFINISHED_STATUSES, Job, JobStatus, Result, Submission, Token, WorkerRow
from harness.reporting import reference_vouched
from harness.requirements import met, slots_accept
from harness.verdicts import Verdict


def find_token(session: Session, secret: str) -> Token | None:
    return session.scalar(select(Token).where(Token.token_hash == hash_token(secret), Token.revoked_at.is_(None)))


def list_tokens(session: Session) -> Sequence[Token]:
    return session.scalars(select(Token).order_by(Token.id)).all()


def count_tokens(session: Session, *, active_only: bool = True) -> int:
    q = select(func.count(Token.id))
    if active_only:
        q = q.where(Token.revoked_at.is_(None))
    return session.scalar(q) or 0


# crud writes with UPDATE statements and sessions keep objects across commits: a get reloads the row.

def get_submission(session: Session, submission_id: int) -> Submission | None:
    return session.get(Submission, submission_id, populate_existing=True)


def get_result(session: Session, result_id: int | None) -> Result | None:
    return None if result_id is None else session.get(Result, result_id, populate_existing=True)


def latest_job(session: Session, submission_id: int) -> Job | None:
    return session.scalar(select(Job).where(Job.submission_id == submission_id).order_by(Job.id.desc()).limit(1)
                          .execution_options(populate_existing=True))


def get_job(session: Session, job_id: int) -> Job | None:
    return session.get(Job, job_id, populate_existing=True)


def queue_position(session: Session, job: Job) -> int | None:
    """1 for the next job a worker will claim; None when the job is not waiting."""
    if job.status != JobStatus.queued.value:
        return None
    ahead = session.scalar(select(func.count(Job.id)).where(
        Job.status == JobStatus.queued.value,
        or_(Job.priority > job.priority, and_(Job.priority == job.priority, Job.id < job.id))))
    return (ahead or 0) + 1


@dataclass
class SubmissionFilter:
    problem_id: str | None = None
    verdict: str | None = None
    submitter: str | None = None
    model: str | None = None
    status: str | None = None
    since: datetime | None = None
    ids: Sequence[int] | None = None


def _filtered(q, f: SubmissionFilter):
    if f.ids is not None:
        q = q.where(Submission.id.in_(f.ids))
    if f.problem_id is not None:
        q = q.where(Submission.problem_id == f.problem_id)
    if f.verdict is not None:
        q = q.where(Submission.verdict == f.verdict)
    if f.submitter is not None:
        q = q.where(Submission.submitter == f.submitter)
    if f.model is not None:
        q = q.where(Submission.model == f.model)
    if f.status is not None:
        q = q.where(Submission.status == f.status)
    if f.since is not None:  # a time given without a zone is UTC, as every stored time is
        since = f.since if f.since.tzinfo else f.since.replace(tzinfo=timezone.utc)
        q = q.where(Submission.created_at >= since)
    return q


def list_submissions(session: Session, f: SubmissionFilter, *, limit: int, offset: int, with_text: bool = True
                     ) -> tuple[Sequence[tuple[Submission, Result | None]], int]:
    """A page of submissions, newest first, each with its current result; and the total count. Without
    `with_text`, neither the submitted texts nor the results' payloads are loaded (a page of thousands that
    shows their columns only)."""
    total = session.scalar(_filtered(select(func.count(Submission.id)), f)) or 0
    q = _filtered(select(Submission, Result).outerjoin(Result, Result.id == Submission.current_result_id), f)
    if not with_text:
        q = q.options(defer(Submission.text), defer(Submission.meta), defer(Result.payload))
    rows = session.execute(q.order_by(Submission.id.desc()).limit(limit).offset(offset)).all()
    return rows, total


def submission_ids(session: Session, f: SubmissionFilter) -> list[int]:
    return list(session.scalars(_filtered(select(Submission.id), f).order_by(Submission.id)))


def current_results(session: Session, f: SubmissionFilter) -> Sequence[tuple[Submission, Result]]:
    """Each matching submission with its current result (submissions without one are left out)."""
    q = _filtered(select(Submission, Result).join(Result, Result.id == Submission.current_result_id), f)
    return session.execute(q.order_by(Submission.id)).all()


def scored_results(session: Session, problem_ids: Sequence[str] | None = None) -> Sequence[Row[Any]]:
    """Current results of every submission (optionally of some problems), for leaderboards and fast_p: rows of
    the columns ranking reads, named as `reporting.Scored`'s fields, with the result's problem_version, in the order
    selected here (a reader of 10,000 rows unpacks them); `flags` is the column's JSON text (results hold one of a
    few lists: a reader decodes each distinct text once)."""
    # Columns, not ORM objects: building 10,000 Submission and Result pairs took about 1 s of a leaderboard's time.
    # On the connection, not through the ORM's row handling, and flags not decoded row by row: together about a
    # quarter of the 60 ms that 10,000 rows took to read.
    q = select(Submission.id.label("submission_id"), Submission.problem_id, Submission.submitter, Submission.model,
               Result.problem_version, Result.verdict, Result.device, Result.device_name, Result.size, Result.precision,
               Result.speedup_vs_eager, Result.speedup_vs_compile, Result.candidate_ms, Result.created_at,
               cast(Result.flags, Text).label("flags")).join(Result, Result.id == Submission.current_result_id)
    if problem_ids is not None:
        q = q.where(Submission.problem_id.in_(problem_ids))
    return session.connection().execute(q.order_by(Submission.id)).all()


def submission_counts(session: Session) -> dict[str, tuple[int, int]]:
    """Per problem: all submissions, and those queued or being evaluated."""
    unfinished = func.sum(case((Submission.status.in_(UNFINISHED_STATUSES), 1), else_=0))
    rows = session.execute(select(Submission.problem_id, func.count(Submission.id), unfinished)
                           .group_by(Submission.problem_id)).all()
    return {pid: (total, int(pending or 0)) for pid, total, pending in rows}


def distinct_models(session: Session) -> list[str]:
    return list(session.scalars(select(Submission.model).distinct().order_by(Submission.model)))


class BaselineTime(BaseModel):
    """Also the wire model of /api/problems/{id}: the reference's times on one device and size, each the median
    of the measurements the harness vouches for (reporting.reference_vouched); None where there is none."""

    device: str
    device_name: str | None
    size: str
    precision: str = "fp32"  # the reference ran at it: an fp16 reference's time is another
    eager_ms: float | None
    compile_ms: float | None
    eager_measurements: int  # how many vouched measurements eager_ms is the median of
    compile_measurements: int
    unvouched: int  # measurements left out: timed in windows too noisy to vouch for, or beside a flagged result
    measured_at: datetime | None  # the latest vouched measurement


def baseline_times(session: Session, problem_id: str, problem_version: int) -> list[BaselineTime]:
    """The reference's times on each device and size, from every evaluation that timed it (the reference is
    timed beside each candidate that got that far): the median of the vouched ones, with how many there were.
    The latest alone may be one the harness refused to vouch for (15 ms where every other run gave 0.15 ms)."""
    rows = session.execute(
        select(Result.device, Result.device_name, Result.size, Result.precision, Result.eager_ms, Result.compile_ms,
               Result.created_at, Result.verdict, Result.flags)
        .where(Result.problem_id == problem_id, Result.problem_version == problem_version,
               Result.eager_ms.is_not(None), Result.device.is_not(None))
        .order_by(Result.id.desc())).all()
    groups: dict[tuple[str, str | None, str, str], list[Any]] = {}
    for row in rows:
        groups.setdefault((row.device, row.device_name, row.size, row.precision), []).append(row)
    out = []
    for (device, name, size, prec), group in groups.items():
        vouched = [r for r in group if reference_vouched(r.verdict, r.flags or [])]
        eager = [r.eager_ms for r in vouched]
        comp = [r.compile_ms for r in vouched if r.compile_ms is not None]
        out.append(BaselineTime(device=device, device_name=name, size=size, precision=prec,
                                eager_ms=statistics.median(eager) if eager else None,
                                compile_ms=statistics.median(comp) if comp else None, eager_measurements=len(eager),
                                compile_measurements=len(comp), unvouched=len(group) - len(vouched),
                                measured_at=vouched[0].created_at if vouched else None))
    return out


def reference_measurements(session: Session, problem_ids: Sequence[str], device: str) -> Sequence[Result]:
    """Every passed result of these problems on this device class that timed the reference, payload included
    (its timing statistics), newest first: only a passed one's reference times can be vouched for."""
    if not problem_ids:
        return []
    return session.scalars(select(Result).where(Result.problem_id.in_(problem_ids), Result.device == device,
                                                Result.verdict == "passed", Result.eager_ms.is_not(None))
                           .order_by(Result.id.desc())).all()


def results_for_export(session: Session, f: SubmissionFilter, batch: str | None = None
                       ) -> Sequence[tuple[Submission, Result | None]]:
    """Matching submissions (not their texts), each with its current result and its payload, oldest first."""
    q = _filtered(select(Submission, Result).outerjoin(Result, Result.id == Submission.current_result_id), f)
    if batch is not None:
        q = q.join(Job, Job.submission_id == Submission.id).where(Job.batch == batch)
    return session.execute(q.options(defer(Submission.text)).order_by(Submission.id)).all()


class DegenerateAt(BaseModel):
    """Also the wire model of /api/problems/{id}: a device, size and tolerance at which outputs that compute nothing
    pass (a result there carries the degenerate_tolerance flag)."""

    device: str
    size: str
    atol: float
    rtol: float


def degenerate_at(session: Session, problem_id: str, problem_version: int) -> list[DegenerateAt]:
    rows = session.execute(
        select(Result.device, Result.size, Result.atol, Result.rtol, Result.flags)
        .where(Result.problem_id == problem_id, Result.problem_version == problem_version,
               Result.verdict == "passed", Result.device.is_not(None))).all()
    found = {(d, s, a, r) for d, s, a, r, flags in rows if "degenerate_tolerance" in (flags or [])}
    return [DegenerateAt(device=d, size=s, atol=a, rtol=r) for d, s, a, r in sorted(found)]


def job_counts(session: Session, batch: str | None = None, job_ids: Sequence[int] | None = None) -> dict[str, int]:
    q = select(Job.status, func.count(Job.id)).group_by(Job.status)
    if batch is not None:
        q = q.where(Job.batch == batch)
    if job_ids is not None:
        q = q.where(Job.id.in_(job_ids))
    counts = {s.value: 0 for s in JobStatus}
    counts.update({status: n for status, n in session.execute(q)})
    return counts


def live_workers(session: Session, within_s: float) -> Sequence[WorkerRow]:
    """Workers not stopped that reported themselves within the last `within_s` (by the queue's clock)."""
    since = db_now(session) - timedelta(seconds=within_s)
    return session.scalars(select(WorkerRow).where(WorkerRow.last_seen >= since, WorkerRow.stopped_at.is_(None))
                           .order_by(WorkerRow.started_at)).all()


def live_accepts(session: Session, within_s: float) -> set[str] | None:
    """The needs that some live worker meets; None when no worker is live (then not even a job that needs
    nothing is taken)."""
    workers = live_workers(session, within_s)
    if not workers:
        return None
    return {n for w in workers for n in (w.accepts if w.accepts is not None else slots_accept(w.slots))}


def can_be_taken(accepts: set[str] | None, needs: str | None) -> bool:
    return accepts is not None and met(needs, accepts)


@dataclass
class UnmetNeed:
    """Queued jobs that need what no live worker has."""

    needs: str | None
    jobs: int
    submission_ids: list[int]  # the oldest few


def unmet_needs(session: Session, within_s: float, shown: int = 10) -> list[UnmetNeed]:
    accepts = live_accepts(session, within_s)
    queued = Job.status == JobStatus.queued.value
    rows = session.execute(select(Job.needs, func.count(Job.id)).where(queued).group_by(Job.needs)).all()
    out = []
    for needs, n in sorted(rows, key=lambda r: r[0] or ""):
        if can_be_taken(accepts, needs):
            continue
        which = Job.needs.is_(None) if needs is None else Job.needs == needs
        ids = list(session.scalars(select(Job.submission_id).where(queued, which).order_by(Job.id).limit(shown)))
        out.append(UnmetNeed(needs=needs, jobs=n, submission_ids=ids))
    return out


def running_workers_on(session: Session, hostname: str) -> Sequence[WorkerRow]:
    """Workers of one host not marked stopped, silent or not."""
    return session.scalars(select(WorkerRow).where(WorkerRow.hostname == hostname, WorkerRow.stopped_at.is_(None))
                           .order_by(WorkerRow.started_at)).all()


def batch_results(session: Session, batch: str) -> Sequence[tuple[Submission, Result | None]]:
    q = (select(Submission, Result).join(Job, Job.submission_id == Submission.id)
         .outerjoin(Result, Result.id == Submission.current_result_id)
         .where(Job.batch == batch).order_by(Submission.id))
    return session.execute(q).all()


def active_jobs(session: Session, job_ids: Sequence[int]) -> Sequence[tuple[Job, Submission]]:
    """The jobs among these that a worker holds (compiling or running), oldest claim first, with their submissions."""
    q = (select(Job, Submission).join(Submission, Submission.id == Job.submission_id)
         .where(Job.id.in_(job_ids), Job.status.in_(ACTIVE_STATUSES)).order_by(Job.claimed_at, Job.id))
    return session.execute(q).all()


def finished_like(session: Session, problem_id: str, text: str, model: str) -> Sequence[Submission]:
    """Submissions of this problem, text and model whose evaluation finished with a result that is not the
    harness's fault (infra_error): what `eval-dir --resume` need not evaluate again. Newest first."""
    q = (select(Submission).where(Submission.problem_id == problem_id, Submission.model == model,
                                  Submission.text == text, Submission.status == JobStatus.done.value,
                                  Submission.current_result_id.is_not(None),
                                  Submission.verdict != Verdict.infra_error.value)
         .order_by(Submission.id.desc()))
    return session.scalars(q).all()


def submissions_with_results(session: Session, ids: Sequence[int]) -> Sequence[tuple[Submission, Result | None]]:
    q = (select(Submission, Result).outerjoin(Result, Result.id == Submission.current_result_id)
         .where(Submission.id.in_(ids)).order_by(Submission.id))
    return session.execute(q).all()
