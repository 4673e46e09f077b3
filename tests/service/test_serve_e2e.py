"""`harness serve` as a user runs it: a real server on a free port with its embedded CPU worker; a
submission over HTTP with the admin token the first start leaves; the result through the API."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import httpx
from sqlalchemy import select

from harness.db.models import WorkerRow
from harness.db.session import Database

from ..conftest import SUBMISSIONS
from .conftest import free_port, get_json, harness_cmd, service_env, stop_process, wait_for


def test_serve_evaluates_a_submission_end_to_end_on_the_cpu(svc_settings, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = service_env(svc_settings, CUDA_VISIBLE_DEVICES="")  # a machine without a GPU
    with open(tmp_path / "serve.log", "w") as log:
        server = subprocess.Popen(harness_cmd("serve", "--port", str(port)), env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: get_json(f"{base}/healthz"), 60, "the server to answer")
        token_file = svc_settings.data_dir / "admin-token"
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        token = token_file.read_text().strip()
        assert "created an admin token" in (tmp_path / "serve.log").read_text()

        source = (SUBMISSIONS / "l75_pytorch_correct.py").read_text()
        payload = {"problem": "level2/75", "submitter": "e2e", "model": "copy-of-reference", "source": source}
        assert httpx.post(f"{base}/api/submissions", json=payload, timeout=10).status_code == 401
        r = httpx.post(f"{base}/api/submissions", json=payload, headers={"Authorization": f"Bearer {token}"},
                       timeout=10)
        assert r.status_code == 202, r.text
        url = base + r.json()["url"]

        done = wait_for(lambda: (j := get_json(url)) and j["status"] == "done" and j, 180, "the evaluation")
        res = done["result"]
        assert done["verdict"] == "passed" and res["device"] == "cpu" and res["problem"]["size"] == "small"
        assert res["provenance"]["device"] == "cpu" and res["timings"]["candidate"]["clock"] == "parent_window"

        board = get_json(f"{base}/api/leaderboard?problem=level2/75")
        assert board["gpu"]["rows"] == []
        # Ranked on the CPU board, unless this host was too busy for timing (passed, shown, not ranked).
        if "timing_unreliable" in [f["check"] for f in res["flags"]]:
            assert board["cpu"]["rows"] == []
        else:
            assert board["cpu"]["rows"][0]["submitter"] == "e2e"
        health = get_json(f"{base}/healthz")
        assert health["status"] == "ok" and health["workers"][0]["slots"][0].startswith("cpu")
        db = Database(svc_settings, migrate_now=False)
        with db.session() as s:
            worker_pid = s.scalar(select(WorkerRow.pid))
        db.dispose()
    finally:
        stop_process(server)
    assert server.returncode == 0
    # The embedded worker went down with the server.
    wait_for(lambda: not os.path.exists(f"/proc/{worker_pid}"), 30, "the embedded worker to exit")


def test_open_mode_is_refused_off_loopback(svc_settings):
    p = subprocess.run(harness_cmd("serve", "--open", "--host", "0.0.0.0", "--no-worker"),
                       env=service_env(svc_settings), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "loopback" in p.stderr


def test_a_port_in_use_is_refused_before_any_url_token_or_database(svc_settings):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = subprocess.run(harness_cmd("serve", "--port", str(port), "--no-worker"), env=service_env(svc_settings),
                           capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in p.stderr and "--port" in p.stderr
    assert "KernelHarness on" not in p.stderr and "admin token" not in p.stderr
    assert not (svc_settings.data_dir / "admin-token").exists()
    assert not (svc_settings.data_dir / "harness.db").exists()


def test_a_killed_server_takes_its_worker_with_it(svc_settings, tmp_path):
    port = free_port()
    env = service_env(svc_settings, CUDA_VISIBLE_DEVICES="")
    server = subprocess.Popen(harness_cmd("serve", "--port", str(port), "--open"), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        health = wait_for(lambda: (h := get_json(f"http://127.0.0.1:{port}/healthz")) and h["workers"] and h, 90,
                          "the embedded worker to register")
        assert health["open_mode"] is True
        db = Database(svc_settings, migrate_now=False)
        with db.session() as s:
            worker_pid = s.scalar(select(WorkerRow.pid))
        db.dispose()
        os.kill(server.pid, signal.SIGKILL)
        server.wait(10)
        wait_for(lambda: not os.path.exists(f"/proc/{worker_pid}"), 30, "the orphaned worker to exit")
    finally:
        stop_process(server)
