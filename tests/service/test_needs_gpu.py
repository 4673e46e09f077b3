"""On a GPU host: the CUDA extension a CPU worker leaves in the queue is claimed by a GPU worker and evaluated there,
and the worker says which needs it meets."""

from __future__ import annotations

import pytest

from harness.db import crud, queries
from harness.problems import get_registry
from harness.service.devices import plan_slots, probe
from harness.service.worker import Worker

from ..conftest import SUBMISSIONS
from ..db.factories import eval_result, new_submission


@pytest.mark.gpu
@pytest.mark.long
def test_a_gpu_worker_takes_the_cuda_job_a_cpu_worker_left(svc_db, svc_settings):
    with svc_db.session() as s:
        _, job = crud.create_submission(s, new_submission("level2/30", text=(SUBMISSIONS / "l30_cuda_correct.py")
                                                          .read_text()), token=None, queue_limit=None, max_attempts=3)
    assert job.needs == "cuda"
    cpu = Worker(svc_db, svc_settings, get_registry(), plan_slots("none", svc_settings), exit_when_idle_s=0.5,
                 compile_workers=0, evaluate_fn=lambda *a: eval_result(device="cpu"))
    assert cpu.run().claimed == 0
    slots = probe(plan_slots("0", svc_settings), svc_settings)
    gpu = Worker(svc_db, svc_settings, get_registry(), slots, exit_when_idle_s=0.5, compile_workers=0)
    assert "cuda" in gpu.accepts() and f"cuda sm_{slots[0].target.compute_capability.replace('.', '')}" in \
        gpu.accepts()
    stats = gpu.run()
    assert stats.verdicts == {"passed": 1}, stats
    with svc_db.session() as s:
        done = queries.get_job(s, job.id)
        assert done.status == "done" and done.worker_id == gpu.id
