#!/usr/bin/env python3
"""How fast each of this host's cores runs the same forward, moment by moment, with no harness: the floor under any
A/A on the CPU.

    python benchmarks/cpu_core_speed.py --pairs 40 --calls 50

One thread, level2/62's forward at the built-ins' `small` size (Linear 256 -> 256, GroupNorm of 8 groups, LeakyReLU,
x + x; a batch of 128) on one input. Each pair times `calls` calls kept to core 0, then as many kept to core 1, and
prints each core's time a call and their ratio. Two processes timed on a host whose cores run apart like this
measure the host, not the code: where one pair's ratio moves by 30%, no rule over two processes' windows vouches
for 5%.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--calls", type=int, default=50, help="calls timed on each core in turn")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        raise SystemExit("needs two cores")
    torch.manual_seed(0)
    fc, gn = torch.nn.Linear(256, 256), torch.nn.GroupNorm(8, 256)
    x = torch.rand(128, 256)

    def forward() -> torch.Tensor:
        y = torch.nn.functional.leaky_relu(gn(fc(x)), 0.01)
        return y + y

    per_core: dict[int, list[float]] = {c: [] for c in cores}
    with torch.no_grad():
        for _ in range(args.pairs):
            for core in cores:
                os.sched_setaffinity(0, {core})
                for _ in range(5):
                    forward()
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    forward()
                per_core[core].append((time.perf_counter() - t0) / args.calls * 1e3)
    a, b = (per_core[c] for c in cores)
    ratios = [p / q for p, q in zip(a, b, strict=True)]
    for core in cores:
        print(f"core {core} ms a call: " + " ".join(f"{v:.3f}" for v in per_core[core]))
    print("ratio per pair: " + " ".join(f"{r:.2f}" for r in ratios))
    print(f"core {cores[0]} median {statistics.median(a):.3f} ms ({min(a):.3f}-{max(a):.3f}), core {cores[1]} median "
          f"{statistics.median(b):.3f} ms ({min(b):.3f}-{max(b):.3f}); ratio {min(ratios):.2f}-{max(ratios):.2f}, "
          f"median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
