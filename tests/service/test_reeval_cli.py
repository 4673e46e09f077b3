"""`harness reeval`: re-grade stored figures without a GPU, or queue submissions again for the workers."""

from __future__ import annotations

import subprocess

from sqlalchemy import select

from harness.db import queries
from harness.db.models import Job, ResultOrigin, Submission
from harness.schema import Tolerance
from harness.service.outcomes import infra_result

from ..db.factories import eval_result, seed
from .conftest import harness_cmd, service_env


def reeval(settings, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(harness_cmd("reeval", *args), env=service_env(settings, COLUMNS="200"),
                          capture_output=True, text=True, timeout=120)


def test_regrade_only_applies_the_problems_tolerance_and_prints_a_summary(svc_db, svc_settings):
    loose = Tolerance(atol=1e-2, rtol=1e-2)
    drifted = seed(svc_db, eval_result(max_rel_err=5e-3, tolerance=loose))  # passed under 1e-2, fails 1e-4
    exact = seed(svc_db, eval_result(max_rel_err=1e-6))
    with svc_db.session() as s:
        lost = seed(svc_db, infra_result(queries.get_submission(s, exact), "worker lost"), origin=ResultOrigin.queue)
    p = reeval(svc_settings, "--regrade-only")
    assert p.returncode == 0, p.stderr
    assert "3 results under each problem's tolerance: 1 changed, 1 unchanged, 1 without figures" in p.stdout
    assert "passed" in p.stdout and "wrong_answer" in p.stdout
    with svc_db.session() as s:
        assert queries.get_submission(s, drifted).verdict == "wrong_answer"
        assert queries.get_submission(s, exact).verdict == "passed"
        assert queries.get_submission(s, lost).verdict == "infra_error"


def test_regrade_only_under_a_given_tolerance_and_filters(svc_db, svc_settings):
    a = seed(svc_db, eval_result(max_rel_err=5e-3))
    b = seed(svc_db, eval_result(problem="gemm-groupnorm-hardtanh", kb="level2/30", max_rel_err=5e-3))
    p = reeval(svc_settings, "--regrade-only", "--problem", "level2/75", "--verdict", "wrong_answer",
               "--v01-tolerance")
    assert p.returncode == 0, p.stderr
    assert "re-graded 1 results under atol=rtol=0.01" in p.stdout
    with svc_db.session() as s:
        assert queries.get_submission(s, a).verdict == "passed"
        assert queries.get_submission(s, b).verdict == "wrong_answer"  # another problem: untouched
    assert reeval(svc_settings, "--atol", "1e-3").returncode == 2  # a tolerance needs --regrade-only
    assert "did you mean" in reeval(svc_settings, "--problem", "level2/57").stderr


def test_requeue_puts_matching_submissions_back_in_the_queue_below_new_ones(svc_db, svc_settings):
    old = seed(svc_db, eval_result(max_rel_err=1.0))
    seed(svc_db, eval_result())
    p = reeval(svc_settings, "--verdict", "wrong_answer", "--since", "2020-01-01", "--no-wait")
    assert p.returncode == 0, p.stderr
    assert "1 submissions matched; 1 queued" in p.stderr
    with svc_db.session() as s:
        (job,) = s.scalars(select(Job).where(Job.status == "queued")).all()
        assert job.submission_id == old and job.reason == "reeval" and job.priority == -1
        assert s.get(Submission, old).status == "queued"
    again = reeval(svc_settings, "--verdict", "wrong_answer", "--no-wait")
    assert "0 queued, 1 already queued or running" in again.stderr
