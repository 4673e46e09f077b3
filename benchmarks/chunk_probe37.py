#!/usr/bin/env python3
"""Probe for level2/37 (M=32768, N=4096, K=1024): does running the GEMM and the fused epilogue in row
chunks small enough for the epilogue to find its chunk in L2 beat GEMM-then-epilogue over the whole
output (which must stream 2 x 537 MB through DRAM: a 0.36 ms floor, 6.5% of the GEMM)?

    python benchmarks/chunk_probe37.py [--chunks 512 1024 2048 4096] [--calls 30]

Prints median ms (CUDA events, 256 MB L2 flush before each call) of: the bare addmm, the addmm in
chunks alone, the shipped solution, and the chunked solution per chunk size, with the max abs error
of each chunked variant against the reference Model.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def timed(fn, calls: int) -> float:
    flush = torch.empty(64 * 1024 * 1024, dtype=torch.float32, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        samples.append(s.elapsed_time(e))
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, nargs="*", default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    from harness.problems import get_registry

    spec = get_registry().get("level2/37")
    ref_mod = load(spec.source_path, "ref37")
    sol = load(next((REPO / "reference_solutions").glob("level2_37_*.py")), "sol37")
    torch.manual_seed(0)
    init = ref_mod.get_init_inputs()
    ref = ref_mod.Model(*init).cuda()
    new = sol.ModelNew(*init).cuda()
    new.load_state_dict(ref.state_dict())
    x = torch.rand(32768, 1024, device="cuda")
    W, b = new.matmul.weight, new.matmul.bias
    gn = new.group_norm
    M = x.shape[0]
    y = torch.empty(M, W.shape[0], device="cuda")

    def chunked(ch: int, epilogue: bool = True):
        def run():
            for i in range(0, M, ch):
                yi = y[i:i + ch]
                torch.addmm(b, x[i:i + ch], W.t(), out=yi)
                if epilogue:
                    sol._ext.fused_epilogue(yi, gn.weight, gn.bias, new.bias, gn.num_groups, gn.eps)
            return y
        return run

    with torch.no_grad():
        expect = ref(x)
        print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
        print(f"addmm full        {timed(lambda: torch.addmm(b, x, W.t()), args.calls):.4f} ms")
        print(f"solution          {timed(lambda: new(x), args.calls):.4f} ms  "
              f"err {float((new(x) - expect).abs().max()):.2e}")
        for ch in args.chunks:
            t_g = timed(chunked(ch, False), args.calls)
            t_s = timed(chunked(ch), args.calls)
            err = float((chunked(ch)() - expect).abs().max())
            print(f"chunk {ch:>5}: addmm {t_g:.4f} ms  addmm+epilogue {t_s:.4f} ms  err {err:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
