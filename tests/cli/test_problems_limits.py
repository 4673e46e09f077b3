"""`harness problems show` lists the time limits that apply, phase by phase: it said `run 300 s` while the limit a
correctness command hit was 30 s."""

from __future__ import annotations

import json

from harness.config import Settings
from harness.evaluation.runner import command_deadline, phase_limits
from harness.problems import get_registry

from .test_cli import harness


def test_problems_show_lists_each_phases_limit(tmp_path):
    p = harness("problems", "show", "level2/75", data_dir=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "run 300 s" not in p.stdout
    assert "    correctness:  30 s: all trials' calls in one command" in p.stdout and "at most 300 s" in p.stdout
    assert "    compile:      600 s: import and construct ModelNew" in p.stdout and "90 s with no compiler" in p.stdout
    shown = json.loads(harness("problems", "show", "level2/75", "--json", data_dir=tmp_path).stdout)["time_limits"]
    assert [(lim["phase"], lim["seconds"]) for lim in shown][:3] == [("compile", 600), ("correctness", 30),
                                                                     ("timing", 10)]


def test_the_limits_shown_are_the_ones_a_command_gets():
    spec = get_registry().get("level2/75")
    limits = {lim.phase: lim.seconds for lim in phase_limits(spec, Settings())}
    # A fast reference: a correctness command's deadline is the floor shown, not the problem's run limit.
    assert command_deadline(limits["correctness"], 6, 0.5, 0, spec.run_timeout_s) == limits["correctness"] == 30
    assert command_deadline(limits["timing"], 100, 0.5, 0, spec.run_timeout_s) == limits["timing"]
