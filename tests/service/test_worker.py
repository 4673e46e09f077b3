"""The worker in this process: real evaluations through the queue, the retry policy for infra errors,
the compile pool working ahead, and a stop that hands back every job not finished."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select

from harness.db import crud, queries
from harness.db.models import Job, Result
from harness.evaluation import runner, starts
from harness.evaluation.prebuild import PrecompileResult
from harness.grading import grade
from harness.problems import get_registry
from harness.reporting import ranked
from harness.schema import ChildError, ChildExit, EvalResult, GpuMemoryAtFailure, MemoryPlan, Provenance
from harness.service.devices import Slot
from harness.service.outcomes import infra_result
from harness.service.worker import Worker
from harness.verdicts import Phase

from ..conftest import SUBMISSIONS
from ..db.factories import eval_result, new_submission
from .conftest import wait_for

pytestmark = pytest.mark.both_databases

CPU = Provenance(harness_version="0.1.0", device="cpu", device_name="x86_64", torch_version="2.13.0",
                 python_version="3.11", hostname="t", started_at=datetime.now(timezone.utc))
LOAD_INLINE = "from torch.utils.cpp_extension import load_inline\nclass ModelNew: pass\n"


def submit(db, text: str, problem: str = "gemm-groupnorm-min-biasadd", max_attempts: int = 3) -> int:
    with db.session() as s:
        _, job = crud.create_submission(s, new_submission(problem, text=text), token=None, queue_limit=None,
                                        max_attempts=max_attempts)
    return job.id


def run_worker(db, settings, *, idle_s: float = 0.5, **kw) -> Worker:
    worker = Worker(db, settings, get_registry(), [Slot("cpu", "cpu", target=CPU)], exit_when_idle_s=idle_s,
                    **{"compile_workers": 0, **kw})
    worker.run()
    return worker


def job_and_results(db, job_id: int) -> tuple[Job, list[Result]]:
    with db.session() as s:
        job = queries.get_job(s, job_id)
        return job, s.scalars(select(Result).where(Result.submission_id == job.submission_id)).all()


def test_real_evaluations_through_the_queue_store_cpu_results(svc_db, svc_settings):
    ok = submit(svc_db, (SUBMISSIONS / "l75_pytorch_correct.py").read_text())
    prose = submit(svc_db, "I could not write this kernel, sorry.")
    worker = run_worker(svc_db, svc_settings)
    assert worker.stats.completed == 2 and worker.stats.verdicts == {"passed": 1, "invalid_submission": 1}
    job, (res,) = job_and_results(svc_db, ok)
    assert job.status == "done" and job.attempts == 1 and res.verdict == "passed"
    assert res.device == "cpu" and res.size == "small" and res.speedup_vs_eager is not None
    assert EvalResult.model_validate(res.payload).observations.trials  # the raw figures are kept
    _, (bad,) = job_and_results(svc_db, prose)
    assert bad.verdict == "invalid_submission" and "no code found" in bad.message
    with svc_db.session() as s:
        assert queries.get_submission(s, job.submission_id).status == "done"


def test_infra_errors_are_retried_up_to_the_bound_then_stored_once(svc_db, svc_settings):
    job_id = submit(svc_db, "x", max_attempts=3)
    calls = []

    def flaky(spec, text, options, settings):
        calls.append(options.device)
        with svc_db.session() as s:
            sub = queries.get_submission(s, queries.get_job(s, job_id).submission_id)
        return infra_result(sub, f"reference process died (call {len(calls)})", spec)

    worker = run_worker(svc_db, svc_settings, evaluate_fn=flaky)
    assert len(calls) == 3 and worker.stats.retried == 2 and worker.stats.completed == 1
    job, (res,) = job_and_results(svc_db, job_id)
    assert job.attempts == 3 and job.status == "done" and res.verdict == "infra_error"
    assert "call 3" in res.message and res.origin == "sandbox"


def test_a_submission_that_only_claims_to_run_out_of_device_memory_is_retried_to_the_bound_and_never_ranked(
        svc_db, svc_settings):
    """On a host where NVML gave no figures, its own account of a use within its share makes its failure the
    harness's (grading._harness_out_of_memory): evaluated `max_attempts` times, then stored as infra_error, which no
    board ranks. Lying there buys it nothing but the loss of its result."""
    job_id = submit(svc_db, "x", max_attempts=3)
    calls = []

    def claims_out_of_memory(spec, text, options, settings):
        calls.append(1)
        result = eval_result(max_rel_err=1.0)
        obs = result.observations.model_copy(update={
            "trials": [], "candidate_exit": ChildExit(finished=True, phase=Phase.correctness),
            "gpu_memory_at_failure": GpuMemoryAtFailure(unknown="no NVML binding"),
            "memory_plan": MemoryPlan(fits=True, message="fits", total_bytes=80 << 30, reserve_bytes=2 << 30,
                                      phases_bytes={"candidate_trials": 22 << 30}),
            "candidate_error": ChildError(phase=Phase.correctness, exc_type="OutOfMemoryError", message=(
                "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which "
                "0.50 GiB is free. Including non-PyTorch memory, this process has 1.00 GiB memory in use."))})
        return result.model_copy(update={"observations": obs, **grade(obs, result.tolerance).result_fields()})

    worker = run_worker(svc_db, svc_settings, evaluate_fn=claims_out_of_memory)
    assert len(calls) == 3 and worker.stats.retried == 2 and worker.stats.completed == 1
    job, (res,) = job_and_results(svc_db, job_id)
    assert job.status == "done" and job.attempts == 3 and res.verdict == "infra_error"
    assert "ran out of device memory holding 1.00 GiB" in res.message
    assert not ranked(res.verdict, res.flags or [])


def test_a_worker_exception_is_an_infra_error_and_a_submission_failure_is_not_retried(svc_db, svc_settings):
    boom, wrong = submit(svc_db, "x", max_attempts=2), submit(svc_db, "y")

    def evaluate(spec, text, options, settings):
        if text == "x":
            raise OSError(28, "No space left on device")
        return eval_result(max_rel_err=1.0)

    worker = run_worker(svc_db, svc_settings, evaluate_fn=evaluate)
    job, (res,) = job_and_results(svc_db, boom)
    assert job.attempts == 2 and res.verdict == "infra_error" and res.origin == "queue"
    assert "No space left on device" in res.message and "attempt 2 of 2" in res.message
    job, (res,) = job_and_results(svc_db, wrong)
    assert job.attempts == 1 and res.verdict == "wrong_answer"
    assert worker.stats.retried == 1


def test_a_problem_the_worker_does_not_know_is_an_infra_error(svc_db, svc_settings):
    job_id = submit(svc_db, "x", problem="level9/1", max_attempts=1)
    run_worker(svc_db, svc_settings)
    _, (res,) = job_and_results(svc_db, job_id)
    assert res.verdict == "infra_error" and "does not know the problem" in res.message


def test_the_compile_pool_builds_ahead_of_the_slot(svc_db, svc_settings):
    first, second, plain = submit(svc_db, LOAD_INLINE + "#1"), submit(svc_db, LOAD_INLINE + "#2"), submit(svc_db, "z")
    events: list[tuple[str, str]] = []
    lock = threading.Lock()

    def precompile(text, target, settings, *, timeout_s):
        assert target is CPU and timeout_s > 0
        with lock:
            events.append(("built", text[-2:]))
        return PrecompileResult(True, 0.0, "")

    def evaluate(spec, text, options, settings):
        time.sleep(0.5)  # the pool runs ahead while the slot is busy
        with lock:
            events.append(("evaluated", text[-2:]))
        return eval_result()

    worker = run_worker(svc_db, svc_settings, compile_workers=2, evaluate_fn=evaluate, precompile_fn=precompile)
    assert worker.stats.precompiled == 2 and worker.stats.completed == 3
    built = {t for kind, t in events if kind == "built"}
    assert built == {"#1", "#2"}, "a source without native code was precompiled, or one with it was not"
    for tag in ("#1", "#2"):
        assert events.index(("built", tag)) < events.index(("evaluated", tag))
    assert events.index(("built", "#2")) < events.index(("evaluated", "#1")), "the pool did not work ahead"
    for job_id in (first, second, plain):
        assert job_and_results(svc_db, job_id)[0].status == "done"


def test_a_slot_takes_the_ready_jobs_of_the_problem_it_evaluates_first(svc_db, svc_settings):
    """Four built jobs of two problems, queued alternately: the slot evaluates them problem by problem (its trusted
    process stays warm for the next of the same problem); with the bypass limit at 0, in the order queued."""
    problems = ["gemm-groupnorm-min-biasadd", "gemm-groupnorm-hardtanh"] * 2

    def order(limit: int) -> list[str]:
        ids = [submit(svc_db, LOAD_INLINE + f"#{limit}{i}", problem=p) for i, p in enumerate(problems)]
        seen: list[str] = []

        def evaluate(spec, text, options, settings):
            seen.append(spec.id)
            time.sleep(0.5)  # every other job is claimed and built meanwhile
            return eval_result()

        def precompile(text, *args, **kw):
            time.sleep(0.05 * int(text[-1]))  # ready in the order queued, whichever compile thread wakes first
            return PrecompileResult(True, 0.0, "")

        settings = svc_settings.model_copy(update={"ready_bypass_limit": limit})
        worker = run_worker(svc_db, settings, compile_workers=4, evaluate_fn=evaluate, precompile_fn=precompile)
        assert worker.stats.completed == 4 and all(job_and_results(svc_db, i)[0].status == "done" for i in ids)
        return seen

    a, b = problems[:2]
    assert order(8) == [a, a, b, b]
    assert order(0) == problems


def test_stopping_hands_back_running_and_waiting_jobs_without_counting_the_attempt(svc_db, svc_settings):
    jobs = [submit(svc_db, LOAD_INLINE + f"#{i}") for i in range(2)]
    started, release = threading.Event(), threading.Event()

    def slow(spec, text, options, settings):
        started.set()
        release.wait(30)
        return eval_result()

    worker = Worker(svc_db, svc_settings, get_registry(), [Slot("cpu", "cpu", target=CPU)], compile_workers=1,
                    evaluate_fn=slow, precompile_fn=lambda *a, **k: PrecompileResult(True, 0.0, ""),
                    stop_grace_s=0.3)
    t = threading.Thread(target=worker.run)
    t.start()
    assert started.wait(30)

    def second_claimed():
        with svc_db.session() as s:
            return queries.get_job(s, jobs[1]).status == "compiling"

    wait_for(second_claimed, 30, "the second job to be claimed while the slot is busy")
    worker.stop()
    t.join(30)
    assert worker.stats.released == 2
    with svc_db.session() as s:
        for job_id in jobs:
            job = queries.get_job(s, job_id)
            assert (job.status, job.attempts, job.claim_token) == ("queued", 0, None)
    release.set()  # the abandoned evaluation ends late: its result must not be stored
    time.sleep(0.3)
    with svc_db.session() as s:
        assert s.scalar(select(func.count(Result.id))) == 0


def test_a_restarted_hosts_dead_worker_gives_its_jobs_back_at_once(svc_db, svc_settings):
    # Issue 18: after a SIGKILL of the server, its job waited for its 120 s lease although the worker
    # restarted on the same host at once.
    settings = svc_settings.model_copy(update={"lease_s": 600.0})
    job_id = submit(svc_db, "I could not write this kernel, sorry.")
    gone = subprocess.Popen(["true"])
    gone.wait()
    with svc_db.session() as s:
        crud.register_worker(s, "killed", hostname=socket.gethostname(), pid=gone.pid, slots=["cpu"])
        crud.register_worker(s, "elsewhere", hostname="another-host", pid=gone.pid, slots=["cpu"])
        assert crud.claim_job(s, "killed", settings.lease_s) is not None
    started = time.monotonic()
    run_worker(svc_db, settings, evaluate_fn=lambda *_: eval_result(static_error="no code"))
    assert time.monotonic() - started < 60  # not the 600 s lease
    job, (res,) = job_and_results(svc_db, job_id)
    assert job.status == "done" and job.attempts == 2 and job.worker_id != "killed"
    assert res.verdict == "invalid_submission"
    with svc_db.session() as s:
        assert [w.id for w in queries.running_workers_on(s, "another-host")] == ["elsewhere"]  # not ours to judge
        assert queries.running_workers_on(s, socket.gethostname()) == []  # the dead one is marked stopped


def test_a_slot_keeps_its_reference_warm_and_starts_the_next_candidate_ahead(svc_db, svc_settings, monkeypatch):
    """Four jobs of one problem on one slot (CPU, with starting ahead switched on): the trusted process starts once,
    each next job's candidate process is started while the current job is evaluated, back to back, and every
    verdict is the same as a cold evaluation's. No trusted process is started ahead for them: the one serving the
    current job serves the next warm. The job of another problem after them has its own started ahead."""
    from harness.evaluation.prebuild import probe_device

    trusted_ahead: list[bool] = []
    real_prestart_trusted = starts.prestart_trusted

    def prestart_trusted(spec, options, settings) -> bool:
        trusted_ahead.append(real_prestart_trusted(spec, options, settings))
        return trusted_ahead[-1]

    monkeypatch.setattr(starts, "prestart_trusted", prestart_trusted)
    settings = svc_settings.model_copy(update={"prestart_candidates": "on"})
    texts = [(SUBMISSIONS / "l75_pytorch_correct.py").read_text() + f"\n# job {i}\n" for i in range(4)]
    ids = [submit(svc_db, t) for t in texts]
    other = submit(svc_db, (SUBMISSIONS / "l30_pytorch_correct.py").read_text(), problem="gemm-groupnorm-hardtanh")
    slot = Slot("cpu", "cpu", target=probe_device("cpu", settings))
    worker = Worker(svc_db, settings, get_registry(), [slot], exit_when_idle_s=0.5, compile_workers=0)
    worker.run()
    assert worker.stats.completed == 5 and worker.stats.verdicts == {"passed": 5}
    results = [EvalResult.model_validate(job_and_results(svc_db, i)[1][0].payload) for i in ids]
    assert [r.observations.trusted_warm for r in results] == [False, True, True, True]
    last = EvalResult.model_validate(job_and_results(svc_db, other)[1][0].payload)
    assert last.observations.trusted_ahead and not any(r.observations.trusted_ahead for r in results)
    assert trusted_ahead.count(True) == 1, trusted_ahead
    # Every candidate after the first was started ahead (the look-ahead once started the second's, then none while
    # the jobs came back to back); one had torch imported when its evaluation began: only the submission's import
    # was left.
    assert [r.observations.candidate_ahead for r in results] == [False, True, True, True]
    assert min(r.observations.candidate_import_s or 99.0 for r in results[1:]) < 1.0, \
        [r.observations.candidate_import_s for r in results]


@pytest.mark.parametrize("depth", [1, 2])
def test_a_slot_keeps_its_depth_of_next_candidates_started_while_it_evaluates(svc_db, svc_settings, monkeypatch,
                                                                               depth):
    """With `prestart_depth` 2 the two jobs after the one being evaluated have their candidates started before its
    evaluation ends (a start can outlast a warm evaluation); with 1, only the next one's. The evaluations here
    are stand-ins that take 0.4 s each; the starts, records."""
    events: list[tuple[str, int]] = []

    def job_of(text: str) -> int:
        return int(text.rsplit("# job ", 1)[1].split()[0])

    def prestart(spec, text, options, settings) -> bool:
        events.append(("ahead", job_of(text)))
        return False

    def evaluate(self, slot, h, pool=None) -> bool:
        events.append(("begin", job_of(h.claim.text)))
        time.sleep(0.4)
        events.append(("end", job_of(h.claim.text)))
        self._forget(h)
        return False

    monkeypatch.setattr(starts, "prestart", prestart)
    monkeypatch.setattr(starts, "prestart_trusted", lambda spec, options, settings: False)
    monkeypatch.setattr(Worker, "_evaluate", evaluate)
    settings = svc_settings.model_copy(update={"prestart_candidates": "on", "prestart_depth": depth})
    for i in range(4):
        submit(svc_db, (SUBMISSIONS / "l75_pytorch_correct.py").read_text() + f"\n# job {i}\n")
    Worker(svc_db, settings, get_registry(), [Slot("cpu", "cpu")], exit_when_idle_s=0.5, compile_workers=0).run()
    assert [e for e in events if e[0] == "begin"] == [("begin", i) for i in range(4)], events
    before_first_end = events[:events.index(("end", 0))]
    assert [job for kind, job in before_first_end if kind == "ahead"] == list(range(1, 1 + depth)), events


def test_on_the_cpu_a_job_shows_compiling_until_its_slot_has_built_the_candidate(svc_db, svc_settings):
    """Issue 33: with no compile pool (the CPU's default) a slot builds the candidate inside its evaluation, and the job
    went from claimed straight to running: 'compiling' never showed. Now it shows until the build is done."""
    source = (SUBMISSIONS / "l75_pytorch_correct.py").read_text()
    builds, plain = submit(svc_db, "# built with load_inline\n" + source), submit(svc_db, source)
    seen: dict[int, list[tuple[str, str]]] = {}

    def status(job_id: int) -> tuple[str, str]:
        with svc_db.session() as s:
            job = queries.get_job(s, job_id)
            return job.status, queries.get_submission(s, job.submission_id).status

    def evaluate(spec, text, options, settings):
        job_id = builds if text.startswith("# built") else plain
        seen[job_id] = [status(job_id)]
        if options.built is not None:
            tell = options.built

            def built():
                tell()
                seen[job_id].append(status(job_id))

            options.built = built
        return runner.evaluate(spec, text, options, settings)

    worker = run_worker(svc_db, svc_settings, evaluate_fn=evaluate)
    assert worker.stats.verdicts == {"passed": 2}
    assert seen[builds] == [("compiling", "compiling"), ("running", "running")]  # built() came from the evaluation
    assert seen[plain] == [("running", "running")]  # nothing to build


def test_a_job_the_compile_pool_built_runs_at_once_in_its_slot(svc_db, svc_settings):
    job_id = submit(svc_db, LOAD_INLINE)
    seen = []

    def evaluate(spec, text, options, settings):
        with svc_db.session() as s:
            seen.append((queries.get_job(s, job_id).status, options.built))
        return eval_result()

    run_worker(svc_db, svc_settings, compile_workers=1, evaluate_fn=evaluate,
               precompile_fn=lambda *a, **k: PrecompileResult(True, 0.0, ""))
    assert seen == [("running", None)]


def test_a_cpu_worker_leaves_a_cuda_extension_for_a_gpu_worker(svc_db, svc_settings):
    """It was claimed and judged runtime_error ('CUDA_HOME environment variable is not set'), blamed on the
    model; now the CPU worker evaluates the job that needs nothing and leaves the CUDA one queued."""
    cuda = submit(svc_db, (SUBMISSIONS / "l30_cuda_correct.py").read_text(), problem="level2/30")
    plain = submit(svc_db, (SUBMISSIONS / "l30_pytorch_correct.py").read_text(), problem="level2/30")
    seen = []

    def fake(spec, text, options, settings):
        seen.append(text)
        return eval_result(device="cpu")

    worker = run_worker(svc_db, svc_settings, evaluate_fn=fake)
    assert worker.stats.completed == 1 and len(seen) == 1 and "load_inline" not in seen[0]
    assert job_and_results(svc_db, plain)[0].status == "done"
    job, results = job_and_results(svc_db, cuda)
    assert job.status == "queued" and job.attempts == 0 and job.needs == "cuda" and results == []
    with svc_db.session() as s:
        assert [(u.needs, u.jobs) for u in queries.unmet_needs(s, within_s=60)] == [("cuda", 1)]
