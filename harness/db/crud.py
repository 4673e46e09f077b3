"""Every write to the database, and the only module that commits.

Each function is one transaction. On SQLite it starts with BEGIN IMMEDIATE (`_write`), so a
writer that reads before it writes (a queue limit, a claim) holds the write lock from its first
read and waits out the busy timeout instead of failing. Queue transitions are compare-and-set on
the claim token a claim hands out: a worker whose lease expired and whose job was claimed again
finds its later writes match no row, so a job's result is written once.

Queue times (leases, back-offs) come from one clock, `db_now`: on PostgreSQL the database server's, since a
lease one host writes is judged expired by another, and hosts' clocks drift.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import delete, false, func, or_, select, text, update
from sqlalchemy.orm import Session

from harness.db.models import (
    ACTIVE_STATUSES,
    UNFINISHED_STATUSES,
    Job,
    JobStatus,
    Result,
    ResultOrigin,
    Submission,
    Token,
    WorkerRow,
    utcnow,
)
from harness.db.session import WRITE_OPTIONS
from harness.requirements import needs_of_text
from harness.schema import EvalResult

_QUEUE_LIMIT_LOCK = 0x6B68  # advisory lock space (first key) of the per-token queue limit


class QueueLimitReached(Exception):
    def __init__(self, limit: int):
        self.limit = limit
        super().__init__(f"this token already has {limit} unfinished submissions (the limit); "
                         "wait for some to finish")


def _write(session: Session) -> None:
    """Start the function's own write transaction (immediate on SQLite)."""
    if session.in_transaction():
        if session.new or session.dirty or session.deleted:
            raise RuntimeError("crud writes run in their own transaction; the session holds unsaved changes")
        session.commit()  # ends a read-only transaction (e.g. the token lookup of a request)
    session.connection(execution_options=WRITE_OPTIONS)


def _text(value: str) -> str:
    """Text as both databases can store it: PostgreSQL's text cannot hold NUL, so U+FFFD stands in for it, on
    SQLite too, so the two agree. Submitted files and evaluation messages (which quote a submission's
    output) are untrusted and may carry NULs; the API refuses them in the first place."""
    return value.replace("\x00", "\ufffd")


def _is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def db_now(session: Session) -> datetime:
    """Now, by the database's clock where the database is shared between hosts (PostgreSQL)."""
    if _is_postgres(session):
        naive = session.scalar(text("SELECT statement_timestamp() AT TIME ZONE 'UTC'"))
        return naive.replace(tzinfo=timezone.utc)
    return utcnow()


# ---- tokens ----------------------------------------------------------------------------------------

def hash_token(secret: str) -> str:
    # Tokens are 256 random bits: a plain hash cannot be brute-forced, and lookup stays an index hit.
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(session: Session, name: str, *, is_admin: bool = False,
                 max_queued: int | None = None) -> tuple[Token, str]:
    """A new token and its secret, which is shown once and stored only hashed."""
    _write(session)
    secret = "kh_" + secrets.token_urlsafe(32)
    token = Token(name=name, token_hash=hash_token(secret), is_admin=is_admin, max_queued=max_queued)
    session.add(token)
    session.commit()
    return token, secret


def revoke_token(session: Session, token_id: int) -> bool:
    _write(session)
    n = session.execute(update(Token).where(Token.id == token_id, Token.revoked_at.is_(None))
                        .values(revoked_at=utcnow())).rowcount
    session.commit()
    return bool(n)


# ---- submissions -----------------------------------------------------------------------------------

@dataclass
class NewSubmission:
    problem_id: str
    problem_version: int
    text: str
    text_kind: str  # "source" | "reply"
    submitter: str
    model: str
    tags: list[str]
    meta: dict[str, Any]
    created_at: datetime | None = None  # None: now; a batch import may keep the time a run was made
    precision: str = "fp32"  # what it is evaluated at (harness/precision.py)


def unfinished_count(session: Session, token: Token | None) -> int:
    """The unfinished jobs a token's queue limit counts; for None (open mode), the anonymous submitters', who share
    one allowance. A read, here beside the write that checks it again under its lock."""
    q = select(func.count(Job.id)).join(Submission, Submission.id == Job.submission_id).where(
        Job.status.in_(UNFINISHED_STATUSES))
    if token is None:
        q = q.where(Submission.token_id.is_(None), Job.reason == "submit")
    else:
        q = q.where(Submission.token_id == token.id)
    return session.scalar(q) or 0


class _FromText:
    """`needs` not given: read from the submission's text."""


FROM_TEXT = _FromText()


def create_submission(session: Session, new: NewSubmission, *, token: Token | None, queue_limit: int | None,
                      max_attempts: int, reason: str = "submit", batch: str | None = None,
                      priority: int = 0, needs: str | _FromText | None = FROM_TEXT) -> tuple[Submission, Job]:
    """Store a submission and queue its evaluation, both or neither.

    `queue_limit` is checked inside the transaction, so concurrent requests cannot overshoot it. `needs` is what
    `requirements.needs_of` says of its source, for a caller that has read it already.
    """
    if isinstance(needs, _FromText):
        # Before the transaction: parsing inside it would hold SQLite's one write lock (BEGIN IMMEDIATE) meanwhile.
        needs = needs_of_text(new.text)
    _write(session)
    try:
        if queue_limit is not None and _is_postgres(session):
            # Count-then-insert is atomic on SQLite (BEGIN IMMEDIATE is the lock); PostgreSQL's READ COMMITTED
            # needs one, or two requests could both see room for one more. Per token (0: anonymous).
            session.execute(text("SELECT pg_advisory_xact_lock(:space, :key)"),
                            {"space": _QUEUE_LIMIT_LOCK, "key": token.id if token else 0})
        if queue_limit is not None and unfinished_count(session, token) >= queue_limit:
            raise QueueLimitReached(queue_limit)
        sub = Submission(problem_id=new.problem_id, problem_version=new.problem_version, text=_text(new.text),
                         text_kind=new.text_kind, precision=new.precision, submitter=_text(new.submitter),
                         model=_text(new.model), tags=new.tags,
                         meta=new.meta, token_id=token.id if token else None, status=JobStatus.queued.value,
                         created_at=new.created_at or db_now(session))
        session.add(sub)
        session.flush()
        job = Job(submission_id=sub.id, reason=reason, batch=batch, priority=priority, max_attempts=max_attempts,
                  not_before=db_now(session), needs=needs)
        session.add(job)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return sub, job


def enqueue(session: Session, submission_ids: Iterable[int], *, reason: str, max_attempts: int,
            priority: int = 0, batch: str | None = None) -> list[Job]:
    """Queue a new evaluation of stored submissions; one already queued or running is left as it is."""
    _write(session)
    ids = list(submission_ids)
    # Lock the submissions (PostgreSQL; SQLite's write lock covers it): enqueues racing on one submission would
    # both find it idle and queue two jobs.
    session.execute(select(Submission.id).where(Submission.id.in_(ids)).with_for_update())
    busy = set(session.scalars(select(Job.submission_id).where(Job.submission_id.in_(ids),
                                                               Job.status.in_(UNFINISHED_STATUSES))))
    now = db_now(session)
    # Decided again from the text: a re-evaluation follows what the harness now knows a source needs.
    texts = dict(session.execute(select(Submission.id, Submission.text).where(
        Submission.id.in_([i for i in ids if i not in busy]))).all())
    jobs = [Job(submission_id=i, reason=reason, batch=batch, priority=priority, max_attempts=max_attempts,
                not_before=now, needs=needs_of_text(texts[i])) for i in ids if i in texts]
    session.add_all(jobs)
    if jobs:
        session.execute(update(Submission).where(Submission.id.in_([j.submission_id for j in jobs]))
                        .values(status=JobStatus.queued.value))
    session.commit()
    return jobs


def delete_submission(session: Session, submission_id: int) -> bool:
    """Remove a submission with its jobs and results. A worker evaluating it finds its job gone."""
    _write(session)
    session.execute(delete(Result).where(Result.submission_id == submission_id))
    session.execute(delete(Job).where(Job.submission_id == submission_id))
    n = session.execute(delete(Submission).where(Submission.id == submission_id)).rowcount
    session.commit()
    return bool(n)


def delete_unfinished(session: Session, batch: str) -> list[int]:
    """Remove the submissions of a batch whose evaluation has not finished (queued, or held by a worker, whose
    later writes then miss): a batch stopped by its owner leaves nothing queued. Returns their ids."""
    _write(session)
    ids = list(session.scalars(select(Job.submission_id).where(Job.batch == batch,
                                                               Job.status.in_(UNFINISHED_STATUSES))))
    if ids:
        session.execute(delete(Result).where(Result.submission_id.in_(ids)))
        session.execute(delete(Job).where(Job.submission_id.in_(ids)))
        session.execute(delete(Submission).where(Submission.id.in_(ids)))
    session.commit()
    return ids


# ---- results ---------------------------------------------------------------------------------------

ERROR_FIGURES = ("max_abs_err", "err_vs_fp64", "ref_err_vs_fp64")


def worst_errors(payload: dict[str, Any]) -> dict[str, float | None]:
    """The largest of each error figure over every output of every trial of a stored EvalResult."""
    trials = (payload.get("observations") or {}).get("trials") or []
    worst: dict[str, float | None] = {}
    for name in ERROR_FIGURES:
        vals = [v for t in trials for o in t.get("outputs") or [] if (v := o.get(name)) is not None]
        worst[name] = max(vals) if vals else None
    return worst


def _result_row(submission_id: int, job_id: int | None, origin: ResultOrigin, r: EvalResult,
                regraded_from: int | None = None) -> Result:
    obs, prov = r.observations, r.provenance
    payload = r.model_dump(mode="json")
    return Result(
        submission_id=submission_id, job_id=job_id, origin=origin.value, regraded_from=regraded_from,
        verdict=r.verdict.value, message=_text(r.message), problem_id=r.problem.id, problem_version=r.problem.version,
        size=r.problem.size, precision=r.problem.precision, device=prov.device if prov else None,
        device_name=prov.device_name if prov else None,
        atol=r.tolerance.atol, rtol=r.tolerance.rtol, speedup_vs_eager=r.speedup_vs_eager,
        speedup_vs_compile=r.speedup_vs_compile,
        candidate_ms=obs.candidate_timing.median_ms if obs.candidate_timing else None,
        eager_ms=obs.eager_timing.median_ms if obs.eager_timing else None,
        compile_ms=obs.compile_timing.median_ms if obs.compile_timing else None,
        harness_version=prov.harness_version if prov else None, flags=[f.check for f in r.flags],
        **worst_errors(payload), payload=payload,
    )


def _set_current(session: Session, result: Result, status: str | None = JobStatus.done.value) -> None:
    values: dict[str, Any] = {"verdict": result.verdict, "current_result_id": result.id}
    if status is not None:
        values["status"] = status
    session.execute(update(Submission).where(Submission.id == result.submission_id).values(**values))


def add_regraded_result(session: Session, old: Result, regraded: EvalResult) -> Result:
    """A new result graded from an old one's figures; it becomes the submission's current result."""
    _write(session)
    row = _result_row(old.submission_id, None, ResultOrigin.regrade, regraded, regraded_from=old.id)
    session.add(row)
    session.flush()
    _make_current_revision(session, row)
    session.commit()
    return row


def restore_result(session: Session, previous: Result) -> None:
    """Make an earlier result of a submission its current one again (the undo of a re-grade); the
    re-graded row stays, as history."""
    _write(session)
    _make_current_revision(session, previous)
    session.commit()


def _make_current_revision(session: Session, row: Result) -> None:
    sub_status = session.scalar(select(Submission.status).where(Submission.id == row.submission_id))
    # A submission being evaluated again keeps its queue status; the new evaluation will supersede this.
    _set_current(session, row, status=None if sub_status in UNFINISHED_STATUSES else JobStatus.done.value)


# ---- the queue -------------------------------------------------------------------------------------

@dataclass
class ClaimedJob:
    job_id: int
    claim_token: str
    submission_id: int
    attempts: int
    max_attempts: int
    problem_id: str
    text: str
    priority: int = 0  # the job's (fresh submissions 0, re-evaluations below)
    precision: str = "fp32"  # the submission's


def claim_job(session: Session, worker_id: str, lease_s: float, *, batch: str | None = None,
              accepts: Collection[str] | None = None) -> ClaimedJob | None:
    """Take the next queued job, atomically, with a lease.

    `accepts`: the needs the worker meets (`requirements.accepted`); a job needing anything else is left for a
    worker that meets it. None takes any job (a tool that stores results without evaluating, as the demo).

    One UPDATE picks and takes the row. On SQLite the write lock makes it atomic; on PostgreSQL the
    subquery's FOR UPDATE SKIP LOCKED (SQLite's compiler leaves it out) lets claimers pass rows
    another claimer holds, and the outer `status = 'queued'` re-checks the row once locked.
    """
    _write(session)
    now = db_now(session)
    pick = (select(Job.id).where(Job.status == JobStatus.queued.value, Job.not_before <= now)
            .order_by(Job.priority.desc(), Job.id).limit(1).with_for_update(skip_locked=True))
    if batch is not None:
        pick = pick.where(Job.batch == batch)
    if accepts is not None:
        pick = pick.where(or_(Job.needs.is_(None), Job.needs.in_(list(accepts))))
    token = uuid.uuid4().hex
    row = session.execute(
        update(Job).where(Job.id == pick.scalar_subquery(), Job.status == JobStatus.queued.value)
        .values(status=JobStatus.compiling.value, claim_token=token, worker_id=worker_id,
                attempts=Job.attempts + 1, claimed_at=now, heartbeat_at=now,
                lease_expires_at=now + timedelta(seconds=lease_s))
        .returning(Job.id, Job.submission_id, Job.attempts, Job.max_attempts, Job.priority)
        .execution_options(synchronize_session=False)
    ).one_or_none()
    if row is None:
        session.commit()
        return None
    job_id, sub_id, attempts, max_attempts, priority = row
    problem_id, text, precision = session.execute(select(Submission.problem_id, Submission.text, Submission.precision)
                                                  .where(Submission.id == sub_id)).one()
    session.execute(update(Submission).where(Submission.id == sub_id).values(status=JobStatus.compiling.value))
    session.commit()
    return ClaimedJob(job_id, token, sub_id, attempts, max_attempts, problem_id, text, priority, precision)


def heartbeat(session: Session, worker_id: str, claim_tokens: Iterable[str], lease_s: float) -> set[str]:
    """Extend the leases of the jobs a worker holds; returns the tokens it still holds."""
    _write(session)
    now = db_now(session)
    tokens = list(claim_tokens)
    held: set[str] = set()
    if tokens:
        held = set(session.scalars(
            update(Job).where(Job.claim_token.in_(tokens), Job.status.in_(ACTIVE_STATUSES))
            .values(heartbeat_at=now, lease_expires_at=now + timedelta(seconds=lease_s))
            .returning(Job.claim_token).execution_options(synchronize_session=False)))
    session.execute(update(WorkerRow).where(WorkerRow.id == worker_id).values(last_seen=now))
    session.commit()
    return held


def _cas(session: Session, job_id: int, claim_token: str, /, **values: Any) -> bool:
    n = session.execute(update(Job).where(Job.id == job_id, Job.claim_token == claim_token,
                                          Job.status.in_(ACTIVE_STATUSES)).values(**values)
                        .execution_options(synchronize_session=False)).rowcount
    return bool(n)


def mark_running(session: Session, job_id: int, claim_token: str, status: JobStatus = JobStatus.running) -> bool:
    """The job is in a slot: `running`, or `compiling` while the slot builds the candidate itself (no compile
    pool built it ahead). False when the job is no longer this claim's."""
    _write(session)
    ok = _cas(session, job_id, claim_token, status=status.value)
    if ok:
        session.execute(update(Submission).where(Submission.id == select(Job.submission_id).where(
            Job.id == job_id).scalar_subquery()).values(status=status.value))
    session.commit()
    return ok


def complete_job(session: Session, job_id: int, claim_token: str, result: EvalResult,
                 origin: ResultOrigin = ResultOrigin.sandbox) -> Result | None:
    """Store a job's result and finish it; None when the claim is no longer this worker's."""
    _write(session)
    sub_id = session.scalar(select(Job.submission_id).where(Job.id == job_id))
    if sub_id is None or not _cas(session, job_id, claim_token, status=JobStatus.done.value,
                                  finished_at=db_now(session), last_error=None):
        session.rollback()
        return None
    row = _result_row(sub_id, job_id, origin, result)
    session.add(row)
    session.flush()
    _set_current(session, row)
    session.commit()
    return row


def retry_job(session: Session, job_id: int, claim_token: str, error: str, delay_s: float) -> bool:
    """Put a job that met an infra error back in the queue, after a back-off."""
    _write(session)
    ok = _cas(session, job_id, claim_token, status=JobStatus.queued.value, claim_token=None, lease_expires_at=None,
              last_error=_text(error[:4000]), not_before=db_now(session) + timedelta(seconds=delay_s))
    if ok:
        _set_submission_status_of_job(session, job_id, JobStatus.queued.value)
    session.commit()
    return ok


def release_job(session: Session, job_id: int, claim_token: str) -> bool:
    """Give back a job a stopping worker has not evaluated; the attempt does not count."""
    _write(session)
    ok = _cas(session, job_id, claim_token, status=JobStatus.queued.value, claim_token=None,
              lease_expires_at=None, attempts=Job.attempts - 1)
    if ok:
        _set_submission_status_of_job(session, job_id, JobStatus.queued.value)
    session.commit()
    return ok


def _set_submission_status_of_job(session: Session, job_id: int, status: str) -> None:
    session.execute(update(Submission).where(Submission.id == select(Job.submission_id).where(
        Job.id == job_id).scalar_subquery()).values(status=status))


def requeue_expired(session: Session, lost_result: Callable[[Submission, Job], EvalResult],
                    now: datetime | None = None, *, dead_workers: Sequence[str] = ()) -> tuple[list[int], list[int]]:
    """Jobs whose worker stopped renewing its lease go back to the queue, and at once those of
    `dead_workers` (known to be gone: their process no longer runs), who are marked stopped. Jobs out of
    attempts get an infra_error result from `lost_result`. Returns (requeued job ids, failed job ids)."""
    _write(session)
    now = now or db_now(session)
    gone = Job.worker_id.in_(dead_workers) if dead_workers else false()
    # SKIP LOCKED (PostgreSQL): a row locked now is being renewed, finished or requeued by someone else.
    expired = session.scalars(select(Job).where(Job.status.in_(ACTIVE_STATUSES), or_(Job.lease_expires_at < now, gone))
                              .order_by(Job.id).with_for_update(skip_locked=True)).all()
    if dead_workers:
        session.execute(update(WorkerRow).where(WorkerRow.id.in_(dead_workers), WorkerRow.stopped_at.is_(None))
                        .values(stopped_at=now))
    requeued: list[int] = []
    failed: list[int] = []
    for job in expired:
        why = "is gone" if job.worker_id in dead_workers else "stopped renewing its lease"
        note = f"worker {job.worker_id} {why} (attempt {job.attempts} of {job.max_attempts})"
        if job.attempts < job.max_attempts:
            if _cas(session, job.id, job.claim_token or "", status=JobStatus.queued.value, claim_token=None,
                    lease_expires_at=None, last_error=note):
                _set_submission_status_of_job(session, job.id, JobStatus.queued.value)
                requeued.append(job.id)
            continue
        sub = session.get(Submission, job.submission_id)
        if sub is None or not _cas(session, job.id, job.claim_token or "", status=JobStatus.done.value,
                                   finished_at=now, last_error=note):
            continue
        row = _result_row(sub.id, job.id, ResultOrigin.queue, lost_result(sub, job))
        session.add(row)
        session.flush()
        _set_current(session, row)
        failed.append(job.id)
    session.commit()
    return requeued, failed


# ---- workers ---------------------------------------------------------------------------------------

def register_worker(session: Session, worker_id: str, *, hostname: str, pid: int, slots: list[str],
                    accepts: list[str] | None = None) -> None:
    _write(session)
    now = db_now(session)
    session.merge(WorkerRow(id=worker_id, hostname=hostname, pid=pid, slots=slots, accepts=accepts, started_at=now,
                            last_seen=now, stopped_at=None))
    session.commit()


def worker_stopped(session: Session, worker_id: str) -> None:
    _write(session)
    session.execute(update(WorkerRow).where(WorkerRow.id == worker_id).values(stopped_at=db_now(session)))
    session.commit()
