from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harness.config import Settings
from harness.db.session import Database

REPO = Path(__file__).parents[2]


@pytest.fixture
def svc_settings(tmp_path, database_url) -> Settings:
    """Quick CPU evaluations, short leases, no retry back-off. On a GPU host the GPU suite's build cache
    (HARNESS_TEST_DATA_DIR, where scripts/gpu-suite.sh builds every CUDA source the tests evaluate): a service
    test's CUDA submission then waits for no nvcc of its own."""
    shared = os.environ.get("HARNESS_TEST_DATA_DIR")
    return Settings(data_dir=tmp_path / "data", database_url=database_url, timing_windows_cpu=3, window_ms_cpu=20.0,
                    window_fixed_cost_factor=0, lease_s=3, retry_delay_s=0, worker_poll_s=0.1, kill_grace_s=2.0,
                    build_cache_dir=Path(shared) / "builds" if shared else None)


@pytest.fixture
def svc_db(svc_settings):
    db = Database(svc_settings)
    yield db
    db.dispose()


def service_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment a `harness` subprocess needs to use these settings."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HARNESS_DATA_DIR": str(settings.data_dir),
           "HARNESS_TIMING_WINDOWS_CPU": str(settings.timing_windows_cpu),
           "HARNESS_WINDOW_MS_CPU": str(settings.window_ms_cpu),
           "HARNESS_WINDOW_FIXED_COST_FACTOR": str(settings.window_fixed_cost_factor),
           "HARNESS_LEASE_S": str(settings.lease_s), "HARNESS_WORKER_POLL_S": str(settings.worker_poll_s),
           "HARNESS_RETRY_DELAY_S": str(settings.retry_delay_s),
           # These tests are about the service; the sandbox's own tests cover the refusal. Where the platform
           # cannot confine children, the workers here run anyway (and log UNSAFE SANDBOX).
           "HARNESS_ALLOW_UNSAFE_SANDBOX": "1"}
    if settings.database_url:
        env["HARNESS_DATABASE_URL"] = settings.database_url
    if settings.build_cache_dir:
        env["HARNESS_BUILD_CACHE_DIR"] = str(settings.build_cache_dir)
    env.update(extra)
    return env


def harness_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def stop_process(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def get_json(url: str):
    try:
        return httpx.get(url, timeout=5).json()
    except httpx.HTTPError:
        return None
