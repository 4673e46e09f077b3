"""reference_solutions/RESULTS.md is what benchmarks/render_results.py makes of the raw files beside it, never
a hand edit: re-rendering the committed raw results must give the committed page byte for byte."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "reference_solutions" / "results"


def test_results_md_is_rendered_from_the_committed_raw_results():
    harness = sorted(str(p) for p in RESULTS.glob("harness-*.json"))
    probes = [a for p in sorted(RESULTS.glob("*probe*.txt")) for a in ("--probe", str(p))]
    (tensor_cores,) = RESULTS.glob("tensor-cores-*.json")  # one: the run RESULTS.md shows
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "render_results.py"),
                          str(RESULTS / "bench-h100.json"), *harness, *probes,
                          "--tensor-cores", str(tensor_cores), "--floors", str(RESULTS / "floors-h100.json")],
                         capture_output=True, text=True, check=True).stdout
    assert out == (REPO / "reference_solutions" / "RESULTS.md").read_text()
    assert "| level2/37 |" in out and "## Probe:" in out
    assert "## The tensor-core design (3xTF32)" in out and "### The chunk length" in out
