#!/usr/bin/env python3
"""timing_fidelity.py's A/A with both processes' torch on one OpenMP thread: a trial of the CPU's timing, not a
setting (README, "Timing on the CPU", says why it is not the default).

    HARNESS_TIMING_CORE=1 python benchmarks/aa_one_thread.py --device cpu --repeats 5 --quiet-host-s 0.5 --json aa.json

With HARNESS_TIMING_CORE both sides' window threads are kept to that core as well. Every argument is
timing_fidelity.py's. It replaces `windows.timing_env` in this process before the evaluations start their children,
so both children take the environment in as they start.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.evaluation import windows  # noqa: E402

_timing_env = windows.timing_env
windows.timing_env = lambda cores=None: _timing_env(1)
sys.argv = [str(REPO / "benchmarks" / "timing_fidelity.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
