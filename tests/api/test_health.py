"""/healthz and the OpenAPI docs."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from harness.db import crud
from harness.db.models import WorkerRow

from .conftest import Tokens, body


def test_healthz_reports_the_database_the_queue_and_live_workers(client, db, tokens):
    client.post("/api/submissions", json=body(), headers=Tokens.header(tokens.user))
    with db.session() as s:
        crud.register_worker(s, "gpu-host:1", hostname="gpu-host", pid=1, slots=["cuda:0 NVIDIA H100"])
    got = client.get("/healthz").json()
    assert got["status"] == "ok" and got["database"] == "ok" and got["queue"]["queued"] == 1
    assert [w["id"] for w in got["workers"]] == ["gpu-host:1"] and got["open_mode"] is False
    with db.session() as s:
        crud.worker_stopped(s, "gpu-host:1")
    assert client.get("/healthz").json()["workers"] == []


def test_openapi_docs_list_every_endpoint(client):
    spec = client.get("/openapi.json").json()
    assert {"/api/submissions", "/api/submissions/{submission_id}", "/api/problems", "/api/problems/{problem}",
            "/api/leaderboard", "/api/reeval", "/healthz"} <= set(spec["paths"])
    assert "SubmissionCreate" in spec["components"]["schemas"]
    assert client.get("/docs").status_code == 200


def test_a_worker_whose_heartbeats_stopped_leaves_healthz_within_a_few_intervals(client, db):
    settings = client.app.state.settings
    interval = settings.heartbeat_interval_s
    with db.session() as s:
        for name, silent_for in (("beating", interval), ("dead", 4 * interval)):
            crud.register_worker(s, name, hostname="gpu-host", pid=1, slots=["cpu"])
            s.execute(update(WorkerRow).where(WorkerRow.id == name)
                      .values(last_seen=crud.db_now(s) - timedelta(seconds=silent_for)))
        s.commit()
    # Issue 18: a SIGKILLed worker stayed listed for 2 leases (240 s); 3 beats is 30 s by default.
    assert 4 * interval < 2 * settings.lease_s
    assert [w["id"] for w in client.get("/healthz").json()["workers"]] == ["beating"]


CUDA_SOURCE = ("import torch\nfrom torch.utils.cpp_extension import load_inline\n"
               "ext = load_inline('k', cpp_sources='', cuda_sources='__global__ void k() {}')\n"
               "class ModelNew(torch.nn.Module):\n    pass\n")


def test_healthz_is_degraded_while_a_job_waits_for_a_gpu_that_no_live_worker_has(client, db, tokens):
    """A CPU-only service with a CUDA job queued was 'ok'; it says which jobs wait and for what."""
    with db.session() as s:
        crud.register_worker(s, "cpu-host:1", hostname="cpu-host", pid=1, slots=["cpu"], accepts=[])
    client.post("/api/submissions", json=body(), headers=Tokens.header(tokens.user))
    assert client.get("/healthz").json()["status"] == "ok"  # the CPU worker takes a job that needs nothing
    r = client.post("/api/submissions", json=body(source=CUDA_SOURCE), headers=Tokens.header(tokens.user))
    sid = r.json()["id"]
    got = client.get("/healthz").json()
    assert got["status"] == "degraded"
    assert got["waiting"] == [{"needs": "cuda", "message": "waits for a GPU worker; none is connected", "jobs": 1,
                               "submission_ids": [sid]}]
    with db.session() as s:
        crud.register_worker(s, "gpu-host:1", hostname="gpu-host", pid=1, slots=["cuda:0 NVIDIA H100"])
    got = client.get("/healthz").json()
    assert got["status"] == "ok" and got["waiting"] == []
