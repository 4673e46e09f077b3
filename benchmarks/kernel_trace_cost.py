#!/usr/bin/env python3
"""What a kernel trace costs in the candidate's process, and what it leaves behind (CUDA).

    python3 benchmarks/kernel_trace_cost.py [--processes 4]

Each variant runs in fresh processes, taken in turn (side by side), each of which builds a small load_inline kernel
(cached after the first), launches a forward of a GEMM, a sigmoid, a GroupNorm and that kernel once, then:
- `window`: the trace's path: a `launches.Tracer` subscribed before the first launch with every callback off (as the
  candidate's process holds it through every timed window), then on for one forward (a traced window's calls) and
  off again; `on_us` is the GroupNorm launch while on (what a traced window's calls pay);
- `callbacks`: traces the forward through CUPTI's launch callbacks subscribed for it alone (`names_of_launches`);
- `profiler`: traces it with the torch profiler (the fallback, for CUDA graphs);
- `profiler-ahead`: starts the profiler once, empty, before the forward's first launch (a way to pay its first
  start ahead, measured and rejected), and traces nothing;
- `none`: nothing.
Each prints the trace's seconds, the names it found, and a small GroupNorm's launch (us per call, median of 5 runs of
2000) before and after. A trace's cost is its seconds; what it leaves behind is the launch's after against none's;
what a subscription held with every callback off costs every window is `window`'s before against none's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r'''
import json, statistics, sys, time
import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline
from harness.evaluation import launches

variant = sys.argv[1]
seen = []
tracer = launches.Tracer.subscribe(lambda *record: seen.append(record)) if variant == "window" else None
source = r"""
__global__ void kh_scale_kernel(float* x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
torch::Tensor kh_scale(torch::Tensor x, double s) {
    int n = x.numel();
    kh_scale_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), (float)s, n);
    return x;
}
"""
ext = load_inline(name="kh_trace_cost", cpp_sources="torch::Tensor kh_scale(torch::Tensor x, double s);",
                  cuda_sources=source, functions=["kh_scale"])
out = {}
if variant == "profiler-ahead":
    from torch.profiler import ProfilerActivity, profile
    torch.zeros(1, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]):
        pass
a = torch.randn(256, 256, device="cuda")
g = torch.randn(8, 64, 16, device="cuda")
w, b = torch.ones(64, device="cuda"), torch.zeros(64, device="cuda")
v = torch.randn(4096, device="cuda")

def forward():
    (a @ a).sigmoid()
    F.group_norm(g, 8, w, b)
    ext.kh_scale(v, 1.0)
    torch.cuda.synchronize()

def launch_us(n=2000):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        F.group_norm(g, 8, w, b)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e6 / n

forward()
launch_us()
out["before_us"] = round(statistics.median(launch_us() for _ in range(5)), 3)
t = time.perf_counter()
if variant == "window":
    tracer.start()
    forward()
    tracer.stop()
    out["names"] = sorted({r[0] for r in seen if r[0] is not None})
elif variant == "callbacks":
    out["names"] = launches.names_of_launches(forward)
elif variant == "profiler":
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        forward()
    out["names"] = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
out["trace_s"] = round(time.perf_counter() - t, 4)
if variant == "window":
    tracer.start()
    out["on_us"] = round(statistics.median(launch_us() for _ in range(5)), 3)
    tracer.stop()
launch_us()
out["after_us"] = round(statistics.median(launch_us() for _ in range(5)), 3)
print("RESULT " + json.dumps(out), flush=True)
'''

VARIANTS = ("none", "window", "callbacks", "profiler", "profiler-ahead")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=4, help="fresh processes per variant")
    args = ap.parse_args()
    rows: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for i in range(args.processes * len(VARIANTS)):
        variant = VARIANTS[i % len(VARIANTS)]
        p = subprocess.run([sys.executable, "-c", CHILD, variant], capture_output=True, text=True, timeout=600,
                           cwd=REPO)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"{variant}: failed (rc {p.returncode}): {p.stderr[-800:]}", flush=True)
            continue
        rows[variant].append(json.loads(line[7:]))
        print(f"{variant}: {line[7:][:300]}", flush=True)
    names = {v: {tuple(r["names"] or ()) for r in rows[v] if "names" in r} for v in ("window", "callbacks", "profiler")}
    print(f"\nthe same names from callbacks and profiler: {names['callbacks'] == names['profiler']}; from the "
          f"window's tracer (GroupNorm's among them): {names['window'] >= names['callbacks'] or names['window']}")
    on = [r["on_us"] for r in rows["window"] if "on_us" in r]
    if on:
        print(f"GroupNorm us while a window's trace is on: {statistics.median(on):.3f}")
    print(f"{'variant':16s} {'trace s':>9s} {'GroupNorm us before':>20s} {'after':>9s}  (medians over processes)")
    for v in VARIANTS:
        if rows[v]:
            med = {k: statistics.median(r[k] for r in rows[v]) for k in ("trace_s", "before_us", "after_us")}
            print(f"{v:16s} {med['trace_s']:9.4f} {med['before_us']:20.3f} {med['after_us']:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
