"""Admin: delete a submission, re-evaluate one or many (queue again, or re-grade without a GPU)."""

from __future__ import annotations

from sqlalchemy import select

from harness.db.models import Job, Result
from harness.schema import Tolerance

from ..db.factories import eval_result, seed
from .conftest import Tokens

LOOSE = Tolerance(atol=1e-2, rtol=1e-2)


def test_delete_removes_the_submission_and_its_results(client, db, tokens):
    sub_id = seed(db, eval_result())
    h = Tokens.header(tokens.admin)
    assert client.delete(f"/api/submissions/{sub_id}", headers=h).status_code == 204
    assert client.get(f"/api/submissions/{sub_id}").status_code == 404
    with db.session() as s:
        assert s.scalars(select(Result).where(Result.submission_id == sub_id)).all() == []
    assert client.delete(f"/api/submissions/{sub_id}", headers=h).status_code == 404


def test_reeval_one_queues_it_below_new_submissions_and_409_while_queued(client, db, tokens):
    sub_id = seed(db, eval_result())
    h = Tokens.header(tokens.admin)
    r = client.post(f"/api/submissions/{sub_id}/reeval", headers=h)
    assert r.status_code == 202 and r.json()["position"] == 1
    with db.session() as s:
        job = s.get(Job, r.json()["job_id"])
        assert job.reason == "reeval" and job.priority < 0 and job.status == "queued"
    detail = client.get(f"/api/submissions/{sub_id}").json()
    assert detail["status"] == "queued" and detail["verdict"] == "passed"  # the old result stands meanwhile
    assert client.post(f"/api/submissions/{sub_id}/reeval", headers=h).status_code == 409
    assert client.post("/api/submissions/999/reeval", headers=h).status_code == 404


def test_regrade_one_under_the_problems_tolerance_makes_a_new_current_result(client, db, tokens):
    # Graded at 1e-2 when stored; the problem's tolerance is 1e-4: the same figures fail now.
    sub_id = seed(db, eval_result(max_rel_err=5e-3, tolerance=LOOSE))
    assert client.get(f"/api/submissions/{sub_id}").json()["verdict"] == "passed"
    r = client.post(f"/api/submissions/{sub_id}/reeval?regrade_only=true", headers=Tokens.header(tokens.admin))
    assert r.status_code == 200 and r.json()["verdict"] == "wrong_answer"
    res = client.get(f"/api/submissions/{sub_id}").json()["result"]
    assert res["origin"] == "regrade" and res["regraded_from"] is not None and res["tolerance"]["atol"] == 1e-4


def test_bulk_regrade_with_a_tolerance_reports_transitions(client, db, tokens):
    a = seed(db, eval_result(max_rel_err=5e-3))  # wrong_answer at 1e-4
    seed(db, eval_result(max_rel_err=1e-6))  # passes either way
    seed(db, eval_result(max_rel_err=0.5))  # wrong either way
    r = client.post("/api/reeval", json={"regrade_only": True, "atol": 1e-2}, headers=Tokens.header(tokens.admin))
    assert r.status_code == 200
    got = r.json()
    assert got["matched"] == 3 and got["regraded"] == 3  # each now records the tolerance it was graded under
    assert got["transitions"] == {"passed -> passed": 1, "wrong_answer -> passed": 1, "wrong_answer -> wrong_answer": 1}
    assert client.get(f"/api/submissions/{a}").json()["verdict"] == "passed"
    again = client.post("/api/reeval", json={"regrade_only": True, "atol": 1e-2}, headers=Tokens.header(tokens.admin))
    assert again.json()["regraded"] == 0 and again.json()["unchanged"] == 3


def test_bulk_requeue_by_verdict(client, db, tokens):
    seed(db, eval_result(max_rel_err=0.5))
    seed(db, eval_result(max_rel_err=0.5))
    seed(db, eval_result())
    h = Tokens.header(tokens.admin)
    r = client.post("/api/reeval", json={"verdict": "wrong_answer"}, headers=h)
    assert r.status_code == 202 and r.json()["matched"] == 2 and r.json()["queued"] == 2
    again = client.post("/api/reeval", json={"verdict": "wrong_answer"}, headers=h).json()
    assert again["queued"] == 0 and again["already_queued"] == 2
    assert client.post("/api/reeval", json={"verdict": "great"}, headers=h).status_code == 422


def test_bulk_regrade_with_rtol_zero_alone_is_a_422_that_says_to_give_atol(client, db, tokens):
    # Found by the schema fuzzer: rtol alone stands for atol too, and atol=0 is no tolerance (it was a 500).
    h = Tokens.header(tokens.admin)
    r = client.post("/api/reeval", json={"regrade_only": True, "rtol": 0.0}, headers=h)
    assert r.status_code == 422 and "give atol as well" in r.json()["detail"]
    ok = client.post("/api/reeval", json={"regrade_only": True, "atol": 1e-4, "rtol": 0.0}, headers=h)
    assert ok.status_code == 200, ok.text


def test_bulk_regrade_dry_run_writes_nothing_and_undo_restores_the_grading_before_it(client, db, tokens):
    h = Tokens.header(tokens.admin)
    drifted = seed(db, eval_result(max_rel_err=5e-3))  # wrong_answer at the problem's 1e-4, passes at 1e-2
    broken = seed(db, eval_result(compiler_error="k.cu(3): error: expected a ';'"))
    loose = {"regrade_only": True, "atol": 1e-2}
    dry = client.post("/api/reeval", json={**loose, "dry_run": True}, headers=h).json()
    assert dry["dry_run"] and (dry["matched"], dry["verdicts_changed"], dry["skipped"]) == (2, 1, 1)
    assert dry["outcomes"] == {"verdict changed": 1, "no figures: a tolerance does not apply": 1}
    assert client.get(f"/api/submissions/{drifted}").json()["verdict"] == "wrong_answer"  # nothing written

    done = client.post("/api/reeval", json=loose, headers=h).json()
    assert not done["dry_run"] and done["verdicts_changed"] == 1 and done["regraded"] == 1
    graded_at = {i["id"]: i["tolerance"]["atol"] for i in client.get("/api/submissions").json()["items"]}
    assert graded_at == {drifted: 1e-2, broken: 1e-4}  # each listed with the tolerance it was graded at

    undo = client.post("/api/reeval", json={"undo": True}, headers=h).json()
    assert (undo["restored"], undo["skipped"], undo["transitions"]) == (1, 1, {
        "passed -> wrong_answer": 1, "compile_error -> compile_error": 1})
    res = client.get(f"/api/submissions/{drifted}").json()["result"]
    assert res["verdict"] == "wrong_answer" and res["origin"] == "sandbox" and res["tolerance"]["atol"] == 1e-4
    assert client.post("/api/reeval", json={"undo": True, "regrade_only": True}, headers=h).status_code == 422


def test_a_regrade_under_the_problems_tolerance_takes_the_one_at_the_results_precision(client, db, tokens):
    # The same figures: within bf16's 1e-2 (KernelBench's), outside fp32's 1e-4.
    at_bf16 = seed(db, eval_result(max_rel_err=5e-3, tolerance=LOOSE, precision="bf16"))
    at_fp32 = seed(db, eval_result(max_rel_err=5e-3, tolerance=LOOSE))
    h = Tokens.header(tokens.admin)
    for sub_id in (at_bf16, at_fp32):
        assert client.post(f"/api/submissions/{sub_id}/reeval?regrade_only=true", headers=h).status_code == 200
    assert client.get(f"/api/submissions/{at_bf16}").json()["verdict"] == "passed"
    assert client.get(f"/api/submissions/{at_fp32}").json()["verdict"] == "wrong_answer"
