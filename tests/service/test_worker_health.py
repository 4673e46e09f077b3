"""A worker's own health: a GPU slot checks its GPU after a fault and retires when it stays wedged (the
jobs not yet run go back to the queue); a nearly full disk is an infra error that is retried."""

from __future__ import annotations

import pytest

from harness.db import queries
from harness.problems import get_registry
from harness.service import health
from harness.service.devices import Slot, probe
from harness.service.worker import Worker
from harness.verdicts import Verdict

from ..conftest import SUBMISSIONS
from ..db.factories import eval_result
from .test_worker import CPU, job_and_results, submit

GPU_SLOT_ENV = {"CUDA_VISIBLE_DEVICES": "7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def crashed(*_args):
    return eval_result().model_copy(update={"verdict": Verdict.crashed, "message": "killed by SIGSEGV"})


def gpu_worker(db, settings, checks: list, answer: str | None, **kw) -> Worker:
    def check(env, _settings):
        checks.append(env)
        return answer

    return Worker(db, settings, get_registry(), [Slot("cuda:0", "cuda", env=GPU_SLOT_ENV, target=CPU)],
                  compile_workers=0, exit_when_idle_s=0.5, health_check=check, health_pause_s=0.01, **kw)


def test_a_gpu_that_stays_wedged_after_a_crash_retires_its_slot_and_hands_back_the_rest(svc_db, svc_settings):
    first = submit(svc_db, "a")
    second = submit(svc_db, "b")
    checks: list = []
    worker = gpu_worker(svc_db, svc_settings, checks, "the health-check kernel did not finish within 120 s",
                        evaluate_fn=crashed)
    stats = worker.run()
    assert stats.retired_slots == ["cuda:0"] and stats.completed == 1
    assert len(checks) == 2 and checks[0] == GPU_SLOT_ENV  # checked, checked again, then retired
    job, (res,) = job_and_results(svc_db, first)
    assert job.status == "done" and res.verdict == "crashed"
    job, results = job_and_results(svc_db, second)
    assert job.status == "queued" and not results and job.attempts == 0  # handed back, never lost


def test_a_gpu_that_recovers_keeps_its_slot(svc_db, svc_settings):
    ids = [submit(svc_db, "a"), submit(svc_db, "b")]
    checks: list = []
    stats = gpu_worker(svc_db, svc_settings, checks, None, evaluate_fn=crashed).run()
    assert stats.retired_slots == [] and stats.completed == 2 and len(checks) == 2
    assert all(job_and_results(svc_db, i)[0].status == "done" for i in ids)


def test_a_passing_job_needs_no_health_check(svc_db, svc_settings):
    submit(svc_db, "a")
    checks: list = []
    gpu_worker(svc_db, svc_settings, checks, "wedged", evaluate_fn=lambda *a: eval_result()).run()
    assert checks == []


def test_a_full_disk_is_an_infra_error_retried_and_never_evaluated(svc_db, svc_settings):
    job_id = submit(svc_db, (SUBMISSIONS / "l75_pytorch_correct.py").read_text(), max_attempts=2)
    full = svc_settings.model_copy(update={"min_free_disk_mb": 1 << 40})  # more than any disk has
    evaluated = []
    worker = Worker(svc_db, full, get_registry(), [Slot("cpu", "cpu", target=CPU)], compile_workers=0,
                    exit_when_idle_s=0.5, evaluate_fn=lambda *a: evaluated.append(a))
    stats = worker.run()
    assert evaluated == [] and stats.retried == 1
    job, (res,) = job_and_results(svc_db, job_id)
    assert job.attempts == 2 and res.verdict == "infra_error" and "disk nearly full" in res.message
    with svc_db.session() as s:  # the submission is kept: an admin can re-evaluate it
        assert queries.get_submission(s, job.submission_id).text


def test_low_disk_reports_the_path_and_the_figures(svc_settings):
    assert health.low_disk(svc_settings.model_copy(update={"min_free_disk_mb": 0})) is None
    why = health.low_disk(svc_settings.model_copy(update={"min_free_disk_mb": 1 << 40}))
    assert why is not None and "MiB free" in why


@pytest.mark.gpu
def test_the_gpu_health_check_passes_on_a_healthy_gpu(svc_settings):
    assert health.gpu_health_check({"CUDA_VISIBLE_DEVICES": "0"}, svc_settings) is None


@pytest.mark.gpu
@pytest.mark.long
def test_after_an_illegal_memory_access_the_gpu_is_healthy_for_the_next_job(svc_db, svc_settings):
    bad = submit(svc_db, (SUBMISSIONS / "l30_cuda_illegal_access.py").read_text(), problem="gemm-groupnorm-hardtanh")
    good = submit(svc_db, (SUBMISSIONS / "l75_pytorch_correct.py").read_text())
    slot = Slot("cuda:0", "cuda", env={"CUDA_VISIBLE_DEVICES": "0"})
    slots = probe([slot], svc_settings)
    stats = Worker(svc_db, svc_settings, get_registry(), slots, compile_workers=0, exit_when_idle_s=1.0).run()
    assert stats.retired_slots == []
    assert job_and_results(svc_db, bad)[1][0].verdict == "crashed"
    assert job_and_results(svc_db, good)[1][0].verdict == "passed"

