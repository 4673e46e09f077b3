"""Property-based fuzzing of the API from its own OpenAPI schema (schemathesis): whatever the input, no
5xx, and every error answer carries a message. In-process (ASGI), bounded in examples."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from harness.api import create_app  # noqa: E402
from harness.config import Settings  # noqa: E402
from harness.db import crud  # noqa: E402

from ..db.factories import eval_result, new_submission  # noqa: E402


def _app():
    """Built at import: schemathesis reads the schema at collection (its fixture loader does not work with
    this pytest). The data dir is removed at exit."""
    data = Path(tempfile.mkdtemp(prefix="kh-fuzz-"))
    atexit.register(shutil.rmtree, data, True)
    app = create_app(Settings(data_dir=data / "data", open_mode=True))
    with app.state.db.session() as s:
        _, admin = crud.create_token(s, "fuzz-admin", is_admin=True)
        crud.create_submission(s, new_submission(), token=None, queue_limit=None, max_attempts=3)
        claim = crud.claim_job(s, "fuzz", 60)
        assert claim is not None
        crud.complete_job(s, claim.job_id, claim.claim_token, eval_result())
    app.state.fuzz_admin = admin
    return app


APP = _app()
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_makes_the_api_fail_or_answer_an_error_without_a_message(case):
    # Half the cases as the admin (so admin routes are reached past authentication), half anonymous.
    headers = {"Authorization": f"Bearer {APP.state.fuzz_admin}"} if hash(repr(case.body)) % 2 else None
    response = case.call(headers=headers)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
    content_type = (response.headers.get("content-type") or [""])[0]  # schemathesis keeps every value
    if response.status_code >= 400 and content_type.startswith("application/json"):
        detail = response.json().get("detail")
        assert detail, f"{case.method} {case.formatted_path}: {response.status_code} without a message"
