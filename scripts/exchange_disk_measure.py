"""Time warm CPU evaluations of a problem and count the trial files (.pt) they write to the scratch disk.

`python scripts/exchange_disk_measure.py level2/75 small 3`: three evaluations of the problem's own Model as ModelNew
through one warm trusted process; each one's wall time and the bytes of .pt files seen under the scratch dir (the
largest size each file reached, polled every 2 ms).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness.config import Settings
from harness.evaluation.runner import EvalOptions, evaluate
from harness.evaluation.warm import TrustedPool
from harness.problems.registry import find_problem, get_registry

problem, size, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
scratch = Path(tempfile.mkdtemp(prefix="kh-measure-"))
settings = Settings(data_dir=scratch / "data", scratch_dir=scratch / "scratch")
spec = find_problem(get_registry(), problem)
text = spec.source().replace("class Model(", "class ModelNew(")  # the reference as the candidate: it runs on a CPU
pool = TrustedPool(settings)
seen: dict[str, int] = {}
stop = threading.Event()


def poll() -> None:
    while not stop.is_set():
        for root, _, files in os.walk(scratch / "scratch"):
            for f in files:
                if f.endswith(".pt"):
                    p = os.path.join(root, f)
                    with contextlib.suppress(OSError):  # removed since the walk saw it
                        seen[p] = max(seen.get(p, 0), os.stat(p).st_size)
        time.sleep(0.002)


threading.Thread(target=poll, daemon=True).start()
for i in range(runs):
    seen.clear()
    t0 = time.monotonic()
    r = evaluate(spec, text, EvalOptions(device="cpu", size=size, trusted_pool=pool), settings)
    wall = time.monotonic() - t0
    print(f"run {i}: verdict={r.verdict.value} wall_s={wall:.2f} trial_files={len(seen)} "
          f"trial_file_bytes={sum(seen.values())} trusted_warm={r.observations.trusted_warm} "
          f"phases={ {k: v for k, v in r.observations.phases.items() if v > 0.01} }", flush=True)
stop.set()
pool.close()
