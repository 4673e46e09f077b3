#!/usr/bin/env python3
"""Whether a fresh process is faster or slower than the next at the same forward, on the CPU, with no harness.

    for i in $(seq 10); do OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE python benchmarks/cpu_process_spread.py; done

Each run builds level2/62's Model at the built-ins' `small` size (Linear 256 -> 256, GroupNorm of 8 groups,
LeakyReLU, x + x; a batch of 128) under seed 0, warms it up, then prints five medians, 0.1 s apart, of 15 windows
of 20 calls each (fresh inputs a call, as a timed window makes them), in ms a call. Set beside each other, the rows
say how much of an A/A's spread one process brings by itself (its first median) and how much a process varies in
itself (its five).
"""

from __future__ import annotations

import statistics
import time

import torch


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)
        self.gn = torch.nn.GroupNorm(8, 256)
        self.act = torch.nn.LeakyReLU(0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.gn(self.fc(x)))
        return x + x


def main() -> None:
    torch.manual_seed(0)
    model = Model().eval()
    medians = []
    with torch.no_grad():
        for _ in range(200):
            model(torch.rand(128, 256))
        for _ in range(5):
            windows = []
            for _ in range(15):
                t0 = time.perf_counter()
                for _ in range(20):
                    model(torch.rand(128, 256))
                windows.append((time.perf_counter() - t0) / 20 * 1e3)
            medians.append(statistics.median(windows))
            time.sleep(0.1)
    print(" ".join(f"{m:.4f}" for m in medians))


if __name__ == "__main__":
    main()
