"""Demo results: each outcome grades to the verdict it stands for, and seeding goes through the queue."""

from __future__ import annotations

import random

import pytest

from harness import demo
from harness.config import Settings
from harness.db import queries
from harness.db.session import Database
from harness.problems import get_registry

EXPECTED = {"passed": "passed", "passed_low_precision": "passed", "compile_error": "compile_error",
            "runtime_error": "runtime_error", "crashed": "crashed", "wrong_answer": "wrong_answer",
            "tf32_wrong_answer": "wrong_answer", "shape_mismatch": "shape_mismatch", "timeout": "timeout",
            "flagged_tf32_flag": "flagged", "flagged_timed_outputs": "flagged",
            "invalid_submission": "invalid_submission"}


@pytest.mark.parametrize("outcome", demo.OUTCOMES)
def test_each_outcome_grades_to_its_verdict_on_every_problem(outcome):
    rng = random.Random(0)
    for spec in get_registry().all():
        _, result = demo.demo_result(rng, spec, outcome)
        assert result.verdict.value == EXPECTED[outcome], (spec.id, result.message)


def test_a_passing_result_is_no_faster_than_the_fp32_ceiling_and_a_shortcut_is_visible():
    rng = random.Random(1)
    spec = get_registry().get("level2/75")
    for _ in range(50):
        _, r = demo.demo_result(rng, spec, "passed", skill=1.0)
        assert r.verdict.value != "passed" or r.speedup_vs_eager <= demo.H100_TIMES["level2/75"][2]
    _, low = demo.demo_result(rng, spec, "passed_low_precision")
    assert [f.check for f in low.flags] == ["precision_below_fp32"]


def test_seeding_stores_every_model_on_every_problem_through_the_queue(tmp_path):
    db = Database(Settings(data_dir=tmp_path))
    with db.session() as s:
        summary = demo.seed_demo(s, get_registry().all(), seed=0)
        rows = queries.scored_results(s)
        counts = queries.job_counts(s)
    db.dispose()
    assert summary.submissions == len(rows) and len(summary.pending) == 2
    assert {(row.problem_id, row.model) for row in rows} == {
        (p.id, m.model) for p in get_registry().all() for m in demo.MODELS}
    assert {"passed", "compile_error", "wrong_answer"} <= set(summary.verdicts)
    assert counts["queued"] == 1 and counts["running"] == 1 and counts["done"] == summary.submissions
