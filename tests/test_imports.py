"""The layers above the sandbox never import torch (DESIGN.md): importing them loads none."""

from __future__ import annotations

import subprocess
import sys

MODULES = ["harness", "harness.cli", "harness.evaluation.runner", "harness.grading", "harness.problems",
           "harness.submission", "harness.config", "harness.schema",
           "harness.api", "harness.api.app", "harness.api.routes.submissions", "harness.api.routes.leaderboard",
           "harness.api.routes.problems", "harness.api.routes.admin", "harness.api.routes.health",
           "harness.db.models", "harness.db.session", "harness.db.crud", "harness.db.queries", "harness.reporting",
           "harness.service.worker", "harness.service.devices", "harness.service.reeval", "harness.service.batch",
           "harness.service.runtime", "harness.cli.serve", "harness.cli.worker", "harness.cli.reeval",
           "harness.cli.eval_dir", "harness.cli.tokens", "harness.cli.selfcheck", "harness.service.selfcheck",
           "harness.problems.sizes",
           "harness.api.routes.pages", "harness.api.pages", "harness.api.submission_page", "harness.api.charts",
           "harness.demo", "harness.cli.demo", "harness.kernelbench_metrics", "harness.kernelbench_format",
           "harness.service.kernelbench", "harness.api.routes.kernelbench", "harness.cli.export"]


def test_importing_the_cli_runner_and_grading_does_not_import_torch():
    code = (f"import sys\nfor m in {MODULES!r}:\n    __import__(m)\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
            "print(len(bad))\nassert not bad, bad[:5]\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "0"


def test_isolation_knows_nothing_of_the_evaluation_protocol():
    """harness.sandbox confines and ends processes; harness.evaluation says what they compute. The arrow runs one
    way: an import of the protocol from the isolation layer would tie the two back together."""
    from pathlib import Path

    root = Path(__file__).parents[1] / "harness" / "sandbox"
    upward = sorted(p.name for p in root.glob("*.py") if "harness.evaluation" in p.read_text())
    assert upward == []


def test_only_the_sandbox_children_import_submissions():
    """No module except evaluation/child.py loads code from a file path (spec_from_file_location)."""
    from pathlib import Path

    root = Path(__file__).parents[1] / "harness"
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "spec_from_file_location" in p.read_text())
    assert users == ["evaluation/child.py", "evaluation/problem_module.py"]  # the latter loads problem files only


def test_the_api_serves_requests_without_importing_torch(tmp_path):
    """Not only the import: building the app, migrating its database and answering requests load none."""
    code = (
        "import sys\nfrom fastapi.testclient import TestClient\n"
        "from harness.api import create_app\nfrom harness.config import Settings\n"
        f"c = TestClient(create_app(Settings(data_dir={str(tmp_path)!r}, open_mode=True)))\n"
        "assert c.get('/api/problems/level2/75').status_code == 200\n"
        "assert c.post('/api/submissions', json={'problem': 'level2/75', 'submitter': 'a', 'model': 'm', "
        "'source': 'class ModelNew: pass'}).status_code == 202\n"
        "assert c.get('/api/leaderboard').status_code == 200 and c.get('/openapi.json').status_code == 200\n"
        "assert c.get('/').status_code == 200 and c.get('/problems/level2/75').status_code == 200\n"
        "assert c.get('/submissions/1').status_code == 200\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad[:5]\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_only_the_crud_module_commits():
    """One module owns transactions (STYLE.md): nothing else in the package calls commit()."""
    from pathlib import Path

    root = Path(__file__).parents[1] / "harness"
    committers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if ".commit()" in p.read_text())
    assert committers == ["db/crud.py"]
