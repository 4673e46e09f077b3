from __future__ import annotations

from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from harness.api import create_app
from harness.config import Settings
from harness.db import crud

from ..conftest import database_for


@dataclass
class Tokens:
    user: str
    admin: str
    revoked: str
    limited: str  # may hold 2 unfinished submissions

    @staticmethod
    def header(secret: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {secret}"}


def make_client(tmp_path, **overrides) -> TestClient:
    settings = Settings(data_dir=tmp_path / "data", **overrides)
    return TestClient(create_app(settings))


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request) -> str | None:
    """The API suite runs on both databases: with workers on many hosts, PostgreSQL serves the API and the
    leaderboard too."""
    return database_for(request, request.param)


@pytest.fixture
def client(tmp_path, database_url):
    with make_client(tmp_path, database_url=database_url) as c:
        yield c
        c.app.state.db.dispose()


@pytest.fixture
def db(client):
    return client.app.state.db


@pytest.fixture
def tokens(db) -> Tokens:
    with db.session() as s:
        _, user = crud.create_token(s, "alice")
        _, admin = crud.create_token(s, "root", is_admin=True)
        revoked_token, revoked = crud.create_token(s, "mallory")
        crud.revoke_token(s, revoked_token.id)
        _, limited = crud.create_token(s, "dave", max_queued=2)
    return Tokens(user, admin, revoked, limited)


def body(**overrides) -> dict:
    b = {"problem": "level2/75", "submitter": "alice", "model": "my-llm",
         "source": "import torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n"}
    b.update(overrides)
    return {k: v for k, v in b.items() if v is not None}
