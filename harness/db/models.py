"""ORM models: submissions, the job queue, evaluation results, API tokens, live workers.

The queue is the `jobs` table (DESIGN.md): a worker claims a row with a lease it renews by
heartbeat; a result row references its job uniquely, so a job's result is written once.
"""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Index, Integer, String, Text, TypeDecorator
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in Python, naive UTC in the database.

    SQLite has no time zones; storing naive UTC everywhere keeps comparisons (lease expiry) exact.
    """

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=timezone.utc)


class JobStatus(str, Enum):
    queued = "queued"
    compiling = "compiling"  # claimed: in the CPU compile pool, or waiting for a slot
    running = "running"  # in an evaluation slot
    done = "done"


ACTIVE_STATUSES = (JobStatus.compiling.value, JobStatus.running.value)
UNFINISHED_STATUSES = (JobStatus.queued.value, *ACTIVE_STATUSES)


class ResultOrigin(str, Enum):
    sandbox = "sandbox"  # an evaluation's EvalResult
    queue = "queue"  # made by the queue when a job ran out of attempts; nothing was measured
    regrade = "regrade"  # a stored result graded again under another tolerance


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON, list[str]: JSON}


class Token(Base):
    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the secret
    is_admin: Mapped[bool] = mapped_column(default=False)
    max_queued: Mapped[int | None] = mapped_column(default=None)  # overrides the setting when set
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class Submission(Base):
    __tablename__ = "submissions"

    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[str] = mapped_column(String(200), index=True)
    problem_version: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)  # exactly what was submitted: a source file or an LLM reply
    text_kind: Mapped[str] = mapped_column(String(8))  # "source" | "reply"
    # What it is evaluated at (harness/precision.py); what was stored before there was a choice ran at fp32.
    precision: Mapped[str] = mapped_column(String(8), default="fp32", server_default="fp32")
    submitter: Mapped[str] = mapped_column(String(100), index=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    tags: Mapped[list[str]] = mapped_column(default=list)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    token_id: Mapped[int | None] = mapped_column(ForeignKey("tokens.id", ondelete="SET NULL"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    # Denormalised from the latest job and result, kept in step by crud, so listing and filtering
    # need no joins.
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.queued.value, index=True)
    verdict: Mapped[str | None] = mapped_column(String(32), index=True)
    current_result_id: Mapped[int | None] = mapped_column(default=None)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_claim_order", "status", "priority", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    submission_id: Mapped[int] = mapped_column(ForeignKey("submissions.id", ondelete="CASCADE"), index=True)
    reason: Mapped[str] = mapped_column(String(16))  # "submit" | "reeval" | "eval-dir"
    batch: Mapped[str | None] = mapped_column(String(100), index=True)  # a worker may claim one batch only
    # What evaluating it needs of a worker (`harness.requirements`): None, "cuda", "cuda sm_90a". Only a worker
    # that meets it claims the job; decided from the text when the job is queued.
    needs: Mapped[str | None] = mapped_column(String(32), default=None)
    priority: Mapped[int] = mapped_column(default=0)  # higher first; bulk re-evaluation below new submissions
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.queued.value)
    attempts: Mapped[int] = mapped_column(default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    not_before: Mapped[datetime] = mapped_column(default=utcnow)  # retry back-off
    claim_token: Mapped[str | None] = mapped_column(String(32))  # new per claim: a stale worker's writes miss
    worker_id: Mapped[str | None] = mapped_column(String(100))
    claimed_at: Mapped[datetime | None] = mapped_column(default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Result(Base):
    __tablename__ = "results"

    id: Mapped[int] = mapped_column(primary_key=True)
    submission_id: Mapped[int] = mapped_column(ForeignKey("submissions.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), unique=True)
    origin: Mapped[str] = mapped_column(String(16))
    regraded_from: Mapped[int | None] = mapped_column(default=None)
    verdict: Mapped[str] = mapped_column(String(32), index=True)
    message: Mapped[str] = mapped_column(Text)
    problem_id: Mapped[str] = mapped_column(String(200), index=True)
    problem_version: Mapped[int] = mapped_column(Integer)
    size: Mapped[str] = mapped_column(String(32))
    precision: Mapped[str] = mapped_column(String(8), default="fp32", server_default="fp32")  # ranked apart
    device: Mapped[str | None] = mapped_column(String(8), index=True)  # "cpu" | "cuda"; None: nothing ran
    device_name: Mapped[str | None] = mapped_column(String(200))
    atol: Mapped[float]
    rtol: Mapped[float]
    speedup_vs_eager: Mapped[float | None]
    speedup_vs_compile: Mapped[float | None]
    candidate_ms: Mapped[float | None]
    eager_ms: Mapped[float | None]
    compile_ms: Mapped[float | None]
    harness_version: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The checks of its flags (e.g. "no_custom_kernel", "static:introspection"): what ranking needs of them.
    flags: Mapped[list[str]] = mapped_column(default=list)
    # The largest error figures over every output of every trial: what a results table shows of them.
    max_abs_err: Mapped[float | None] = mapped_column(default=None)
    err_vs_fp64: Mapped[float | None] = mapped_column(default=None)
    ref_err_vs_fp64: Mapped[float | None] = mapped_column(default=None)
    # The whole EvalResult: every raw figure, so any tolerance can be re-graded without a GPU.
    payload: Mapped[dict[str, Any]]


class WorkerRow(Base):
    """A worker process as it last reported itself: for /healthz and for commands that wait on the queue."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int]
    slots: Mapped[list[str]]  # e.g. ["cuda:0 NVIDIA H100 80GB HBM3", "cpu"]
    # The job needs it meets (`requirements.accepted`); None: registered before it said (read from its slots).
    accepts: Mapped[list[str] | None] = mapped_column(default=None)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
    stopped_at: Mapped[datetime | None] = mapped_column(default=None)
