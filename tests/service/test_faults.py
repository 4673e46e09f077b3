"""Faults done for real against `harness serve` on SQLite: the server SIGKILLed while clients submit, a
restart with jobs queued, the database write lock held by someone else. Loopback only."""

from __future__ import annotations

import sqlite3
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import func, select

from harness.db.models import Job, Result, Submission
from harness.db.session import Database

from .conftest import free_port, get_json, harness_cmd, service_env, stop_process, wait_for

PROSE = "I could not write this kernel ({marker})."


def start_server(settings, log_path, *args: str, **env: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = service_env(settings, CUDA_VISIBLE_DEVICES="", HARNESS_MAX_QUEUED_PER_TOKEN="1000000", **env)
    with open(log_path, "a") as log:
        proc = subprocess.Popen(harness_cmd("serve", "--port", str(port), "--open", *args), env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: get_json(f"{base}/healthz"), 90, "the server to answer")
    except AssertionError:
        stop_process(proc)
        raise
    return proc, base


def submit(client: httpx.Client, base: str, marker: str) -> httpx.Response:
    return client.post(f"{base}/api/submissions", json={"problem": "level2/75", "submitter": "faults",
                                                        "model": "m", "reply": PROSE.format(marker=marker)})


def test_a_server_killed_mid_submission_loses_no_accepted_submission_and_the_queue_resumes(svc_settings, tmp_path):
    server, base = start_server(svc_settings, tmp_path / "serve.log", "--no-worker")
    accepted: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def client(n: int) -> None:
        with httpx.Client(timeout=10) as c:
            i = 0
            while not stop.is_set():
                marker = f"c{n}-{i}"
                i += 1
                try:
                    r = submit(c, base, marker)
                except httpx.HTTPError:
                    return  # the server is gone
                if r.status_code == 202:
                    with lock:
                        accepted[marker] = r.json()["id"]

    threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: len(accepted) >= 30, 60, "submissions to be accepted")
        server.kill()  # SIGKILL, mid-submission: the clients are still posting
        server.wait(10)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        stop_process(server)

    db = Database(svc_settings, migrate_now=False)
    try:
        with db.session() as s:
            assert s.connection().exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
            rows = {sub.id: sub for sub in s.scalars(select(Submission))}
            for marker, sid in accepted.items():
                assert sid in rows and rows[sid].text == PROSE.format(marker=marker), f"202 for {marker} lost"
            # None half-written: every stored submission, answered or not, has exactly one job.
            jobs = dict(s.execute(select(Job.submission_id, func.count()).group_by(Job.submission_id)).all())
            assert set(jobs) == set(rows) and set(jobs.values()) == {1}
    finally:
        db.dispose()

    # Restart with a worker: the queue resumes and every job is finished exactly once.
    server, base = start_server(svc_settings, tmp_path / "serve.log")
    try:
        db = Database(svc_settings, migrate_now=False)

        def all_done() -> bool:
            with db.session() as s:
                return s.scalar(select(func.count()).select_from(Job).where(Job.status != "done")) == 0

        wait_for(all_done, 120, "the restarted worker to finish the queue", interval=0.5)
        with db.session() as s:
            per_sub = dict(s.execute(select(Result.submission_id, func.count()).group_by(Result.submission_id)).all())
            assert set(per_sub) == set(rows) and set(per_sub.values()) == {1}
        db.dispose()
    finally:
        stop_process(server)
    assert server.returncode == 0


def test_a_held_write_lock_makes_writers_wait_then_answers_503_never_500(svc_settings, tmp_path):
    server, base = start_server(svc_settings, tmp_path / "serve.log", "--no-worker",
                                HARNESS_SQLITE_BUSY_TIMEOUT_MS="3000")
    try:
        with httpx.Client(timeout=30) as c:
            assert submit(c, base, "first").status_code == 202  # the file and its tables exist
        other = sqlite3.connect(svc_settings.data_dir / "harness.db", isolation_level=None, check_same_thread=False)

        def hold(seconds: float) -> threading.Thread:
            other.execute("BEGIN IMMEDIATE")
            t = threading.Timer(seconds, lambda: other.execute("COMMIT"))
            t.start()
            return t

        # Held shorter than the busy timeout: concurrent writers wait, then all succeed; readers never wait.
        timer = hold(1.0)
        with ThreadPoolExecutor(8) as pool, httpx.Client(timeout=30) as c:
            t0 = time.monotonic()
            reads = c.get(f"{base}/api/submissions")
            read_s = time.monotonic() - t0
            codes = list(pool.map(lambda i: submit(c, base, f"busy-{i}").status_code, range(16)))
        timer.join()
        assert codes == [202] * 16
        assert reads.status_code == 200 and read_s < 1.0

        # Held longer: the writer gives up with a 503 that says why and when to retry, never a 500.
        timer = hold(6.0)
        with httpx.Client(timeout=30) as c:
            r = submit(c, base, "too-long")
        timer.join()
        other.close()
        assert r.status_code == 503 and "busy" in r.json()["detail"] and r.headers["retry-after"]
        with httpx.Client(timeout=30) as c:
            assert submit(c, base, "after").status_code == 202
    finally:
        stop_process(server)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


@pytest.mark.parametrize("text, expected", [
    ("\x00" * 1000, 422),  # NUL bytes: refused with a message (no source needs one; PostgreSQL cannot store one)
    ("x" * 1_100_000, 413),  # more than the body limit
])
def test_hostile_texts_over_http_get_an_answer_with_a_message(svc_settings, tmp_path, text, expected):
    server, base = start_server(svc_settings, tmp_path / "serve.log", "--no-worker")
    try:
        with httpx.Client(timeout=30) as c:
            r = c.post(f"{base}/api/submissions", json={"problem": "level2/75", "submitter": "s", "model": "m",
                                                        "reply": text})
            assert r.status_code == expected, r.text
            assert r.json().get("detail") or r.json().get("warning")
            assert get_json(f"{base}/healthz")["status"] in ("ok", "degraded")
    finally:
        stop_process(server)
