#!/usr/bin/env python3
"""Whether a problem's eager forward is bound by the host's launches, and how steady the host is (CUDA).

    python3 benchmarks/launch_bound.py PROBLEM.py

One process, the problem at its file's size, 20 calls a row. Each row prints the median host time to enqueue one
forward (no wait) beside its CUDA-event time, and the events' least and most. Where the two medians agree the GPU
waited on the host's launches: the forward's time is the host's. Rows in order: fresh; again; Python's garbage
collector off; the process pinned to one core (core 2); after a float64 copy of the model ran once (as the
trusted side's truth); two seconds later; with that copy let go. The GPU's SM clock, power and temperature are read
beside three of them. Only torch and the problem file are used: nothing of the harness's processes."""

from __future__ import annotations

import copy
import gc
import importlib.util
import os
import subprocess
import sys
import time
from typing import Any

import torch


def load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("problem", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_clocks() -> str:
    return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()


def row(fn: Any, x: list[Any], n: int = 20) -> str:
    with torch.no_grad():
        for _ in range(3):
            fn(*x)
        torch.cuda.synchronize()
        host, device = [], []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            a.record()
            fn(*x)
            b.record()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            host.append((t1 - t0) * 1e3)
            device.append(a.elapsed_time(b))
    return (f"host {sorted(host)[n // 2]:.2f} ms, events {sorted(device)[n // 2]:.2f} ms "
            f"(least {min(device):.2f}, most {max(device):.2f})")


def main() -> None:
    m = load(sys.argv[1])
    d = torch.device("cuda")
    torch.manual_seed(0)
    model = m.Model(*m.get_init_inputs()).to(d).eval()
    x = [t.to(d) if isinstance(t, torch.Tensor) else t for t in m.get_inputs()]
    print(os.path.basename(sys.argv[1]), "cores", len(os.sched_getaffinity(0)))
    print("  fresh       ", row(model, x), "|", gpu_clocks())
    print("  again       ", row(model, x))
    gc.disable()
    print("  gc off      ", row(model, x))
    gc.enable()
    every = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {sorted(every)[min(2, len(every) - 1)]})  # core 2 where there is one
    print("  one core    ", row(model, x))
    os.sched_setaffinity(0, every)
    m64 = copy.deepcopy(model).double()
    with torch.no_grad():
        m64(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in x])
    torch.cuda.synchronize()
    print("  after f64   ", row(model, x), "|", gpu_clocks())
    time.sleep(2)
    print("  2 s later   ", row(model, x), "|", gpu_clocks())
    del m64
    gc.collect()
    print("  f64 let go  ", row(model, x))


if __name__ == "__main__":
    main()
