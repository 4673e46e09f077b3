"""Run every hostile fixture through the real sandbox and print one line per verdict.

    python3 scripts/hostile_verdicts.py [--device cuda|cpu] [--json FILE]

On a GPU host (scripts/device-hostile.sh) this is the evidence that each attack gets a verdict, that
CUDA faults leave the GPU healthy for the next job (the worker's health-check kernel), and what the
platform's sandbox allowed. Loopback only: the network fixture connects to a listener it starts here.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.config import Settings  # noqa: E402
from harness.evaluation.runner import EvalOptions, evaluate  # noqa: E402
from harness.problems import get_registry  # noqa: E402
from harness.sandbox import capabilities, limits  # noqa: E402
from harness.service.health import gpu_health_check  # noqa: E402

HOSTILE = REPO / "tests" / "fixtures" / "hostile"
SUBMISSIONS = REPO / "tests" / "fixtures" / "submissions"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kh-hostile-"))
    settings = Settings(data_dir=root / "data", scratch_dir=root / "scratch", child_memory_mb=16384,
                        child_max_pids=1024, child_disk_mb=256, correctness_trials=2, timing_windows_cuda=3,
                        timing_windows_extra_cuda=0, timing_windows_cpu=3, compile_baseline="off")
    settings.data_dir.mkdir(parents=True)
    (settings.data_dir / "harness.db").write_text("KH_SECRET_MARKER")
    (settings.data_dir / "admin-token").write_text("KH_SECRET_MARKER")
    other = settings.data_dir / "jobs" / "other" / "submission.txt"
    other.parent.mkdir(parents=True)
    other.write_text("KH_SECRET_MARKER")
    canary = root / "canary"
    canary.mkdir()
    (canary / "keep").write_text("x")
    os.environ["KH_SECRET_MARKER"] = "in the worker's environment"  # noqa: S105 - a marker, not a secret
    platform = capabilities.platform()
    print(f"platform: {platform.describe()}", *platform.notes, sep="\n  ", flush=True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    subs = {"PORT": listener.getsockname()[1], "DB": settings.data_dir / "harness.db",
            "TOKEN": settings.data_dir / "admin-token", "OTHER": other, "CANARY": canary, "DATA": settings.data_dir,
            "GIB": 24, "FILES": 64}
    cases = [(f, "level2/75", HOSTILE / f) for f in sorted(os.listdir(HOSTILE))]
    if args.device == "cuda":
        cases += [(f, "level2/30", SUBMISSIONS / f) for f in ("l30_cuda_illegal_access.py", "l30_cuda_hung_kernel.py")]
    rows = []
    registry = get_registry()
    for name, problem, path in cases:
        text = path.read_text()
        for k, v in subs.items():
            text = text.replace(f"__{k}__", str(v))
        t0 = time.monotonic()
        s = settings.model_copy(update={"child_cpu_s": 20}) if name == "cpu_burn.py" else settings
        r = evaluate(registry.get(problem), text, EvalOptions(device=args.device, size="small", run_timeout_s=60,
                                                               compile_timeout_s=300), s)
        log = r.observations.log_tail or ""
        row = {"fixture": name, "verdict": r.verdict.value, "message": r.message.splitlines()[0][:160],
               "leak": "LEAK" in r.message + log, "seconds": round(time.monotonic() - t0, 1)}
        if args.device == "cuda":
            row["gpu_health_after"] = gpu_health_check({"CUDA_VISIBLE_DEVICES": os.environ.get(
                "CUDA_VISIBLE_DEVICES", "0").split(",")[0]}, settings) or "ok"
        rows.append(row)
        print(f"{name:28s} {row['verdict']:18s} leak={row['leak']!s:5s} "
              f"{'gpu=' + row['gpu_health_after'] if 'gpu_health_after' in row else ''} {row['message']}", flush=True)
    canary_ok = (canary / "keep").exists()
    leftovers = [p for uid in range(settings.sandbox_uid_base, settings.sandbox_uid_base + settings.sandbox_uid_count)
                 for p in limits._pids_of_uid(uid)]
    print(f"canary intact: {canary_ok}; sandbox processes left: {len(leftovers)}")
    if args.json:
        args.json.write_text(json.dumps({"platform": platform.describe(), "rows": rows, "canary_intact": canary_ok,
                                         "leftover_processes": len(leftovers)}, indent=2))
    return 0 if canary_ok and not leftovers and not any(r["leak"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
