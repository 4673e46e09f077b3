"""The layers above the sandbox never import torch (DESIGN.md): importing them loads none."""

from __future__ import annotations

import subprocess
import sys

MODULES = ["harness", "harness.cli", "harness.sandbox.runner", "harness.grading", "harness.problems",
           "harness.submission", "harness.config", "harness.schema"]


def test_importing_the_cli_runner_and_grading_does_not_import_torch():
    code = (f"import sys\nfor m in {MODULES!r}:\n    __import__(m)\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
            "print(len(bad))\nassert not bad, bad[:5]\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "0"


def test_only_the_sandbox_children_import_submissions():
    """No module except sandbox/child.py loads code from a file path (spec_from_file_location)."""
    from pathlib import Path

    root = Path(__file__).parents[1] / "harness"
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "spec_from_file_location" in p.read_text())
    assert users == ["sandbox/child.py", "sandbox/problem_module.py"]  # the latter loads problem files only
