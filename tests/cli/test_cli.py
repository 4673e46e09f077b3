"""The `harness` command as a user runs it: a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from harness.cli.common import si
from harness.cli.eval_dir import slot_choice
from harness.config import Settings

from ..conftest import SUBMISSIONS

REPO = Path(__file__).parents[2]


def harness(*args: str, data_dir: Path, timeout: float = 300, cwd: Path | None = None,
            **env_extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HARNESS_DATA_DIR": str(data_dir), "HARNESS_TIMED_CALLS_CPU": "3",
           **env_extra}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=cwd)


def test_eval_json_prints_the_result_model_on_stdout_and_logs_on_stderr(tmp_path):
    p = harness("eval", "--problem", "level2/75", "--submission", str(SUBMISSIONS / "l75_pytorch_correct.py"),
                "--device", "cpu", "--size", "small", "--json", data_dir=tmp_path)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["verdict"] == "passed" and result["schema_version"] == 1
    assert result["problem"]["kernelbench_id"] == "level2/75"
    assert result["provenance"]["torch_version"] and result["tolerance"] == {"atol": 1e-4, "rtol": 1e-4}
    assert "evaluating" in p.stderr
    # Which pause held the candidate between its turns: its cgroup's freezer, else a ptrace-stop.
    assert result["observations"]["pause_method"] in ("cgroup_freeze", "cgroup_v1_freezer", "ptrace")


def test_eval_text_report_shows_verdict_and_exit_code_1_on_failure(tmp_path):
    p = harness("eval", "-p", "gemm-groupnorm-min-biasadd", "-s", str(SUBMISSIONS / "l75_shape_bc.py"),
                "--device", "cpu", data_dir=tmp_path)
    assert p.returncode == 1
    assert "verdict:    shape_mismatch" in p.stdout and "(1, 256, 128, 1)" in p.stdout


def small_level2_30(level: Path, batch: int = 64, features: int = 128) -> None:
    """Problem level2/30 at a size the CPU evaluates in seconds, as an external KernelBench file in `level`."""
    level.mkdir(parents=True)
    builtin = REPO / "harness/problems/kernelbench/level2/30_Gemm_GroupNorm_Hardtanh.py"
    small = builtin.read_text().replace("batch_size = 1024", f"batch_size = {batch}").replace(
        "in_features = 8192", f"in_features = {features}").replace("out_features = 8192", f"out_features = {features}")
    (level / "30_Gemm_GroupNorm_Hardtanh.py").write_text(small)


def test_eval_with_an_external_problems_dir_given_as_a_relative_path(tmp_path):
    level = tmp_path / "kb" / "level2"
    small_level2_30(level)
    (tmp_path / "work").mkdir()
    # Relative to the user's folder, which no child process runs in.
    p = harness("eval", "--problems-dir", "../kb/level2", "--problem", "level2/30", "--submission",
                str(SUBMISSIONS / "l30_pytorch_correct.py"), "--device", "cpu", "--json", data_dir=tmp_path,
                cwd=tmp_path / "work")
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["verdict"] == "passed", result["message"]
    assert result["problem"]["source"] == str(level.resolve() / "30_Gemm_GroupNorm_Hardtanh.py")
    assert result["problem"]["size"] == "small"  # every problem has one on the CPU (its file is small already)


def test_a_kernelbench_problem_runs_at_one_reduced_size_on_the_cpu_whoever_asks(tmp_path):
    """`--size small` was refused ("has sizes: default") and the default ran at full size (a level2 reference
    reached 14.6 GB). Now every problem has `small` on the CPU, chosen once by the size probe and kept: eval with
    --size small, eval with auto and the service's evaluate (a worker's CPU slot) run the same sizes."""
    from harness.evaluation.runner import EvalOptions, evaluate
    from harness.problems import get_registry
    from harness.service.selfcheck import aa_submission

    fixtures = REPO / "tests/fixtures/kernelbench"
    spec = get_registry(fixtures).get("level2/40")  # a 16384 x 4096 x 4096 GEMM at its default size
    aa = tmp_path / "aa.py"
    aa.write_text(aa_submission(spec.source(), {}))
    runs = []
    for size in ("small", "auto"):
        p = harness("eval", "--problems-dir", str(fixtures), "-p", "level2/40", "-s", str(aa), "--device", "cpu",
                    "--size", size, "--no-timing", "--json", data_dir=tmp_path)
        assert p.returncode == 0, p.stderr
        runs.append(json.loads(p.stdout)["problem"])
    assert runs[0]["size"] == runs[1]["size"] == "small"
    overrides = runs[0]["overrides"]
    assert overrides == runs[1]["overrides"] and overrides["batch_size"] < 16384
    worker = evaluate(spec, aa.read_text(), EvalOptions(device="cpu", timing=False), Settings(data_dir=tmp_path))
    assert worker.verdict.value == "passed" and worker.problem.overrides == overrides


def test_eval_takes_a_problem_file_by_its_path(tmp_path):
    level = tmp_path / "myprob" / "level2"
    small_level2_30(level, batch=16, features=64)
    p = harness("eval", "-p", "myprob/level2/30_Gemm_GroupNorm_Hardtanh.py", "-s",
                str(SUBMISSIONS / "l30_pytorch_correct.py"), "--device", "cpu", "--no-timing", "--json",
                data_dir=tmp_path, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["verdict"] == "passed", result["message"]
    assert result["problem"]["source"] == str(level.resolve() / "30_Gemm_GroupNorm_Hardtanh.py")
    p = harness("eval", "-p", "myprob/level2/31_Nothing.py", "-s", str(SUBMISSIONS / "l30_pytorch_correct.py"),
                data_dir=tmp_path, cwd=tmp_path)
    assert p.returncode == 2 and "no such file" in p.stderr


def test_unknown_problem_exits_2_with_a_suggestion(tmp_path):
    p = harness("eval", "-p", "level2/57", "-s", str(SUBMISSIONS / "l30_raises.py"), data_dir=tmp_path)
    assert p.returncode == 2 and "did you mean" in p.stderr and "level2/75" in p.stderr


def test_problems_ls_and_show(tmp_path):
    ls = harness("problems", "ls", data_dir=tmp_path)
    assert ls.returncode == 0 and "gemm-groupnorm-min-biasadd" in ls.stdout and "level2/94" in ls.stdout
    show = harness("problems", "show", "level2/94", "--source", data_dir=tmp_path)
    assert show.returncode == 0
    assert "Model(in_features, out_features, bias_shape, num_groups)" in show.stdout
    assert "class Model" in show.stdout
    assert "tolerance:   atol=rtol=0.0001 at fp32, atol=rtol=0.01 at fp16, atol=rtol=0.01 at bf16" in show.stdout
    as_json = json.loads(harness("problems", "ls", "--json", data_dir=tmp_path).stdout)
    assert len(as_json) == 6


def test_eval_on_cuda_without_a_visible_gpu_is_a_usage_error(tmp_path):
    p = harness("eval", "-p", "level2/75", "-s", str(SUBMISSIONS / "l75_pytorch_correct.py"), "--device", "cuda",
                data_dir=tmp_path, CUDA_VISIBLE_DEVICES="", COLUMNS="300")  # no line breaks in the box
    assert p.returncode == 2, p.stderr
    assert "no CUDA device is visible (CUDA_VISIBLE_DEVICES='' hides every GPU)" in p.stderr
    assert "--device cpu" in p.stderr and "evaluating" not in p.stderr


@pytest.mark.parametrize("device, gpus, slots", [
    ("auto", None, "all"), ("auto", "0,1", "0,1"), ("cpu", None, "none"), ("cpu", "none", "none"),
    ("auto", "none", "none"),  # --gpus none, as before --device existed
])
def test_eval_dir_device_and_gpus_give_the_workers_slots(device, gpus, slots, tmp_path):
    assert slot_choice(device, gpus, Settings(data_dir=tmp_path)) == slots


@pytest.mark.parametrize("device, gpus, error", [
    ("cpu", "0", "--device cpu uses no GPU"), ("cuda", "none", "runs on the CPU"), ("gpu", None, "auto, cpu or cuda"),
])
def test_eval_dir_device_and_gpus_that_contradict_are_usage_errors(device, gpus, error, tmp_path):
    with pytest.raises(typer.BadParameter, match=error):
        slot_choice(device, gpus, Settings(data_dir=tmp_path))


def test_eval_of_a_source_with_a_syntax_error_names_the_line_and_no_size(tmp_path):
    source = tmp_path / "k.py"
    source.write_text("import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x)\n        return x\n")
    p = harness("eval", "-p", "level2/75", "-s", str(source), "--device", "cpu", data_dir=tmp_path)
    assert p.returncode == 1
    assert "message:    syntax error in the source at line 4: expected ':': 'def forward(self, x)'" in p.stdout
    assert "problem:    gemm-groupnorm-min-biasadd v1 (level2/75)\n" in p.stdout  # nothing ran: no size


def test_problems_show_says_which_problems_are_stochastic(tmp_path):
    fixtures = str(SUBMISSIONS.parent / "problems")
    show = harness("problems", "show", "level2/66", "--problems-dir", fixtures, data_dir=tmp_path)
    assert show.returncode == 0, show.stderr
    assert "stochastic:  yes (Dropout)" in show.stdout
    assert json.loads(harness("problems", "show", "level2/66", "--problems-dir", fixtures, "--json",
                              data_dir=tmp_path).stdout)["stochastic"] == ["Dropout"]
    plain = harness("problems", "show", "level2/94", data_dir=tmp_path)
    assert "stochastic" not in plain.stdout


def test_problems_show_gives_small_sizes_in_a_unit_that_fits():
    assert (si(17301504.0, "FLOP"), si(137573171200.0, "FLOP"), si(528384.0, "B"), si(512, "B")) == (
        "17.3 MFLOP", "138 GFLOP", "528 kB", "512 B")


def test_problems_show_prints_no_zero_flop_sizes(tmp_path):
    show = harness("problems", "show", "level2/75", data_dir=tmp_path)
    assert show.returncode == 0, show.stderr
    assert "size small: 17.3 MFLOP, min traffic 528 kB" in show.stdout and "0.0 GFLOP" not in show.stdout


def test_tokens_ls_columns_line_up_whatever_the_names(tmp_path):
    for name in ("alice", "a-very-long-token-holder-name@example.com"):
        assert harness("tokens", "create", "--name", name, data_dir=tmp_path).returncode == 0
    assert harness("tokens", "revoke", "1", data_dir=tmp_path).returncode == 0
    lines = harness("tokens", "ls", data_dir=tmp_path).stdout.splitlines()
    assert len(lines) == 3
    header = lines[0]
    for row in lines[1:]:
        for column in ("name", "admin", "created", "revoked"):  # each cell starts under its header
            at = header.index(column)
            assert row[at - 1] == " " and row[at] != " ", (column, row)
        end = header.index("max queued") + len("max queued")  # a number column: right-aligned under it
        assert row[end - 1] != " " and row[end] == " ", row


def test_eval_at_a_precision_reports_it_with_its_tolerance_and_an_unknown_one_is_a_usage_error(tmp_path):
    p = harness("eval", "-p", "level2/30", "-s", str(SUBMISSIONS / "l30_pytorch_correct.py"), "--device", "cpu",
                "--precision", "bf16", "--no-timing", "--json", data_dir=tmp_path)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["problem"]["precision"] == "bf16" and result["tolerance"] == {"atol": 1e-2, "rtol": 1e-2}
    bad = harness("eval", "-p", "level2/30", "-s", str(SUBMISSIONS / "l30_pytorch_correct.py"), "--precision", "fp8",
                  data_dir=tmp_path)
    assert bad.returncode == 2 and "use fp32, fp16, bf16" in bad.stderr
