"""`harness export kernelbench` and `harness export check-baseline`: a run written in KernelBench's layout, and a
KernelBench baseline-time file read back, through a real subprocess."""

from __future__ import annotations

import json

from harness.config import Settings
from harness.db.session import Database

from ..db.factories import eval_result, seed
from .test_cli import harness


def test_a_run_is_written_in_kernelbenchs_layout(tmp_path):
    data = tmp_path / "data"
    db = Database(Settings(data_dir=data))
    seed(db, eval_result(candidate_ms=1.0, eager_ms=2.0), model="llm-x", meta={"sample": 0})
    seed(db, eval_result(problem="gemm-groupnorm-hardtanh", kb="level2/30", static_error="no code", device=None),
         model="llm-x", meta={"sample": 0})
    db.dispose()
    out = tmp_path / "kb"
    p = harness("export", "kernelbench", "--model", "llm-x", "--hardware", "H100_ours", "--out", str(out),
                data_dir=data)
    assert p.returncode == 0, p.stderr
    results = json.loads((out / "runs" / "llm-x" / "eval_results.json").read_text())
    assert set(results) == {"30", "75"} and results["75"][0]["correctness"] is True
    timing = out / "results" / "timing" / "H100_ours"
    eager = json.loads((timing / "baseline_time_torch.json").read_text())
    assert eager["level2"]["75_Gemm_GroupNorm_Min_BiasAdd.py"]["mean"] == 2.0 * 1.01
    compiled = json.loads((timing / "baseline_time_torch_compile_inductor_default.json").read_text())
    assert compiled["level2"]["75_Gemm_GroupNorm_Min_BiasAdd.py"]["mean"] == 1.5 * 1.01
    said = " ".join(p.stderr.split())
    assert "has no time for level2/30, level2/37, level2/62, level2/88, level2/94" in said
    # And read back: the file it wrote is one KernelBench's format accepts.
    shown = harness("export", "check-baseline", str(timing / "baseline_time_torch.json"), data_dir=data,
                    COLUMNS="120")
    assert shown.returncode == 0 and "NVIDIA H100 80GB HBM3" in shown.stdout and "2.02" in shown.stdout
    unnamed = harness("export", "kernelbench", "--out", str(out), data_dir=data)
    assert unnamed.returncode == 2 and "name the run" in unnamed.stderr


def test_a_file_not_in_kernelbenchs_baseline_format_is_refused(tmp_path):
    bad = tmp_path / "baseline.json"
    bad.write_text('{"level1": {"1_Square.py": {"mean": 0}}}')
    p = harness("export", "check-baseline", str(bad), data_dir=tmp_path, COLUMNS="200")
    assert p.returncode == 2 and "level1/1_Square.py mean: expected a positive finite number" in p.stderr
    bad.write_text("{not json")
    p = harness("export", "check-baseline", str(bad), data_dir=tmp_path, COLUMNS="200")
    assert p.returncode == 2 and "is not JSON" in p.stderr
