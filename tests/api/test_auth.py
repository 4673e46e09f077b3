"""Tokens: write endpoints need one, admin endpoints an admin one; open mode opens submitting only."""

from __future__ import annotations

from sqlalchemy import select

from harness.db.models import Token

from ..db.factories import eval_result, seed
from .conftest import Tokens, body, make_client


def test_tokens_are_stored_hashed(db, tokens):
    with db.session() as s:
        hashes = s.scalars(select(Token.token_hash)).all()
    assert tokens.user not in hashes and all(len(h) == 64 for h in hashes)


def test_submitting_without_a_token_is_401_with_how_to_get_one(client):
    r = client.post("/api/submissions", json=body())
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "harness tokens create" in r.json()["detail"]


def test_bad_revoked_and_malformed_tokens_are_401(client, tokens):
    for header in (Tokens.header("kh_not-a-token"), Tokens.header(tokens.revoked)):
        r = client.post("/api/submissions", json=body(), headers=header)
        assert r.status_code == 401 and "not valid" in r.json()["detail"]
    r = client.post("/api/submissions", json=body(), headers={"Authorization": f"Token {tokens.user}"})
    assert r.status_code == 401 and "Bearer <token>" in r.json()["detail"]


def test_admin_routes_refuse_non_admins_and_anonymous_callers(client, db, tokens):
    sub_id = seed(db, eval_result())
    routes = [("delete", f"/api/submissions/{sub_id}", None), ("post", f"/api/submissions/{sub_id}/reeval", None),
              ("post", "/api/reeval", {"verdict": "passed"})]
    for method, url, payload in routes:
        kwargs = {"json": payload} if payload is not None else {}
        assert getattr(client, method)(url, **kwargs).status_code == 401
        r = getattr(client, method)(url, headers=Tokens.header(tokens.user), **kwargs)
        assert r.status_code == 403 and "admin token" in r.json()["detail"]
        assert getattr(client, method)(url, headers=Tokens.header(tokens.revoked), **kwargs).status_code == 401
    assert client.get(f"/api/submissions/{sub_id}").status_code == 200  # nothing happened


def test_reads_need_no_token(client, db):
    sub_id = seed(db, eval_result())
    for url in (f"/api/submissions/{sub_id}", "/api/submissions", "/api/problems", "/api/problems/level2/75",
                "/api/leaderboard", "/healthz"):
        assert client.get(url).status_code == 200, url


def test_open_mode_accepts_anonymous_submissions_but_not_admin_calls(tmp_path):
    with make_client(tmp_path, open_mode=True) as c:
        r = c.post("/api/submissions", json=body())
        assert r.status_code == 202
        assert c.post("/api/submissions", json=body(), headers=Tokens.header("kh_wrong")).status_code == 401
        assert c.delete(f"/api/submissions/{r.json()['id']}").status_code == 401
        assert c.get("/healthz").json()["open_mode"] is True
        c.app.state.db.dispose()
