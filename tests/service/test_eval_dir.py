"""`harness eval-dir`: a KernelBench run folder evaluated on the CPU, stored, reported with fast_p."""

from __future__ import annotations

import json
import subprocess

from sqlalchemy import func, select

from harness.cli.eval_dir import flag_cell
from harness.db.models import Submission
from harness.verdicts import UNRANKED_CHECKS

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
    kb_out = tmp_path / "eval_results.json"
    p = subprocess.run(harness_cmd("eval-dir", str(run), "--device", "cpu", "--model", "llm-x", "--json", str(out),
                                   "--kernelbench-json", str(kb_out)),
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
    # Each result's flags beside its speedup (on a busy host the CPU windows are often too noisy to vouch for);
    # a speedup counts above p = 0 only where none keeps it off the boards.
    assert s1["flags"] == [] and all(flag_cell([f]) in p.stdout for f in s0["flags"])
    counts = not any(f in UNRANKED_CHECKS for f in s0["flags"])
    assert all(cpu["eager"][k] == (0.5 if counts and s0["speedup_vs_eager"] > float(k) else 0.0)
               for k in ("0.5", "0.8", "1", "1.5", "2"))
    # KernelBench's metrics, by its definitions: every level-2 problem the service has (6), sample 0 of each.
    (level,) = rep["kernelbench"]["levels"]
    assert (level["level"], level["problems"], level["evaluated"], level["correct"]) == (2, 6, 2, 1)
    assert level["correctness_rate"] == 1 / 6 and level["compilation_rate"] == 1 / 6
    shown = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in p.stdout.splitlines()
             if ln.count("│") == 3}
    assert "KernelBench's metrics" in p.stdout and shown["problems (all of the level)"] == "6"
    assert shown["with a sample 0"] == "2" and shown["correctness rate"] == "0.167"
    exported = json.loads(kb_out.read_text())
    assert set(exported) == {"30", "75"} and [e["sample_id"] for e in exported["75"]] == [0, 1]
    assert exported["75"][0]["correctness"] is True and exported["75"][0]["runtime"] > 0
    assert exported["30"][0]["compiled"] is False
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


def test_a_bad_kernelbench_baseline_file_is_refused_before_anything_is_evaluated(svc_db, svc_settings, tmp_path):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "level_2_problem_75_sample_0_kernel.py").write_text("Sorry, I cannot help with that.")
    bad = tmp_path / "baseline_time_torch.json"
    bad.write_text(json.dumps({"level2": {"75_Gemm_GroupNorm_Min_BiasAdd.py": {"std": 0.1}}}))
    p = subprocess.run(harness_cmd("eval-dir", str(run), "--device", "cpu", "--kernelbench-baseline", str(bad)),
                       env=service_env(svc_settings, COLUMNS="200"), capture_output=True, text=True, timeout=120)
    said = " ".join(p.stderr.replace("│", " ").split())  # typer's box wraps the message
    assert p.returncode == 2 and "not a KernelBench baseline-time file" in said
    assert "level2/75_Gemm_GroupNorm_Min_BiasAdd.py: expected statistics with a 'mean'" in said
    with svc_db.session() as s:
        assert s.scalar(select(func.count(Submission.id))) == 0


def test_the_table_shows_each_results_flags_beside_its_speedup():
    from rich.console import Console

    from harness.cli.eval_dir import render
    from harness.service.batch import EvalDirReport, FastP, ProblemResult, SampleResult

    noisy = SampleResult(sample=0, file="f.py", submission_id=1, verdict="passed", message="ok", device="cuda",
                         speedup_vs_eager=18.247, speedup_vs_compile=9.1, flags=["timing_unreliable"])
    rep = EvalDirReport(run="r", folder="r", batch="b", submitter="s", model="m", thresholds=[0.0, 1.0],
                        fast_p_basis="basis", problems=[ProblemResult(problem_id="p", kernelbench_id="level2/30",
                                                                      samples=[noisy])],
                        not_evaluated=[], fast_p={"cuda": FastP(problems=1, eager={"0": 1.0, "1": 0.0}, compile=None)})
    console = Console(width=160, record=True)
    render(rep, console)
    row = next(line for line in console.export_text().splitlines() if "18.247x" in line)
    assert "unreliable time" in row
