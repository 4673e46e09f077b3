"""A worker killed with SIGKILL mid-evaluation: its job goes back to the queue (when the lease expires,
or at once when a worker starts again on the same host) and another worker finishes it, once. Real
processes, a real evaluation."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from harness.db import crud, queries
from harness.db.models import Result

from ..conftest import SUBMISSIONS
from ..db.factories import new_submission
from .conftest import harness_cmd, service_env, wait_for

pytestmark = pytest.mark.both_databases


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


WORKER = harness_cmd("worker", "--gpus", "none", "--compile-workers", "0", "--exit-when-idle", "2")


def _kill_a_worker_mid_evaluation(db, env: dict[str, str], log_path: Path):
    """Submit, start a worker, SIGKILL it once it evaluates; (submission, job, its pid, its sandbox children)."""
    with db.session() as s:
        sub, job = crud.create_submission(
            s, new_submission(text=(SUBMISSIONS / "l75_pytorch_correct.py").read_text()), token=None,
            queue_limit=None, max_attempts=3)
    with open(log_path, "w") as log:
        first = subprocess.Popen(WORKER, env=env, stdout=subprocess.DEVNULL, stderr=log)

    def running():
        with db.session() as s:
            return queries.get_job(s, job.id).status == "running"

    wait_for(running, 120, "the first worker to start evaluating")
    sandbox_children = _children(first.pid)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    return sub, job, first.pid, sandbox_children


def test_a_job_whose_worker_is_killed_is_requeued_and_finished_once_by_another(svc_db, svc_settings, tmp_path):
    env = service_env(svc_settings)
    sub, job, first_pid, sandbox_children = _kill_a_worker_mid_evaluation(svc_db, env, tmp_path / "first.log")
    with svc_db.session() as s:
        held = queries.get_job(s, job.id)
        assert held.status == "running" and held.attempts == 1 and str(first_pid) in held.worker_id

    time.sleep(svc_settings.lease_s + 0.5)  # no heartbeat renews the lease now
    with svc_db.session() as s:
        requeued, failed = crud.requeue_expired(s, lost_result=lambda *_: None)  # any worker's loop does this
        assert (requeued, failed) == ([job.id], [])
        assert queries.get_job(s, job.id).status == "queued"
        assert queries.get_submission(s, sub.id).status == "queued"

    second = subprocess.run(WORKER, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    with svc_db.session() as s:
        done = queries.get_job(s, job.id)
        assert done.status == "done" and done.attempts == 2 and str(first_pid) not in done.worker_id
        assert s.scalar(select(func.count(Result.id))) == 1
        assert queries.get_submission(s, sub.id).verdict == "passed"
    # The killed worker's sandbox children lost their parent's pipes and ended.
    wait_for(lambda: not any(_alive(p) for p in sandbox_children), 30, "the orphaned sandbox children to end")


def test_a_worker_restarted_on_the_same_host_takes_back_its_killed_predecessors_job_at_once(svc_db, svc_settings,
                                                                                             tmp_path):
    # Issue 18: after a SIGKILL of the server and its worker, the job waited out its 120 s lease although the
    # worker came back at once. The lease here is long enough that only the restart can give the job back.
    lease_s = 300.0
    env = service_env(svc_settings, HARNESS_LEASE_S=str(lease_s))
    sub, job, first_pid, _ = _kill_a_worker_mid_evaluation(svc_db, env, tmp_path / "first.log")
    started = time.monotonic()
    second = subprocess.run(WORKER, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert time.monotonic() - started < lease_s / 2
    assert "of this host are gone" in second.stderr
    with svc_db.session() as s:
        done = queries.get_job(s, job.id)
        assert done.status == "done" and done.attempts == 2 and str(first_pid) not in done.worker_id
        assert s.scalar(select(func.count(Result.id))) == 1
        assert queries.get_submission(s, sub.id).verdict == "passed"
