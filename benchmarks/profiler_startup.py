#!/usr/bin/env python3
"""What the kernel trace costs, stage by stage, in a fresh process: the candidate's last phase on CUDA.

    python benchmarks/profiler_startup.py [--json OUT.json]

Each configuration runs in a fresh interpreter (the cost is CUPTI's and kineto's first start in a process), on a
GEMM + GroupNorm forward at level2/75's size, and prints the seconds of: importing torch.profiler, entering the
profiler, the traced forward, leaving it, and reading the kernel names; then the median of a bare loop of tiny
kernels before and after, since CUPTI can leave a per-launch cost behind.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CONFIGS = {
    # the harness's trace before this probe: torch.profiler with CUDA activities, names from prof.events()
    "events": "events",
    # the same trace, names read from kineto's raw results (no FunctionEvent tree)
    "kineto_raw": "raw",
    # CPU and CUDA activities, as torch.profiler's default
    "cpu_and_cuda": "cpu",
}

CHILD = r'''
import json, statistics, sys, time
t = {}
t0 = time.perf_counter()
import torch
t["import_torch"] = time.perf_counter() - t0
dev = torch.device("cuda")
x = torch.rand(1024, 8192, device=dev)
lin = torch.nn.Linear(8192, 8192).to(dev)
gn = torch.nn.GroupNorm(512, 8192).to(dev)
def fwd():
    return gn(lin(x))
with torch.no_grad():
    fwd(); torch.cuda.synchronize()
    small = torch.zeros(16, device=dev)
    def loop_ms():
        out = []
        for _ in range(15):
            torch.cuda.synchronize(); a = time.perf_counter()
            for _ in range(200):
                small.add_(1)
            torch.cuda.synchronize(); out.append((time.perf_counter() - a) * 1e3)
        return statistics.median(out)
    t["loop_before_ms"] = loop_ms()
    mode = sys.argv[1]
    t0 = time.perf_counter()
    from torch.profiler import ProfilerActivity, profile
    t["import_profiler"] = time.perf_counter() - t0
    acts = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if mode == "cpu" else [])
    t0 = time.perf_counter()
    prof = profile(activities=acts)
    prof.__enter__()
    t["enter"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fwd(); torch.cuda.synchronize()
    t["traced_forward"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    prof.__exit__(None, None, None)
    t["exit"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    cuda = torch.autograd.DeviceType.CUDA
    if mode == "raw":
        names = {e.name() for e in prof.profiler.kineto_results.events() if e.device_type() == cuda}
    else:
        names = {e.name for e in prof.events() if e.device_type == cuda}
    t["names"] = time.perf_counter() - t0
    t["kernels"] = sorted(names)
    t["loop_after_ms"] = loop_ms()
print(json.dumps(t))
'''


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    rows = []
    for rep in range(args.repeats):
        for name, mode in CONFIGS.items():
            out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=False)
            if out.returncode:
                print(f"{name}: failed\n{out.stderr[-2000:]}")
                continue
            row = {"config": name, "repeat": rep, **json.loads(out.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(f"{name:13s} " + " ".join(f"{k}={v:.3f}" for k, v in row.items() if isinstance(v, float))
                  + f" kernels={len(row['kernels'])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
