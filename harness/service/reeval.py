"""Batch re-evaluation of stored submissions: queue them again, or re-grade their stored figures.

Shared by `harness reeval` and the admin API. Re-grading needs no GPU and no worker: it is
`grading.grade` over the observations each result keeps.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from harness.config import Settings
from harness.db import crud, queries
from harness.db.models import JobStatus, ResultOrigin, Submission
from harness.db.session import Database
from harness.problems import Registry, UnknownProblem
from harness.schema import EvalResult, Tolerance
from harness.service.outcomes import regrade

Progress = Callable[[int, int], None]  # (done, total)

# Bulk re-evaluation yields to fresh submissions.
REEVAL_PRIORITY = -1


@dataclass
class RegradeSummary:
    matched: int = 0
    regraded: int = 0
    unchanged: int = 0
    skipped: int = 0  # results with no figures to grade (made by the queue)
    transitions: Counter[tuple[str, str]] = field(default_factory=Counter)


@dataclass
class Requeued:
    matched: int
    job_ids: list[int]
    verdict_before: dict[int, str]  # by job id

    @property
    def already_queued(self) -> int:
        return self.matched - len(self.job_ids)


def requeue(s: Session, settings: Settings, f: queries.SubmissionFilter) -> Requeued:
    """Queue the matching submissions again; those already queued or running are left as they are."""
    ids = queries.submission_ids(s, f)
    before = {sub.id: sub.verdict or "-" for sub in (s.get(Submission, i) for i in ids) if sub}
    jobs = crud.enqueue(s, ids, reason="reeval", max_attempts=settings.max_attempts, priority=REEVAL_PRIORITY)
    return Requeued(len(ids), [j.id for j in jobs], {j.id: before.get(j.submission_id, "-") for j in jobs})


def tolerance_from(atol: float | None, rtol: float | None, base: Tolerance | None = None) -> Tolerance | None:
    """The tolerance to re-grade under: `base` with the given parts replaced; a part given alone stands
    for both (atol = rtol, as KernelBench sets them)."""
    if atol is None and rtol is None:
        return base
    one = atol if atol is not None else rtol
    return Tolerance(atol=atol if atol is not None else (base.atol if base else one),
                     rtol=rtol if rtol is not None else (base.rtol if base else one))


def _changed(old: EvalResult, new: EvalResult) -> bool:
    keys = ("verdict", "message", "flags", "speedup_vs_eager", "speedup_vs_compile", "tolerance")
    return any(getattr(old, k) != getattr(new, k) for k in keys)


def regrade_matching(s: Session, registry: Registry, f: queries.SubmissionFilter, *,
                     tolerance: Tolerance | None = None, progress: Progress | None = None) -> RegradeSummary:
    """Grade the current result of each matching submission again, under `tolerance` or its problem's
    current one; a result whose grade changes gets a new result row that becomes current."""
    summary = RegradeSummary()
    rows = queries.current_results(s, f)
    summary.matched = len(rows)
    for n, (sub, res) in enumerate(rows, 1):
        if res.origin == ResultOrigin.queue.value:
            summary.skipped += 1
        else:
            old = EvalResult.model_validate(res.payload)
            tol = tolerance
            if tol is None:
                try:
                    tol = registry.get(sub.problem_id).tolerance
                except UnknownProblem:
                    tol = old.tolerance
            new = regrade(old, tol)
            if _changed(old, new):
                crud.add_regraded_result(s, res, new)
                summary.regraded += 1
            else:
                summary.unchanged += 1
            summary.transitions[(old.verdict.value, new.verdict.value)] += 1
        if progress:
            progress(n, summary.matched)
    return summary


def wait_for_jobs(db: Database, job_ids: list[int], *, poll_s: float = 1.0, progress: Progress | None = None,
                  stalled: Callable[[float], None] | None = None, stall_after_s: float = 30.0) -> dict[str, int]:
    """Block until the jobs are done; `stalled(seconds)` is called while none of them moves."""
    last_change, last_done = time.monotonic(), -1
    while True:
        with db.session() as s:
            counts = queries.job_counts(s, job_ids=job_ids)
        done = counts[JobStatus.done.value]
        if progress:
            progress(done, len(job_ids))
        if done >= len(job_ids):
            return counts
        moving = done + counts[JobStatus.compiling.value] + counts[JobStatus.running.value]
        if moving != last_done:
            last_change, last_done = time.monotonic(), moving
        elif stalled and time.monotonic() - last_change > stall_after_s:
            stalled(time.monotonic() - last_change)
            last_change = time.monotonic()
        time.sleep(poll_s)


def verdict_transitions(db: Database, before: dict[int, str]) -> Counter[tuple[str, str]]:
    """(verdict before, verdict now) over the given jobs' submissions."""
    out: Counter[tuple[str, str]] = Counter()
    with db.session() as s:
        for job_id, was in before.items():
            job = queries.get_job(s, job_id)
            sub = queries.get_submission(s, job.submission_id) if job else None
            if sub is not None:
                out[(was, sub.verdict or "-")] += 1
    return out
