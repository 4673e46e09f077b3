"""Health of what a worker runs on: a GPU after a fault, and the disks it writes to.

A CUDA fault (illegal memory access, a kernel that never ends) kills the child that caused it; the
GPU normally recovers when that process's context is torn down. When it does not (Xid errors, a
wedged GPU), every later job on it would fail and be blamed: so after a crash or timeout the slot
runs a tiny kernel in a fresh child before its next job, and is retired if that keeps failing.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

from harness import artifacts
from harness.config import Settings
from harness.sandbox import limits
from harness.sandbox.capabilities import SandboxError
from harness.sandbox.process import ChildExited, ChildProcess, Deadline, scrubbed_env

log = logging.getLogger("harness.worker")

HEALTH_TIMEOUT_S = 120.0


def gpu_health_check(env: dict[str, str], settings: Settings, timeout_s: float = HEALTH_TIMEOUT_S) -> str | None:
    """None when a tiny kernel runs correctly on the GPU that `env` pins; else what went wrong."""
    with artifacts.scratch_dir(settings) as work:
        try:
            proc = ChildProcess("harness.evaluation.healthcheck", [], cwd=work, env=scrubbed_env(env, work),
                                log_path=work / "health.log", kill_grace_s=settings.kill_grace_s,
                                jail=limits.jail(settings, untrusted=False))
        except SandboxError as e:
            return str(e)
        try:
            msg = proc.next_message(proc.started_at + timeout_s)
            if msg.event == "health" and msg.fields.get("ok") is True:
                return None
            return f"wrong answer from the health-check kernel: {msg.fields.get('detail')}"
        except Deadline:
            return f"the health-check kernel did not finish within {timeout_s:g} s"
        except ChildExited:
            code = proc.wait_exit(5)
            return f"the health-check process ended (code {code}): {proc.log_tail(2000)}"
        finally:
            proc.reap()


def slot_is_healthy(env: dict[str, str], settings: Settings, *, attempts: int = 2, pause_s: float = 5.0,
                    check=gpu_health_check) -> tuple[bool, str | None]:
    """Check, and check again after a pause (a GPU may take a moment to recover); (healthy, last problem)."""
    problem = None
    for i in range(attempts):
        problem = check(env, settings)
        if problem is None:
            return True, None
        log.warning("GPU health check failed (try %d/%d): %s", i + 1, attempts, problem)
        if i + 1 < attempts:
            time.sleep(pause_s)
    return False, problem


def low_disk(settings: Settings) -> str | None:
    """Why the worker should not evaluate now (a disk it writes to is nearly full), or None."""
    if not settings.min_free_disk_mb:
        return None
    for path in {settings.data_dir, settings.scratch_dir or Path(tempfile.gettempdir())}:
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if free < settings.min_free_disk_mb * 2**20:
            return f"disk nearly full: {free // 2**20} MiB free under {path}, less than {settings.min_free_disk_mb} MiB"
    return None
