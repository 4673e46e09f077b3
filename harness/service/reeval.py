"""Batch re-evaluation of stored submissions: queue them again, or re-grade their stored figures.

Shared by `harness reeval` and the admin API. Re-grading needs no GPU and no worker: it is
`grading.grade` over the observations each result keeps.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

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


class Outcome(str, Enum):
    """What a re-grade (or its undo) did to one result, as the summary table names it."""

    verdict_changed = "verdict changed"
    same_verdict = "same verdict, graded at the new tolerance"  # a new revision records the tolerance
    unchanged = "unchanged"
    no_figures = "no figures: a tolerance does not apply"  # e.g. compile_error, or made by the queue
    restored = "restored the previous grading"
    nothing_to_undo = "not re-graded: nothing to undo"


@dataclass
class RegradeSummary:
    matched: int = 0
    dry_run: bool = False
    # (verdict before, verdict after, outcome) -> results
    transitions: Counter[tuple[str, str, Outcome]] = field(default_factory=Counter)

    def count(self, *outcomes: Outcome) -> int:
        return sum(n for (_, _, o), n in self.transitions.items() if o in outcomes)

    @property
    def verdicts_changed(self) -> int:
        return self.count(Outcome.verdict_changed)

    @property
    def regraded(self) -> int:
        """Results given a new revision (or that would be, in a dry run)."""
        return self.count(Outcome.verdict_changed, Outcome.same_verdict)

    @property
    def unchanged(self) -> int:
        return self.count(Outcome.unchanged)

    @property
    def skipped(self) -> int:
        return self.count(Outcome.no_figures, Outcome.nothing_to_undo)

    @property
    def restored(self) -> int:
        return self.count(Outcome.restored)


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


def has_figures(result: EvalResult) -> bool:
    """Whether a tolerance enters the result's grade: some output was compared element by element. A
    compile error, an invalid submission or a shape mismatch grades the same under any tolerance."""
    obs = result.observations
    return obs.determinism is not None or any(
        o.max_abs_err is not None or o.nonfinite_mismatches is not None for t in obs.trials for o in t.outputs)


def regrade_matching(s: Session, registry: Registry, f: queries.SubmissionFilter, *,
                     tolerance: Tolerance | None = None, dry_run: bool = False,
                     progress: Progress | None = None) -> RegradeSummary:
    """Grade the current result of each matching submission again, under `tolerance` or its problem's
    current one at the precision the result ran at. A result whose grading changes gets a new revision (a result
    row that records where it came from) that becomes current; the old row is kept, so `undo_regrade` can go back
    to it."""
    summary = RegradeSummary(dry_run=dry_run)
    rows = queries.current_results(s, f)
    summary.matched = len(rows)
    for n, (sub, res) in enumerate(rows, 1):
        old = EvalResult.model_validate(res.payload)
        if res.origin == ResultOrigin.queue.value or not has_figures(old):
            summary.transitions[(old.verdict.value, old.verdict.value, Outcome.no_figures)] += 1
        else:
            tol = tolerance
            if tol is None:
                try:
                    tol = registry.get(sub.problem_id).tolerance_at(old.problem.precision)
                except UnknownProblem:
                    tol = old.tolerance
            new = regrade(old, tol)
            if not _changed(old, new):
                outcome = Outcome.unchanged
            else:
                outcome = Outcome.verdict_changed if new.verdict != old.verdict else Outcome.same_verdict
                if not dry_run:
                    crud.add_regraded_result(s, res, new)
            summary.transitions[(old.verdict.value, new.verdict.value, outcome)] += 1
        if progress:
            progress(n, summary.matched)
    return summary


def undo_regrade(s: Session, f: queries.SubmissionFilter, *, dry_run: bool = False) -> RegradeSummary:
    """Make current again the revision each matching submission's current re-grade was made from. A
    submission evaluated again since (its current result is not a re-grade) has nothing to undo."""
    summary = RegradeSummary(dry_run=dry_run)
    rows = queries.current_results(s, f)
    summary.matched = len(rows)
    for _sub, res in rows:
        previous = queries.get_result(s, res.regraded_from) if res.origin == ResultOrigin.regrade.value else None
        if previous is None:
            summary.transitions[(res.verdict, res.verdict, Outcome.nothing_to_undo)] += 1
            continue
        if not dry_run:
            crud.restore_result(s, previous)
        summary.transitions[(res.verdict, previous.verdict, Outcome.restored)] += 1
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


def stall_report(db: Database, job_ids: list[int], still_s: float, live_within_s: float) -> str:
    """What a watcher says when none of its jobs has moved for `still_s`: which of them a worker holds, in which state
    and for how long; only where no worker is alive, that none runs."""
    with db.session() as s:
        active = queries.active_jobs(s, job_ids)
        live = {w.id: w for w in queries.live_workers(s, live_within_s)}
        now = crud.db_now(s)
        waiting = queries.job_counts(s, job_ids=job_ids)[JobStatus.queued.value]
    lines = []
    for job, sub in active[:3]:
        file = (sub.meta or {}).get("file")
        held_s = (now - job.claimed_at).total_seconds() if job.claimed_at else 0.0
        line = (f"job {job.id} (submission {sub.id}, {sub.problem_id}{f', {file}' if file else ''}): {job.status} "
                f"for {held_s:.0f} s on worker {job.worker_id}")
        if job.worker_id not in live:
            line += (" which has stopped reporting: the job goes back to the queue when its lease expires")
        lines.append(line)
    if len(active) > 3:
        lines.append(f"and {len(active) - 3} more jobs held by workers")
    if not live:
        lines.append(f"{waiting} jobs wait and no worker is running: start `harness serve` or `harness worker`")
    elif active and waiting:
        lines.append(f"{waiting} more wait their turn")
    elif not active:
        lines.append(f"{waiting} jobs wait; the {len(live)} live workers ({', '.join(live)}) hold none of them "
                     "(busy with other jobs, or serving another batch or device)")
    return f"nothing finished for {still_s:.0f} s: " + "; ".join(lines)


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
