"""Load, bounded in count and time, on loopback: many clients submit and poll a real `harness serve`
while two workers drain the queue; nothing is lost or done twice. And the pages' cost with 10,000
stored results. Figures are printed (pytest -s) and, with HARNESS_LOAD_REPORT=<file>, written as JSON.

Sizes: KH_LOAD_CLIENTS (16) x KH_LOAD_PER_CLIENT (20) submissions; KH_LOAD_RESULTS (10,000).
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import httpx
from sqlalchemy import func, select

from harness.db import crud
from harness.db.models import Job, JobStatus, Result, ResultOrigin, Submission
from harness.db.session import Database
from harness.problems import get_registry
from harness.service.devices import Slot
from harness.service.worker import Worker

from ..db.factories import eval_result
from .conftest import stop_process
from .test_faults import PROSE, start_server, submit
from .test_worker import CPU


def _report(name: str, figures: dict) -> None:
    figures = {"test": name, "machine": f"{platform.node()} {os.cpu_count()} cores {platform.machine()}",
               "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), **figures}
    print("\nLOAD", json.dumps(figures))
    path = os.environ.get("HARNESS_LOAD_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(figures) + "\n")


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def test_concurrent_clients_lose_nothing_and_no_job_runs_twice(svc_settings, tmp_path):
    clients = int(os.environ.get("KH_LOAD_CLIENTS", "16"))
    per_client = int(os.environ.get("KH_LOAD_PER_CLIENT", "20"))
    server, base = start_server(svc_settings, tmp_path / "serve.log", "--no-worker")
    dbs = [Database(svc_settings, migrate_now=False) for _ in range(2)]
    # Two workers on one SQLite queue, racing for claims; prose is judged in the parent, so the queue
    # (not torch) is what is measured.
    workers = [Worker(db, svc_settings, get_registry(), [Slot("cpu", "cpu", target=CPU)], compile_workers=0,
                      worker_id=f"load-{i}") for i, db in enumerate(dbs)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()
    latencies: list[float] = []
    accepted: dict[str, int] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        mine = []
        with httpx.Client(timeout=30) as c:
            for i in range(per_client):
                marker = f"load-{n}-{i}"
                t0 = time.perf_counter()
                r = submit(c, base, marker)
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)
                    if r.status_code == 202:
                        accepted[marker] = r.json()["id"]
                        mine.append(r.json()["id"])
                    else:
                        errors.append(f"{r.status_code} {r.text[:200]}")
                if i % 5 == 0:  # poll as clients do
                    c.get(f"{base}/api/submissions/{mine[-1]}" if mine else f"{base}/healthz")
            deadline = time.monotonic() + 120
            for sid in mine:
                while time.monotonic() < deadline:
                    body = c.get(f"{base}/api/submissions/{sid}").json()
                    if body["status"] == "done":
                        break
                    time.sleep(0.2)

    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(client, range(clients)))
        total_s = time.perf_counter() - t0
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(30)
        stop_process(server)
    try:
        with dbs[0].session() as s:
            n_subs = s.scalar(select(func.count()).select_from(Submission))
            not_done = s.scalar(select(func.count()).select_from(Job).where(Job.status != JobStatus.done.value))
            per_sub = dict(s.execute(select(Result.submission_id, func.count()).group_by(Result.submission_id)).all())
    finally:
        for db in dbs:
            db.dispose()
    submit_s = sum(latencies)  # summed over clients; the rate below is over the wall time of the run
    lost = len(accepted) - len([sid for sid in accepted.values() if per_sub.get(sid, 0) >= 1])
    duplicated = sum(1 for n in per_sub.values() if n > 1)
    _report("submit+poll", {
        "clients": clients, "submissions": clients * per_client, "accepted": len(accepted), "errors": len(errors),
        "wall_s": round(total_s, 2), "accepted_per_s": round(len(accepted) / total_s, 1),
        "submit_p50_ms": round(1000 * _pct(latencies, 50), 1), "submit_p99_ms": round(1000 * _pct(latencies, 99), 1),
        "lost": lost, "duplicated": duplicated, "worker_completed": [w.stats.completed for w in workers],
        "summed_submit_s": round(submit_s, 1)})
    assert not errors, errors[:3]
    assert len(accepted) == clients * per_client == n_subs
    assert lost == 0 and duplicated == 0 and not_done == 0
    assert sum(w.stats.completed for w in workers) == len(accepted)


def _store_results(db: Database, n: int) -> None:
    """n finished submissions with results, written in bulk (the normal path would take minutes)."""
    rng = random.Random(7)
    base = eval_result()
    with db.session() as s:
        subs = [Submission(problem_id=base.problem.id, problem_version=base.problem.version,
                           text=PROSE.format(marker=i), text_kind="reply", submitter=f"team-{i % 200}",
                           model=f"model-{i % 25}", tags=[], meta={}, status=JobStatus.done.value)
                for i in range(n)]
        s.add_all(subs)
        s.flush()
        jobs = [Job(submission_id=sub.id, reason="submit", max_attempts=3, status=JobStatus.done.value, attempts=1)
                for sub in subs]
        s.add_all(jobs)
        s.flush()
        rows = []
        for sub, job in zip(subs, jobs, strict=True):
            r = eval_result(candidate_ms=rng.uniform(0.5, 4.0), max_rel_err=rng.choice([1e-7, 1e-6, 1.0]))
            rows.append(crud._result_row(sub.id, job.id, ResultOrigin.sandbox, r))
        s.add_all(rows)
        s.flush()
        for sub, row in zip(subs, rows, strict=True):
            sub.current_result_id, sub.verdict = row.id, row.verdict
        s.commit()


def test_leaderboard_and_problem_pages_with_10000_results(svc_settings, tmp_path):
    n = int(os.environ.get("KH_LOAD_RESULTS", "10000"))
    db = Database(svc_settings)
    t0 = time.perf_counter()
    _store_results(db, n)
    stored_s = time.perf_counter() - t0
    db.dispose()
    server, base = start_server(svc_settings, tmp_path / "serve.log", "--no-worker")
    timings: dict[str, float] = {}
    try:
        with httpx.Client(timeout=120) as c:
            for name, path in [("leaderboard", "/api/leaderboard?problem=level2/75"),
                               ("problem", "/api/problems/level2/75"), ("submissions_page", "/api/submissions"),
                               ("home_html", "/"), ("problem_html", "/problems/level2/75")]:
                runs = []
                for _ in range(3):
                    t = time.perf_counter()
                    r = c.get(base + path)
                    runs.append(time.perf_counter() - t)
                    assert r.status_code == 200, r.text[:300]
                timings[name] = statistics.median(runs)
            board = c.get(base + "/api/leaderboard?problem=level2/75").json()
    finally:
        stop_process(server)
    _report("pages", {"results": n, "stored_s": round(stored_s, 1),
                      **{f"{k}_ms": round(v * 1000, 1) for k, v in timings.items()}})
    assert board["gpu"]["rows"], "the stored results did not reach the leaderboard"
    assert all(v < 10.0 for v in timings.values()), timings  # generous: CI machines are shared
