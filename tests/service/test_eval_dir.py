"""`harness eval-dir`: a KernelBench run folder evaluated on the CPU, stored, reported with fast_p."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import time

from rich.console import Console
from sqlalchemy import func, select

from harness.cli import eval_dir
from harness.cli.eval_dir import flag_cell
from harness.db import crud
from harness.db.models import Job, Submission
from harness.service import batch, reeval
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
    assert "level_2_problem_40_sample_0_kernel.py (unknown problem 'level2/40')" in p.stderr

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


def _wait_for(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _count(db, *where) -> int:
    with db.session() as s:  # a session per look: one transaction would see one snapshot
        return s.scalar(select(func.count(Job.id)).where(*where))


def _verdicts(path) -> dict[str, str | None]:
    try:
        rep = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {s["file"]: s["verdict"] for p in rep["problems"] for s in p["samples"]}


def test_ctrl_c_keeps_the_results_so_far_and_resume_evaluates_only_the_rest(svc_db, svc_settings, tmp_path):
    run = tmp_path / "runs" / "stopped"
    run.mkdir(parents=True)
    quick, hung = run / "level_2_problem_30_sample_0_kernel.py", run / "level_2_problem_75_sample_0_kernel.py"
    quick.write_text("Sorry, I cannot help with that.")
    hung.write_text("import time\nimport torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                    "        return x\n\n\nwhile True:  # never finishes importing\n    time.sleep(1)\n")
    out = tmp_path / "report.json"
    env = service_env(svc_settings, COLUMNS="200")
    # Ctrl-C as a terminal delivers it: a suite started in the background by a non-interactive shell ignores SIGINT,
    # and a child would inherit that (the run then went on for good after its SIGINT).
    proc = subprocess.Popen(harness_cmd("eval-dir", str(run), "--device", "cpu", "--model", "m", "--json", str(out)),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # The JSON is written as results come, before the run ends.
        _wait_for(lambda: _verdicts(out).get(quick.name) == "invalid_submission", 120, "the first result in the JSON")
        _wait_for(lambda: _count(svc_db, Job.status == "running") == 1, 60, "the hung file's evaluation")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "level2/30" in stdout and "invalid_submission" in stdout and "level2/75" not in stdout
    assert "1 unfinished evaluations of this run were taken out of the queue" in stderr
    assert _verdicts(out) == {quick.name: "invalid_submission"}
    with svc_db.session() as s:  # nothing left queued or held
        assert s.scalar(select(func.count(Job.id)).where(Job.status != "done")) == 0
        assert s.scalar(select(func.count(Submission.id))) == 1

    hung.write_text((SUBMISSIONS / "l75_pytorch_correct.py").read_text())
    p = subprocess.run(harness_cmd("eval-dir", str(run), "--device", "cpu", "--model", "m", "--json", str(out),
                                   "--resume"), env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "--resume: 1 files have a result for the same source already; 1 to evaluate" in p.stderr
    assert _verdicts(out) == {quick.name: "invalid_submission", hung.name: "passed"}
    with svc_db.session() as s:
        assert s.scalar(select(func.count(Submission.id))) == 2  # the first file was not stored again


def test_failure_messages_are_printed_whole_on_an_80_column_terminal():
    message = ("trial 0: output 0 differs from the reference at 1024 of 4096 elements (max abs error 3.2e-01 at "
               "index (0, 17); tolerance atol 1e-4, rtol 1e-4)")
    rep = batch.EvalDirReport(
        run="r", folder="f", batch="b", submitter="me", model="m", thresholds=[0, 1], fast_p_basis="", not_evaluated=[],
        fast_p={}, problems=[batch.ProblemResult(problem_id="p", kernelbench_id="level2/30", samples=[
            batch.SampleResult(sample=0, file="x.py", submission_id=7, verdict="wrong_answer", message=message,
                               device="cpu", speedup_vs_eager=None, speedup_vs_compile=None)])])
    console = Console(file=io.StringIO(), width=80)
    eval_dir.render(rep, console)
    text = console.file.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert " ".join(text.split()).count(message) == 1  # all of it, wrapped


def test_a_stalled_watcher_says_what_runs_and_asks_for_a_worker_only_when_none_is_alive(svc_db, svc_settings):
    with svc_db.session() as s:
        sub, job = crud.create_submission(s, crud.NewSubmission(
            problem_id="level2/31", problem_version=1, text="x", text_kind="source", submitter="me", model="m",
            tags=[], meta={"file": "level_2_problem_31_sample_0_kernel.py"}), token=None, queue_limit=None,
            max_attempts=1)
        job_id = job.id
    said = reeval.stall_report(svc_db, [job_id], 30, svc_settings.worker_silent_after_s)
    assert "1 jobs wait and no worker is running: start `harness serve` or `harness worker`" in said
    with svc_db.session() as s:
        crud.register_worker(s, "w1", hostname="h", pid=1, slots=["cpu"])
        claim = crud.claim_job(s, "w1", 60)
        crud.mark_running(s, claim.job_id, claim.claim_token)
    said = reeval.stall_report(svc_db, [job_id], 30, svc_settings.worker_silent_after_s)
    assert f"job {job_id} (submission {sub.id}, level2/31, level_2_problem_31_sample_0_kernel.py): running for" in said
    assert "on worker w1" in said and "no worker is running" not in said and "stopped reporting" not in said
    assert "wait" not in said  # the only job is the one running
    with svc_db.session() as s:
        _, gone = crud.create_submission(s, crud.NewSubmission(
            problem_id="level2/30", problem_version=1, text="y", text_kind="source", submitter="me", model="m",
            tags=[], meta={}), token=None, queue_limit=None, max_attempts=1)
        gone_id = gone.id
        crud.claim_job(s, "w-gone", 60)  # a worker that never reported itself: not alive
    said = reeval.stall_report(svc_db, [job_id, gone_id], 30, svc_settings.worker_silent_after_s)
    assert f"job {gone_id} (submission" in said and "compiling for" in said
    assert "on worker w-gone which has stopped reporting: the job goes back to the queue when its lease expires" in said


def test_eval_dir_at_fp16_stores_and_evaluates_every_sample_at_fp16(svc_db, svc_settings, tmp_path):
    run = tmp_path / "runs" / "half"
    run.mkdir(parents=True)
    # Computes in fp32 and returns fp16: within fp16's tolerance of the fp16 reference, outside fp32's.
    (run / "level_2_problem_30_sample_0_kernel.py").write_text((SUBMISSIONS / "l30_fp32_accumulate.py").read_text())
    (run / "level_2_problem_30_sample_1_kernel.py").write_text((SUBMISSIONS / "l30_returns_fp32.py").read_text())
    out = tmp_path / "report.json"
    p = subprocess.run(harness_cmd("eval-dir", str(run), "--device", "cpu", "--precision", "fp16", "--json", str(out)),
                       env=service_env(svc_settings, COLUMNS="200"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "at fp16" in p.stdout
    rep = json.loads(out.read_text())
    assert rep["precision"] == "fp16"
    (problem,) = rep["problems"]
    assert [(s["sample"], s["verdict"]) for s in problem["samples"]] == [(0, "passed"), (1, "dtype_mismatch")]
    with svc_db.session() as s:
        assert set(s.scalars(select(Submission.precision).where(Submission.model == "half"))) == {"fp16"}


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
