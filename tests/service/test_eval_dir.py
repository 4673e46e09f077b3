"""`harness eval-dir`: a KernelBench run folder evaluated on the CPU, stored, reported with fast_p."""

from __future__ import annotations

import json
import subprocess

from sqlalchemy import func, select

from harness.db.models import Submission

from ..conftest import SUBMISSIONS
from .conftest import harness_cmd, service_env


def test_eval_dir_evaluates_stores_and_reports_fast_p(svc_db, svc_settings, tmp_path):
    run = tmp_path / "runs" / "my_run"
    run.mkdir(parents=True)
    (run / "level_2_problem_75_sample_0_kernel.py").write_text((SUBMISSIONS / "l75_pytorch_correct.py").read_text())
    (run / "level_2_problem_75_sample_1_kernel.py").write_text("The kernel is left as an exercise.")
    (run / "level_2_problem_30_sample_0_kernel.py").write_text("Sorry, I cannot help with that.")
    (run / "level_2_problem_40_sample_0_kernel.py").write_text("class ModelNew: pass\n")  # not a built-in problem
    (run / "notes.txt").write_text("not a generation")
    out = tmp_path / "report.json"
    p = subprocess.run(harness_cmd("eval-dir", str(run), "--device", "cpu", "--model", "llm-x", "--json", str(out)),
                       env=service_env(svc_settings, COLUMNS="200"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "fast_p over 2 problems, CPU results" in p.stdout and "level_2_problem_40_sample_0_kernel.py" in p.stdout

    rep = json.loads(out.read_text())
    assert rep["run"] == "my_run" and rep["model"] == "llm-x" and rep["thresholds"] == [0, 0.5, 0.8, 1, 1.5, 2]
    by_problem = {p["kernelbench_id"]: p for p in rep["problems"]}
    assert set(by_problem) == {"level2/75", "level2/30"}
    s0, s1 = by_problem["level2/75"]["samples"]
    assert (s0["sample"], s0["verdict"], s0["device"]) == (0, "passed", "cpu") and s0["speedup_vs_eager"] > 0
    assert (s1["sample"], s1["verdict"]) == (1, "invalid_submission")
    assert by_problem["level2/30"]["samples"][0]["verdict"] == "invalid_submission"
    assert rep["not_evaluated"] == ["level_2_problem_40_sample_0_kernel.py"]
    cpu = rep["fast_p"]["cpu"]
    assert cpu["problems"] == 2 and cpu["eager"]["0"] == 0.5 and cpu["compile"] is None
    with svc_db.session() as s:
        assert s.scalar(select(func.count(Submission.id)).where(Submission.model == "llm-x")) == 3
        assert s.scalar(select(func.count(Submission.id)).where(Submission.status != "done")) == 0


def test_a_folder_without_generations_is_a_usage_error(svc_settings, tmp_path):
    p = subprocess.run(harness_cmd("eval-dir", str(tmp_path)), env=service_env(svc_settings), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "level_<L>_problem_<N>_sample_<S>_kernel.py" in p.stderr


def test_gpus_none_still_runs_on_the_cpu_and_device_cuda_without_a_gpu_is_a_usage_error(svc_db, svc_settings,
                                                                                         tmp_path):
    run = tmp_path / "runs" / "no_code"
    run.mkdir(parents=True)
    (run / "level_2_problem_75_sample_0_kernel.py").write_text("Sorry, I cannot help with that.")
    env = service_env(svc_settings, CUDA_VISIBLE_DEVICES="", COLUMNS="300")
    p = subprocess.run(harness_cmd("eval-dir", str(run), "--device", "cuda"), env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "no CUDA device is visible" in p.stderr
    with svc_db.session() as s:
        assert s.scalar(select(func.count(Submission.id))) == 0  # refused before anything was stored
    p = subprocess.run(harness_cmd("eval-dir", str(run), "--gpus", "none"), env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "level2/75" in p.stdout and "invalid_submission" in p.stdout


def test_on_the_cpu_a_cuda_generation_is_left_queued_for_a_gpu_worker_not_judged(svc_db, svc_settings, tmp_path):
    """A CUDA extension evaluated on a CPU got runtime_error (CUDA_HOME is not set), counted against the model. Now
    eval-dir on the CPU evaluates what the CPU can, and says the CUDA one waits for a GPU worker."""
    run = tmp_path / "runs" / "mixed"
    run.mkdir(parents=True)
    (run / "level_2_problem_30_sample_0_kernel.py").write_text((SUBMISSIONS / "l30_cuda_correct.py").read_text())
    (run / "level_2_problem_30_sample_1_kernel.py").write_text((SUBMISSIONS / "l30_pytorch_correct.py").read_text())
    out = tmp_path / "report.json"
    p = subprocess.run(harness_cmd("eval-dir", str(run), "--device", "cpu", "--json", str(out)),
                       env=service_env(svc_settings, COLUMNS="200"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "1 files need what this machine's worker has not (cuda)" in p.stderr
    (problem,) = json.loads(out.read_text())["problems"]
    cuda, torch_only = problem["samples"]
    assert cuda["verdict"] is None and cuda["message"] == ("not evaluated here: it needs a GPU worker, and stays "
                                                           "queued for one")
    assert torch_only["verdict"] == "passed"
    with svc_db.session() as s:
        assert s.scalar(select(Submission.status).where(Submission.id == cuda["submission_id"])) == "queued"
