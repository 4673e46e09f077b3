"""The job queue: atomic claims with a lease, heartbeats, requeue of expired leases, bounded attempts,
results written once. Every test runs on SQLite and on PostgreSQL; the race tests use real processes on one
database."""

from __future__ import annotations

import multiprocessing as mp
import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text

from harness import grading
from harness.config import Settings
from harness.db import crud, queries
from harness.db.models import Job, Result, Submission, utcnow
from harness.db.session import Database
from harness.schema import EvalResult
from harness.service.outcomes import infra_result
from harness.verdicts import Verdict

from .factories import eval_result, new_submission

pytestmark = pytest.mark.both_databases


def _enqueue(db, n: int, **kw) -> list[int]:
    ids = []
    with db.session() as s:
        for _ in range(n):
            _, job = crud.create_submission(s, new_submission(), token=None, queue_limit=None, max_attempts=3, **kw)
            ids.append(job.id)
    return ids


def _lost(sub: Submission, job: Job) -> EvalResult:
    return infra_result(sub, f"lost after {job.attempts} attempts")


def test_claims_follow_priority_then_age_and_skip_backed_off_and_other_batches(db):
    low = _enqueue(db, 1, priority=-1)
    first, second = _enqueue(db, 2)
    other_batch = _enqueue(db, 1, batch="b1")
    with db.session() as s:
        s.execute(Job.__table__.update().where(Job.id == second).values(not_before=utcnow() + timedelta(hours=1)))
        s.commit()
        got = [crud.claim_job(s, "w", 30) for _ in range(4)]
    assert [c.job_id if c else None for c in got] == [first, other_batch[0], low[0], None]
    assert [c.priority for c in got[:3]] == [0, 0, -1]  # the worker's slots order what they hold by it too
    assert got[0].attempts == 1 and got[0].text.startswith("import torch")
    with db.session() as s:
        job = queries.get_job(s, first)
        assert job.status == "compiling" and job.worker_id == "w" and job.lease_expires_at > utcnow()
        assert queries.get_submission(s, job.submission_id).status == "compiling"


def test_a_batch_worker_claims_only_its_batch(db):
    _enqueue(db, 1)
    mine = _enqueue(db, 1, batch="run-1")
    with db.session() as s:
        assert crud.claim_job(s, "w", 30, batch="run-1").job_id == mine[0]
        assert crud.claim_job(s, "w", 30, batch="run-1") is None


def test_heartbeat_extends_held_leases_and_reports_lost_ones(db):
    a, _ = _enqueue(db, 2)
    with db.session() as s:
        ca, cb = crud.claim_job(s, "w", 1), crud.claim_job(s, "w", 1)
        before = queries.get_job(s, a).lease_expires_at
        assert crud.delete_submission(s, cb.submission_id)  # b's job is gone: its lease is lost
        held = crud.heartbeat(s, "w", [ca.claim_token, cb.claim_token], 60)
        assert held == {ca.claim_token}
        assert queries.get_job(s, a).lease_expires_at > before + timedelta(seconds=30)


def test_a_result_is_written_once_and_a_stale_claim_writes_nothing(db):
    (job_id,) = _enqueue(db, 1)
    result = eval_result()
    with db.session() as s:
        c1 = crud.claim_job(s, "w1", 0.01)
        time.sleep(0.05)
        assert crud.requeue_expired(s, _lost) == ([job_id], [])
        c2 = crud.claim_job(s, "w2", 30)
        assert c2.job_id == job_id and c2.attempts == 2
        assert crud.mark_running(s, job_id, c1.claim_token) is False
        assert crud.complete_job(s, job_id, c1.claim_token, result) is None  # w1 woke up late
        assert crud.complete_job(s, job_id, c2.claim_token, result) is not None
        assert crud.complete_job(s, job_id, c2.claim_token, result) is None  # and not twice
        assert s.scalar(select(func.count(Result.id)).where(Result.job_id == job_id)) == 1
        sub = queries.get_submission(s, c2.submission_id)
        assert sub.status == "done" and sub.verdict == "passed" and sub.current_result_id is not None


def test_an_expired_job_out_of_attempts_gets_an_infra_error_result_that_regrades_to_infra_error(db):
    (job_id,) = _enqueue(db, 1)
    with db.session() as s:
        for _ in range(3):
            assert crud.claim_job(s, "w", 0.01).job_id == job_id
            time.sleep(0.03)
            requeued, failed = crud.requeue_expired(s, _lost)
        assert (requeued, failed) == ([], [job_id])
        assert crud.claim_job(s, "w", 30) is None
        (row,) = s.scalars(select(Result).where(Result.job_id == job_id)).all()
        assert row.verdict == "infra_error" and row.origin == "queue" and "lost after 3 attempts" in row.message
        stored = EvalResult.model_validate(row.payload)
        assert grading.grade(stored.observations, stored.tolerance).verdict == Verdict.infra_error
        assert queries.get_job(s, job_id).status == "done"


def test_retry_backs_off_and_release_does_not_count_the_attempt(db):
    a, b = _enqueue(db, 2)
    with db.session() as s:
        ca, cb = crud.claim_job(s, "w", 30), crud.claim_job(s, "w", 30)
        assert crud.retry_job(s, a, ca.claim_token, "GPU fell off the bus", delay_s=3600)
        assert crud.release_job(s, b, cb.claim_token)
        job_a, job_b = queries.get_job(s, a), queries.get_job(s, b)
        assert job_a.status == "queued" and job_a.attempts == 1 and job_a.last_error == "GPU fell off the bus"
        assert job_b.status == "queued" and job_b.attempts == 0
        assert crud.claim_job(s, "w", 30).job_id == b  # a waits out its back-off


def test_the_queue_limit_counts_a_tokens_unfinished_submissions(db):
    with db.session() as s:
        token, _ = crud.create_token(s, "bob")
        for _ in range(2):
            crud.create_submission(s, new_submission(), token=token, queue_limit=2, max_attempts=3)
        with pytest.raises(crud.QueueLimitReached):
            crud.create_submission(s, new_submission(), token=token, queue_limit=2, max_attempts=3)
        claim = crud.claim_job(s, "w", 30)
        crud.complete_job(s, claim.job_id, claim.claim_token, eval_result())
        crud.create_submission(s, new_submission(), token=token, queue_limit=2, max_attempts=3)  # room again
        assert s.scalar(select(func.count(Submission.id))) == 3


def test_a_claim_passes_over_a_job_another_claimer_holds_locked(db, db_settings):
    """PostgreSQL: SKIP LOCKED, so a claimer never waits on (or takes) the row another transaction is claiming.
    SQLite has one writer at a time and nothing to skip."""
    if db.engine.dialect.name != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    first, second = _enqueue(db, 2)
    with db.session() as holder, db.session() as s:
        holder.execute(select(Job.id).where(Job.id == first).with_for_update())  # mid-claim, not committed
        s.execute(text("SET LOCAL lock_timeout = '2s'"))  # a blocking claim fails here instead of hanging
        claim = crud.claim_job(s, "w", 30)
        assert claim is not None and claim.job_id == second
        holder.rollback()
        assert crud.claim_job(s, "w", 30).job_id == first


def test_nul_characters_from_untrusted_text_are_stored_the_same_on_both_databases(db):
    """PostgreSQL's text cannot hold NUL; a file from eval-dir or a message quoting a submission's output may."""
    with db.session() as s:
        sub, _ = crud.create_submission(s, new_submission(text="import torch\x00\n"), token=None, queue_limit=None,
                                        max_attempts=3)
        c = crud.claim_job(s, "w", 30)
        assert crud.retry_job(s, c.job_id, c.claim_token, "child said \x00", 0)
        c = crud.claim_job(s, "w", 30)
        result = eval_result().model_copy(update={"message": "RuntimeError: \x00 in the output"})
        row = crud.complete_job(s, c.job_id, c.claim_token, result)
        assert row is not None and row.message == "RuntimeError: \ufffd in the output"
        assert queries.get_submission(s, sub.id).text == "import torch\ufffd\n"
        assert queries.get_job(s, c.job_id).status == "done"


# ---- real processes racing on one database -------------------------------------------------------------

def _claimer(data_dir: str, database_url: str | None, name: str, out: mp.Queue) -> None:
    db = Database(Settings(data_dir=data_dir, database_url=database_url), migrate_now=False)
    claimed = []
    with db.session() as s:
        while (c := crud.claim_job(s, name, 60)) is not None:
            claimed.append(c.job_id)
            assert crud.mark_running(s, c.job_id, c.claim_token)
            assert crud.complete_job(s, c.job_id, c.claim_token, eval_result()) is not None
    out.put((name, claimed))


def test_workers_racing_for_jobs_never_claim_one_twice(db, db_settings):
    jobs = _enqueue(db, 120)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(str(db_settings.data_dir), db_settings.database_url, f"w{i}", out))
             for i in range(4)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    claimed = [j for ids in got.values() for j in ids]
    assert sorted(claimed) == sorted(jobs), "a job was claimed twice or not at all"
    assert sum(1 for ids in got.values() if ids) >= 2, "no race happened: one process took every job"
    with db.session() as s:
        assert s.scalar(select(func.count(Result.id))) == 120
        assert s.scalar(select(func.count(Job.id)).where(Job.status == "done", Job.attempts == 1)) == 120


def _submitter(data_dir: str, database_url: str | None, token_id: int, n: int, go, out: mp.Queue) -> None:
    db = Database(Settings(data_dir=data_dir, database_url=database_url), migrate_now=False)
    ok = 0
    with db.session() as s:
        token = s.get(crud.Token, token_id)
        s.commit()
        go.wait(60)  # all at once: the race is for the last places under the limit
        for _ in range(n):
            try:
                crud.create_submission(s, new_submission(), token=token, queue_limit=15, max_attempts=3)
                ok += 1
            except crud.QueueLimitReached:
                pass
    out.put(ok)


def test_concurrent_submissions_never_overshoot_the_queue_limit(db, db_settings):
    with db.session() as s:
        token, _ = crud.create_token(s, "carol")
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_submitter, args=(str(db_settings.data_dir), db_settings.database_url, token.id, 10,
                                                  go, out)) for _ in range(4)]
    for p in procs:
        p.start()
    time.sleep(3)  # spawned and connected; a straggler only makes the race milder
    go.set()
    accepted = sum(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert accepted == 15
    with db.session() as s:
        assert s.scalar(select(func.count(Submission.id))) == 15


CUDA_SOURCE = ("import torch\nfrom torch.utils.cpp_extension import load_inline\n"
               "ext = load_inline('k', cpp_sources='', cuda_sources='__global__ void k() {}')\n"
               "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n")


def test_a_job_that_needs_a_gpu_is_claimed_only_by_a_worker_with_one(db):
    """A CUDA extension sent to a queue whose only worker has no GPU waits for a GPU worker; a job that needs
    nothing is taken by either, and a re-evaluation decides its needs again from the text."""
    with db.session() as s:
        cuda_sub, cuda_job = crud.create_submission(s, new_submission(text=CUDA_SOURCE), token=None, queue_limit=None,
                                                    max_attempts=3)
        _, plain_job = crud.create_submission(s, new_submission(), token=None, queue_limit=None, max_attempts=3)
        assert (cuda_job.needs, plain_job.needs) == ("cuda", None)
        cpu = crud.claim_job(s, "cpu-worker", 30, accepts=[])
        assert cpu.job_id == plain_job.id
        assert crud.claim_job(s, "cpu-worker", 30, accepts=[]) is None  # the CUDA job is left queued
        assert crud.claim_job(s, "old-sm80", 30, accepts=["cuda sm_80"]) is None  # not a "cuda" worker
        gpu = crud.claim_job(s, "gpu-worker", 30, accepts=["cuda", "cuda sm_90"])
        assert gpu.job_id == cuda_job.id
        crud.complete_job(s, gpu.job_id, gpu.claim_token, eval_result())
        again = crud.enqueue(s, [cuda_sub.id], reason="reeval", max_attempts=3)
        assert [j.needs for j in again] == ["cuda"]


def test_unmet_needs_name_the_waiting_jobs_until_a_worker_that_meets_them_is_live(db):
    with db.session() as s:
        sub, _ = crud.create_submission(s, new_submission(text=CUDA_SOURCE), token=None, queue_limit=None,
                                        max_attempts=3)
        crud.create_submission(s, new_submission(), token=None, queue_limit=None, max_attempts=3)
        both = queries.unmet_needs(s, within_s=60)  # no worker at all: nothing can be taken
        assert [(u.needs, u.jobs) for u in both] == [(None, 1), ("cuda", 1)]
        crud.register_worker(s, "cpu", hostname="h", pid=1, slots=["cpu"], accepts=[])
        assert [(u.needs, u.jobs, u.submission_ids) for u in queries.unmet_needs(s, within_s=60)] == [
            ("cuda", 1, [sub.id])]
        crud.register_worker(s, "gpu", hostname="h", pid=2, slots=["cuda:0 H100"], accepts=["cuda", "cuda sm_90"])
        assert queries.unmet_needs(s, within_s=60) == []
