"""POST and GET /api/submissions: stored before 202, every input error a 4xx that names the fix."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from sqlalchemy import func, select, update

from harness.db import crud
from harness.db.models import Job, Submission

from ..db.factories import eval_result, new_submission, seed
from .conftest import Tokens, body


def _count(db, model) -> int:
    with db.session() as s:
        return s.scalar(select(func.count(model.id)))


def _cpu_worker(db) -> None:
    """A live worker that takes jobs needing nothing: without one, the 202 says the job waits for one."""
    from harness.db import crud

    with db.session() as s:
        crud.register_worker(s, "cpu-host:1", hostname="cpu-host", pid=1, slots=["cpu"], accepts=[])


def test_a_submission_is_stored_and_queued_before_the_202(client, db, tokens):
    _cpu_worker(db)
    r = client.post("/api/submissions", json=body(tags=["run-1"], metadata={"temperature": 0.7}),
                    headers=Tokens.header(tokens.user))
    assert r.status_code == 202, r.text
    got = r.json()
    assert got["status"] == "queued" and got["position"] == 1 and got["problem_id"] == "gemm-groupnorm-min-biasadd"
    assert got["warning"] is None and got["url"] == f"/api/submissions/{got['id']}"
    with db.session() as s:
        sub = s.get(Submission, got["id"])
        assert sub.text == body()["source"] and sub.text_kind == "source" and sub.tags == ["run-1"]
        assert sub.meta == {"temperature": 0.7} and sub.token_id is not None
        assert s.scalar(select(Job.status).where(Job.submission_id == sub.id)) == "queued"
    second = client.post("/api/submissions", json=body(), headers=Tokens.header(tokens.user)).json()
    assert second["position"] == 2


def test_a_raw_reply_is_accepted_and_a_reply_without_code_is_stored_with_a_warning(client, db, tokens):
    _cpu_worker(db)
    reply = "Here is my kernel:\n```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    pass\n```\n"
    r = client.post("/api/submissions", json=body(source=None, reply=reply), headers=Tokens.header(tokens.user))
    assert r.status_code == 202 and r.json()["warning"] is None
    cut = client.post("/api/submissions", json=body(source=None, reply="Sure! Here is the ```python\nimport"),
                      headers=Tokens.header(tokens.user))
    assert cut.status_code == 202
    assert "cut off" in cut.json()["warning"] and "invalid_submission" in cut.json()["warning"]
    detail = client.get(f"/api/submissions/{cut.json()['id']}").json()
    assert detail["text_kind"] == "reply" and detail["status"] == "queued"


def test_a_source_with_a_syntax_error_is_stored_with_a_warning_naming_the_line(client, tokens):
    source = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x)\n        return x\n"
    r = client.post("/api/submissions", json=body(source=source), headers=Tokens.header(tokens.user))
    assert r.status_code == 202
    assert "syntax error in the source at line 3" in r.json()["warning"], r.json()


def test_validation_errors_are_422_naming_the_field(client, db, tokens):
    h = Tokens.header(tokens.user)
    cases = [
        (body(model=None), "model: Field required"),
        (body(submitter=""), "submitter: String should have at least 1 character"),
        (body(reply="x"), "exactly one of the fields 'source'"),
        (body(source=None), "exactly one of the fields 'source'"),
        (body(code="x"), "code: Extra inputs are not permitted"),
        (body(tags=["t"] * 33), "tags: List should have at most 32 items"),
        (body(problem=7), "problem: Input should be a valid string"),
    ]
    for payload, expected in cases:
        r = client.post("/api/submissions", json=payload, headers=h)
        assert r.status_code == 422, payload
        assert expected in r.json()["detail"], r.json()
        assert r.json()["errors"][0]["field"]
    # JSON may spell lone surrogates (\ud800), which no database stores as text.
    surrogate = json.dumps(body()).replace("ModelNew", "ModelNew\\ud800")
    r = client.post("/api/submissions", content=surrogate, headers={**h, "content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("source:") and "unicode" in r.json()["detail"]
    in_metadata = json.dumps(body(metadata={"note": "x"})).replace('"x"', '"\\ud800"')
    r = client.post("/api/submissions", content=in_metadata, headers={**h, "content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("metadata:") and "surrogate" in r.json()["detail"]
    # And NUL (\u0000), which PostgreSQL cannot store as text.
    nul = json.dumps(body()).replace("ModelNew", "ModelNew\\u0000")
    r = client.post("/api/submissions", content=nul, headers={**h, "content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("source:") and "NUL" in r.json()["detail"]
    json_h = {**h, "content-type": "application/json"}
    bad_json = client.post("/api/submissions", content=b'{"problem": ', headers=json_h)
    assert bad_json.status_code == 422 and "JSON" in bad_json.json()["detail"]
    assert _count(db, Submission) == 0


def test_malformed_json_is_422_saying_so_at_line_and_column_not_at_a_character_offset(client, db, tokens):
    h = {**Tokens.header(tokens.user), "content-type": "application/json"}
    r = client.post("/api/submissions", content=b'{"problem": "level2/75",\n "source": "x" "model": "m"}', headers=h)
    assert r.status_code == 422
    assert r.json()["detail"] == "the request body: not valid JSON (Expecting ',' delimiter at line 2 column 16)"
    assert r.json()["errors"] == [{"field": "the request body", "type": "json_invalid",
                                   "message": "not valid JSON (Expecting ',' delimiter at line 2 column 16)"}]
    assert _count(db, Submission) == 0


def test_json_sent_without_the_json_content_type_is_told_which_to_use(client, db, tokens):
    payload = json.dumps(body()).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):  # curl --data-binary sends the latter
        r = client.post("/api/submissions", content=payload,
                        headers={**Tokens.header(tokens.user), "content-type": content_type})
        assert r.status_code == 422
        assert r.json()["detail"] == (f"the request body: not sent as JSON (Content-Type {content_type}); send a "
                                      "JSON object with the header 'Content-Type: application/json'")
    # Sent as JSON, a body that is JSON but not an object keeps the schema's own message.
    r = client.post("/api/submissions", json=[body()], headers=Tokens.header(tokens.user))
    assert r.status_code == 422 and "valid dictionary" in r.json()["detail"]
    assert _count(db, Submission) == 0


def test_an_unknown_problem_is_404_with_did_you_mean(client, tokens):
    r = client.post("/api/submissions", json=body(problem="level2/57"), headers=Tokens.header(tokens.user))
    assert r.status_code == 404
    assert "unknown problem 'level2/57'; did you mean" in r.json()["detail"]
    assert "gemm-groupnorm-min-biasadd (level2/75)" in r.json()["suggestions"]


def test_an_unknown_kernelbench_id_says_what_the_server_serves_and_how_to_serve_a_folder(client, tokens):
    r = client.post("/api/submissions", json=body(problem="level1/1"), headers=Tokens.header(tokens.user))
    detail = r.json()["detail"]
    assert r.status_code == 404 and "unknown problem 'level1/1'" in detail
    assert "This server serves 6 problems (level2/30, level2/37" in detail
    assert "harness serve --problems-dir" in detail
    assert "--problems-dir" in client.get("/api/problems/level1/1").json()["detail"]
    r = client.post("/api/submissions", json=body(problem="gemm_gn"), headers=Tokens.header(tokens.user))
    assert "--problems-dir" not in r.json()["detail"]  # a typo of a slug: the suggestions say enough


def test_an_oversized_body_is_413_whether_or_not_it_says_its_length(client, db, tokens):
    h = {**Tokens.header(tokens.user), "content-type": "application/json"}
    big = json.dumps(body(source="#" * 1_000_001)).encode()
    r = client.post("/api/submissions", content=big, headers=h)
    assert r.status_code == 413 and "1,000,000 bytes" in r.json()["detail"]

    def chunks():  # no Content-Length: counted as it streams
        for _ in range(20):
            yield b" " * 60_000

    r = client.post("/api/submissions", content=chunks(), headers=h)
    assert r.status_code == 413
    assert _count(db, Submission) == 0


def test_a_body_that_is_not_utf8_is_400(client, db, tokens):
    raw = json.dumps(body()).encode().replace(b"ModelNew", b"Model\xffNew")
    r = client.post("/api/submissions", content=raw,
                    headers={**Tokens.header(tokens.user), "content-type": "application/json"})
    assert r.status_code == 400 and "not valid UTF-8" in r.json()["detail"]
    assert _count(db, Submission) == 0


def test_the_per_token_queue_limit_is_429_and_admins_are_exempt(tmp_path):
    from .conftest import make_client

    with make_client(tmp_path, max_queued_per_token=1) as c:
        from harness.db import crud

        with c.app.state.db.session() as s:
            _, user = crud.create_token(s, "u")
            _, admin = crud.create_token(s, "a", is_admin=True)
        assert c.post("/api/submissions", json=body(), headers=Tokens.header(user)).status_code == 202
        r = c.post("/api/submissions", json=body(), headers=Tokens.header(user))
        assert r.status_code == 429 and "limit" in r.json()["detail"]
        for _ in range(3):
            assert c.post("/api/submissions", json=body(), headers=Tokens.header(admin)).status_code == 202
        c.app.state.db.dispose()


def test_a_tokens_own_limit_overrides_the_setting(client, tokens):
    h = Tokens.header(tokens.limited)
    assert [client.post("/api/submissions", json=body(), headers=h).status_code for _ in range(3)] == [202, 202, 429]


def test_get_shows_status_verdict_figures_timings_provenance_and_log(client, db):
    sub_id = seed(db, eval_result(max_rel_err=5e-3, log_tail="trial 0 differs"))
    r = client.get(f"/api/submissions/{sub_id}")
    assert r.status_code == 200
    got = r.json()
    assert got["status"] == "done" and got["verdict"] == "wrong_answer" and got["position"] is None
    res = got["result"]
    assert res["verdict"] == "wrong_answer" and "beyond atol=rtol=0.0001" in res["message"]
    assert res["errors"]["max_rel_err"] == 5e-3 and res["errors"]["trials"] == 5
    assert res["log_excerpt"].startswith("trial 0 output") and res["device"] == "cuda"
    assert res["provenance"]["device_name"] == "NVIDIA H100 80GB HBM3" and res["origin"] == "sandbox"
    assert res["tolerance"] == {"atol": 1e-4, "rtol": 1e-4}

    passed = client.get(f"/api/submissions/{seed(db, eval_result(candidate_ms=1.0, eager_ms=2.0))}").json()["result"]
    assert passed["verdict"] == "passed" and passed["speedup_vs_eager"] == 2.0
    assert passed["timings"]["candidate"]["median_ms"] == 1.0 and passed["timings"]["eager"]["median_ms"] == 2.0
    assert client.get("/api/submissions/999").status_code == 404


def test_a_speedup_comes_with_what_it_is_known_to_and_a_result_without_one_says_null(client, db):
    """The speedups' 95% half-width from the timed rounds (observations.timing_known_to) beside them; a wrong answer,
    whose figures rank nothing, and a result stored before the half-width was kept, carry none."""
    timed = eval_result(candidate_ms=1.0, eager_ms=2.0)
    timed.observations.timing_known_to = 0.045
    got = client.get(f"/api/submissions/{seed(db, timed)}").json()["result"]
    assert got["speedup_vs_eager"] == 2.0 and got["speedup_known_to"] == 0.045
    older = client.get(f"/api/submissions/{seed(db, eval_result())}").json()["result"]
    assert older["speedup_vs_eager"] is not None and older["speedup_known_to"] is None
    wrong = eval_result(max_rel_err=5e-3)
    wrong.observations.timing_known_to = 0.01
    assert client.get(f"/api/submissions/{seed(db, wrong)}").json()["result"]["speedup_known_to"] is None


def test_list_filters_and_pages(client, db, tokens):
    for i in range(5):
        seed(db, eval_result(), submitter="alice" if i % 2 == 0 else "bob")
    seed(db, eval_result(max_rel_err=1.0), submitter="bob")
    seed(db, eval_result(problem="gemm-groupnorm-hardtanh", kb="level2/30"), submitter="bob")
    client.post("/api/submissions", json=body(), headers=Tokens.header(tokens.user))  # still queued

    everything = client.get("/api/submissions").json()
    assert everything["total"] == 8 and [i["id"] for i in everything["items"]] == list(range(8, 0, -1))
    page = client.get("/api/submissions?limit=3&offset=3").json()
    assert [i["id"] for i in page["items"]] == [5, 4, 3] and page["total"] == 8
    bob = client.get("/api/submissions?submitter=bob").json()
    assert bob["total"] == 4 and {i["submitter"] for i in bob["items"]} == {"bob"}
    wrong = client.get("/api/submissions?verdict=wrong_answer").json()
    assert wrong["total"] == 1 and wrong["items"][0]["message"].startswith("trial 0")
    by_kb_id = client.get("/api/submissions?problem=level2/30").json()
    assert by_kb_id["total"] == 1 and by_kb_id["items"][0]["problem_id"] == "gemm-groupnorm-hardtanh"
    queued = client.get("/api/submissions?status=queued").json()
    assert queued["total"] == 1 and queued["items"][0]["verdict"] is None
    assert client.get("/api/submissions?verdict=great").status_code == 422
    assert client.get("/api/submissions?limit=0").json()["detail"].startswith("limit (query parameter)")


def test_a_job_whose_worker_went_silent_says_since_when_and_when_it_goes_back_to_the_queue(client, db):
    with db.session() as s:
        sub, _ = crud.create_submission(s, new_submission(), token=None, queue_limit=None, max_attempts=3)
        claim = crud.claim_job(s, "gpu-host:4242:abc", 120)
        crud.mark_running(s, claim.job_id, claim.claim_token)
    assert client.get(f"/api/submissions/{sub.id}").json()["waiting"] is None  # just heard from
    with db.session() as s:  # the worker was SIGKILLed 40 s ago: no heartbeat since
        last = crud.db_now(s) - timedelta(seconds=40)
        s.execute(update(Job).where(Job.id == claim.job_id)
                  .values(heartbeat_at=last, lease_expires_at=last + timedelta(seconds=120)))
        s.commit()
    got = client.get(f"/api/submissions/{sub.id}").json()
    waiting = got["waiting"]
    assert got["status"] == "running" and waiting["worker_id"] == "gpu-host:4242:abc"
    assert datetime.fromisoformat(waiting["silent_since"]) == last
    assert datetime.fromisoformat(waiting["requeue_at"]) == last + timedelta(seconds=120)
    assert "has been silent since" in waiting["message"] and "goes back to the queue at" in waiting["message"]
    page = client.get(f"/submissions/{sub.id}").text
    assert "Its worker gpu-host:4242:abc has been silent since" in page and last.strftime("%H:%M:%S") in page


def test_a_submission_carries_its_precision_to_the_job_and_an_unknown_one_is_a_422(client, db, tokens):
    h = Tokens.header(tokens.user)
    default = client.post("/api/submissions", json=body(), headers=h).json()
    half = client.post("/api/submissions", json=body(precision="bf16"), headers=h).json()
    assert client.get(f"/api/submissions/{default['id']}").json()["precision"] == "fp32"
    assert client.get(f"/api/submissions/{half['id']}").json()["precision"] == "bf16"
    with db.session() as s:
        claims = [crud.claim_job(s, "w", 60) for _ in range(2)]
    assert [(c.submission_id, c.precision) for c in claims] == [(default["id"], "fp32"), (half["id"], "bf16")]
    bad = client.post("/api/submissions", json=body(precision="fp8"), headers=h)
    assert bad.status_code == 422 and "'fp32', 'fp16' or 'bf16'" in bad.json()["detail"]
    assert _count(db, Submission) == 2


def test_a_cuda_submission_to_a_service_without_a_gpu_worker_is_told_it_waits(client, db, tokens):
    """It got a 202 and then runtime_error (CUDA_HOME is not set) from a CPU worker, counted against the model.
    Now it waits, and the 202, the API and the page say what for; a GPU worker's arrival clears it."""
    cuda = ("import torch\nfrom torch.utils.cpp_extension import load_inline\n"
            "ext = load_inline('k', cpp_sources='', cuda_sources='__global__ void k() {}')\n"
            "class ModelNew(torch.nn.Module):\n    pass\n")
    _cpu_worker(db)
    plain = client.post("/api/submissions", json=body(), headers=Tokens.header(tokens.user)).json()
    assert plain["warning"] is None
    r = client.post("/api/submissions", json=body(source=cuda), headers=Tokens.header(tokens.user))
    assert r.status_code == 202 and "waits for a GPU worker; none is connected" in r.json()["warning"]
    got = client.get(f"/api/submissions/{r.json()['id']}").json()
    assert got["needs"] == "cuda" and got["waits_for"] == "waits for a GPU worker; none is connected"
    assert client.get(f"/api/submissions/{plain['id']}").json()["waits_for"] is None
    assert "waits for a GPU worker; none is connected" in client.get(f"/submissions/{r.json()['id']}").text
    from harness.db import crud

    with db.session() as s:
        crud.register_worker(s, "gpu-host:1", hostname="gpu-host", pid=1, slots=["cuda:0 NVIDIA H100"],
                             accepts=["cuda", "cuda sm_90"])
    assert client.get(f"/api/submissions/{r.json()['id']}").json()["waits_for"] is None


def test_a_submission_over_the_queue_limit_is_refused_before_its_text_is_read(client, tokens, monkeypatch):
    """A 429 costs a count, not a parse: an RL loop over its limit sends far more refused requests than accepted
    ones. The twin under the limit is read (its needs are stored with its job)."""
    from harness import python_ast

    parsed: list[str] = []
    real_parse = python_ast.parse

    def parse(source: str):
        parsed.append(source)
        return real_parse(source)

    monkeypatch.setattr(python_ast, "parse", parse)
    h = Tokens.header(tokens.limited)  # may hold 2 unfinished submissions
    for _ in range(2):
        assert client.post("/api/submissions", json=body(), headers=h).status_code == 202
    assert parsed, "an accepted submission is read"

    def refuse(source: str):
        raise AssertionError("a submission over the queue limit was parsed")

    monkeypatch.setattr(python_ast, "parse", refuse)
    r = client.post("/api/submissions", json=body(), headers=h)
    assert r.status_code == 429 and "limit" in r.json()["detail"]
