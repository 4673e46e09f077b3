"""The judge's element-by-element comparison on a GPU: the figures of one output compared a small slice at a time
(as where the float64 truth lives on the host) against the same compared in large slices, and each one's time.

    python3 scripts/compare_slices_check.py [--elements N] [--device cuda|cpu]

Exits 1 where a figure differs (sums of squares may differ in the last bits)."""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from harness.evaluation import compare
from harness.evaluation.memory_plan import SMALL_COMPARE_SLICE


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=100_000_000)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    g = torch.Generator(device=device).manual_seed(0)
    exp = torch.rand(args.elements, device=device, generator=g)
    got = exp + 1e-5 * torch.randn(args.elements, device=device, generator=g)
    got[5], got[7] = float("nan"), float("inf")
    truth = exp.double() + 1e-7
    figures = {}
    for slice_elems in (compare.COMPARE_SLICE, SMALL_COMPARE_SLICE):
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        figures[slice_elems] = compare.figures(got, exp, truth, device, 1e-4, 1e-4, slice_elems)
        sync()
        print(f"slices of {slice_elems} elements: {time.perf_counter() - t0:.3f} s")
    whole, small = figures[compare.COMPARE_SLICE], figures[SMALL_COMPARE_SLICE]
    differ = [k for k in whole if not (small[k] == whole[k] or (
        isinstance(whole[k], float) and "l2" in k and math.isclose(small[k], whole[k], rel_tol=1e-9)))]
    print("figures differ:", {k: (small[k], whole[k]) for k in differ} if differ else "none")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
