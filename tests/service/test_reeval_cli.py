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
    assert ("3 results matched, re-graded under each problem's tolerance: 1 verdicts change, 0 keep their verdict "
            "(a new revision records the tolerance), 1 unchanged, 1 without figures") in p.stdout
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
    assert "1 results matched, re-graded under atol=rtol=0.01: 1 verdicts change" in p.stdout
    with svc_db.session() as s:
        assert queries.get_submission(s, a).verdict == "passed"
        assert queries.get_submission(s, b).verdict == "wrong_answer"  # another problem: untouched
    assert reeval(svc_settings, "--atol", "1e-3").returncode == 2  # a tolerance needs --regrade-only
    assert "did you mean" in reeval(svc_settings, "--problem", "level2/57").stderr


def current(db, sub_id: int):
    with db.session() as s:
        return queries.get_result(s, queries.get_submission(s, sub_id).current_result_id)


def test_regrade_says_what_changed_can_be_tried_dry_and_undone(svc_db, svc_settings):
    # Issue 18: under --v01-tolerance, three passing results and a compile error were "4 changed" while
    # every row said "(same)"; the live results were rewritten with no way back.
    passing = [seed(svc_db, eval_result(max_rel_err=1e-6)) for _ in range(3)]
    broken = seed(svc_db, eval_result(compiler_error="k.cu(3): error: identifier \"x\" is undefined"))
    before = {i: current(svc_db, i).id for i in [*passing, broken]}
    assert current(svc_db, broken).verdict == "compile_error"

    dry = reeval(svc_settings, "--problem", "level2/75", "--regrade-only", "--v01-tolerance", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert ("4 results matched, re-graded under atol=rtol=0.01: 0 verdicts would change, 3 would keep their "
            "verdict") in dry.stdout
    assert "1 without figures that a tolerance applies to" in dry.stdout
    assert "dry run: nothing was written" in dry.stdout
    assert "compile_error" in dry.stdout and "no figures: a tolerance does not apply" in dry.stdout
    assert {i: current(svc_db, i).id for i in before} == before

    done = reeval(svc_settings, "--problem", "level2/75", "--regrade-only", "--v01-tolerance")
    assert done.returncode == 0, done.stderr
    assert "0 verdicts change, 3 keep their verdict" in done.stdout and "--undo" in done.stdout
    for i in passing:
        row = current(svc_db, i)
        assert (row.origin, row.regraded_from, row.atol, row.verdict) == ("regrade", before[i], 1e-2, "passed")
    assert current(svc_db, broken).id == before[broken]  # nothing a tolerance applies to: left as it was

    undo_dry = reeval(svc_settings, "--problem", "level2/75", "--undo", "--dry-run")
    assert "3 would go back to the grading before their latest re-grade, 1 have no re-grade to undo" in undo_dry.stdout
    assert current(svc_db, passing[0]).origin == "regrade"
    undo = reeval(svc_settings, "--problem", "level2/75", "--undo")
    assert undo.returncode == 0, undo.stderr
    assert {i: current(svc_db, i).id for i in before} == before
    assert all(current(svc_db, i).atol == 1e-4 for i in passing)


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


def test_requeue_dry_run_lists_which_submissions_it_would_queue(svc_db, svc_settings):
    wrong = seed(svc_db, eval_result(max_rel_err=1.0), submitter="bob", model="llm-b")
    queued = seed(svc_db, eval_result(max_rel_err=1.0), submitter="carol")
    seed(svc_db, eval_result())  # passed: not matched
    assert reeval(svc_settings, "--verdict", "wrong_answer", "--no-wait", "--problem", "level2/75").returncode == 0
    seed(svc_db, eval_result(max_rel_err=1.0))
    with svc_db.session() as s:  # of the two first, only `queued` still waits: the other was evaluated since
        s.query(Job).filter(Job.submission_id == wrong, Job.status == "queued").delete()
        s.query(Submission).filter(Submission.id == wrong).update({"status": "done"})
        s.commit()
    p = reeval(svc_settings, "--verdict", "wrong_answer", "--dry-run")
    assert p.returncode == 0, p.stderr
    assert "3 submissions match; dry run: nothing queued" in p.stderr
    lines = {line.split()[0]: line for line in p.stdout.splitlines()[1:]}
    assert set(lines) == {str(wrong), str(queued), str(queued + 2)}
    assert "bob" in lines[str(wrong)] and "llm-b" in lines[str(wrong)] and "queued again" in lines[str(wrong)]
    assert "left as it is (already queued)" in lines[str(queued)]
    with svc_db.session() as s:
        assert s.query(Job).filter(Job.status == "queued").count() == 1  # the dry run queued nothing
