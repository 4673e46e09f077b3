"""Two hosts in miniature (scripts/two-host-demo.sh): two workers in network namespaces of their own share one
PostgreSQL queue and finish 100 jobs, none claimed twice. Needs root for the namespaces."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import import_psycopg, skip_or_fail

REPO = Path(__file__).parents[2]

import_psycopg()
from ..postgres_server import find_bindir  # noqa: E402


@pytest.mark.slow
def test_two_workers_on_two_network_namespaces_share_one_postgres_queue():
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("needs root and iproute2 to make network namespaces")
    if find_bindir() is None:
        skip_or_fail("postgres", "PostgreSQL's server is not installed")
    if subprocess.run(["ip", "netns", "add", f"kh-probe-{os.getpid()}"], capture_output=True).returncode != 0:
        pytest.skip("this machine does not allow network namespaces (a container without CAP_SYS_ADMIN?)")
    subprocess.run(["ip", "netns", "del", f"kh-probe-{os.getpid()}"], check=True)
    bindir = Path(sys.executable).parent
    env = {**os.environ, "JOBS": "100", "REAL": "4", "TAG": f"kt{os.getpid() % 100000}",
           "HARNESS": str(bindir / "harness"), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "two-host-demo.sh")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "jobs 100, done 100, claimed more than once 0" in proc.stdout
    assert "claims logged: 100, distinct jobs: 100" in proc.stdout
