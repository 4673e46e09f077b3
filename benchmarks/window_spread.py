"""Why a problem's timed windows spread: one process, the problem at its file's size, windows timed as the harness
times them (flush, call, flush, call, ..., one wait), under conditions that differ in one thing each.

    python3 benchmarks/window_spread.py PROBLEM.py [PROBLEM.py ...] [--windows 20] [--gap-ms 150]

Conditions (each a row per problem): windows back to back; a sleep of --gap-ms between windows (as a process waits
while the other kinds' windows run); the same with Python's garbage collector off during windows; the same with the
waiting thread spinning instead of sleeping; the same with the inputs made before the window's clock starts; the
same with a lead-in of untimed calls of 10, 30 or 100 ms right before the window (and 30 ms followed by a 2 ms
sleep, as a paused candidate waits while its inputs are written); the same with 30 ms of CPU spinning only. For
each: the median time per call on the host's clock and on CUDA events, and the spread (interquartile range over
median) of both. Only torch and the problem file are used: nothing of the harness's processes.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import time
from pathlib import Path

import torch


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spread(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / statistics.median(xs)


def inputs_of(module, device):
    with device:
        return [x.to(device) if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]


def window(model, module, calls, device, flush, premade=None):
    t0 = time.perf_counter()
    xs = premade if premade is not None else [inputs_of(module, device) for _ in range(calls)]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    kept = []
    for x in xs:
        flush.zero_()
        kept.append(model(*x))
    end.record()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, start.elapsed_time(end)


def run(path: Path, windows: int, gap_ms: float) -> None:
    device = torch.device("cuda")
    module = load(path)
    with device:
        model = module.Model(*module.get_init_inputs())
    model.eval()
    flush = torch.empty(2 * torch.cuda.get_device_properties(device).L2_cache_size // 4, device=device)
    x = inputs_of(module, device)
    with torch.no_grad():
        for _ in range(3):
            model(*x)
        torch.cuda.synchronize()
        t = time.perf_counter()
        model(*x)
        torch.cuda.synchronize()
        one_ms = (time.perf_counter() - t) * 1e3
        calls = max(1, min(int(60 / max(one_ms, 1e-3)), 64))
        conditions = {
            "back to back": dict(gap=0.0),
            "sleep between": dict(gap=gap_ms),
            "sleep, gc off": dict(gap=gap_ms, gc_off=True),
            "spin between": dict(gap=gap_ms, spin=True),
            "sleep, inputs premade": dict(gap=gap_ms, premade=True),
            "sleep, lead-in 10 ms": dict(gap=gap_ms, premade=True, lead_ms=10.0),
            "sleep, lead-in 30 ms": dict(gap=gap_ms, premade=True, lead_ms=30.0),
            "sleep, lead-in 100 ms": dict(gap=gap_ms, premade=True, lead_ms=100.0),
            "sleep, lead-in 30, 2 ms gap": dict(gap=gap_ms, premade=True, lead_ms=30.0, after_lead_ms=2.0),
            "sleep, spin 30 ms": dict(gap=gap_ms, premade=True, spin_ms=30.0),
        }
        print(f"{path.stem}: one call {one_ms:.3f} ms, {calls} calls a window, {windows} windows", flush=True)
        for name, c in conditions.items():
            host, dev = [], []
            for w in range(windows + 2):
                premade = [inputs_of(module, device) for _ in range(calls)] if c.get("premade") else None
                if premade is not None:
                    torch.cuda.synchronize()
                if c["gap"]:
                    if c.get("spin"):
                        end = time.perf_counter() + c["gap"] / 1e3
                        while time.perf_counter() < end:
                            pass
                    else:
                        time.sleep(c["gap"] / 1e3)
                if c.get("lead_ms"):  # calls on the window's first inputs, right before it, untimed
                    lead_end = time.perf_counter() + c["lead_ms"] / 1e3
                    while time.perf_counter() < lead_end:
                        flush.zero_()
                        model(*premade[0])
                        torch.cuda.synchronize()
                    time.sleep(c.get("after_lead_ms", 0.0) / 1e3)
                if c.get("spin_ms"):  # the CPU busy, the GPU idle
                    spin_end = time.perf_counter() + c["spin_ms"] / 1e3
                    while time.perf_counter() < spin_end:
                        pass
                if c.get("gc_off"):
                    gc.disable()
                try:
                    h, d = window(model, module, calls, device, flush, premade)
                finally:
                    gc.enable()
                if w >= 2:
                    host.append(h / calls)
                    dev.append(d / calls)
            print(f"  {name:<22} host {statistics.median(host):8.4f} ms spread {spread(host):.3f}   "
                  f"device {statistics.median(dev):8.4f} ms spread {spread(dev):.3f}   "
                  f"min/max device {min(dev):.4f}/{max(dev):.4f}", flush=True)
    del model, x, flush
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", type=Path, nargs="+")
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--gap-ms", type=float, default=150.0)
    args = ap.parse_args()
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for p in args.problems:
        run(p, args.windows, args.gap_ms)


if __name__ == "__main__":
    main()
