#!/usr/bin/env python3
"""Whether processes that run the same code at the same moment on the same core run it at the same speed: several
processes of one launch-bound network, windows in a fresh random order each round, on the parent's clock. No harness.

    python3 benchmarks/process_speed_aa.py PROBLEM.py CALLS ROUNDS [--processes 4] [--core 5] [--no-aslr]
        [--ballast 2 [--state ballast|compiled|dynamo]]

Each process builds the problem's Model at its file's size on CUDA (the same seed) and runs CALLS forwards a window
when told, its thread kept to `--core`. Per process it prints the median window, and its medians over the first and
the second half of the rounds: a process that is slower in both halves, by more than the halves move, has a speed of
its own, which no number of rounds averages away. `--no-aslr` starts every process with address-space layout
randomization off (personality(ADDR_NO_RANDOMIZE), then exec), so each maps its code and heap where the others do.
`--ballast N` gives the first N processes what a trusted process holds beside its Model: the harness's trusted-side
modules imported, a float64 copy of the model run once, 16 GiB of device memory and two million Python objects
held; the others hold only their Model. Ballasted processes slower than the plain ones in both halves would make a
trusted process's state, not its role, the cause of an A/A's bias. `--state compiled` gives them instead what the
trusted side's torch.compile baseline leaves (the Model compiled and run once, the compiled module kept: its eager
windows still run the Model itself), and `--state dynamo` only torch._dynamo and torch._inductor imported.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import statistics as st
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

_NO_RANDOMIZE = 0x0040000


def built(path: str, core: int) -> tuple[Any, list[Any], Callable[[], None], str]:
    """This process kept to `core` on one torch thread, and the problem's Model at its file's size on CUDA (the same
    seed in every process), its inputs, the device's wait, and the device."""
    import importlib.util

    import torch

    os.sched_setaffinity(0, [core])
    torch.set_num_threads(1)  # one core for every process: a pool's workers would wait on each other
    spec = importlib.util.spec_from_file_location("problem", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: only to try the script where no GPU is
    model = module.Model(*module.get_init_inputs()).to(device)
    x = [t.to(device) if isinstance(t, torch.Tensor) else t for t in module.get_inputs()]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return model, x, sync, device


def worker(path: str, calls: int, core: int, state: str | None) -> None:
    """Build the model, warm it, then answer "run" on stdin with "done" on stdout after CALLS forwards."""
    import torch

    model, x, sync, device = built(path, core)
    held: list[object] = []
    if state == "compiled":
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(*x)
        held.append(compiled)
    elif state == "dynamo":
        import torch._dynamo
        import torch._inductor
    elif state == "ballast":
        import copy

        import harness.evaluation.trusted  # noqa: F401  (what the trusted process imports)

        truth = copy.deepcopy(model).double()
        with torch.no_grad():
            truth(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in x])
        held += [truth, [{"i": i} for i in range(2_000_000)]]
        if device == "cuda":
            held.append(torch.empty(16 << 30, dtype=torch.uint8, device=device))
    out = sys.stdout
    with torch.no_grad():
        for _ in range(10):
            model(*x)
        sync()
        out.write("ready\n")
        out.flush()
        for line in sys.stdin:
            if line.strip() != "run":
                return
            for _ in range(calls):
                model(*x)
            sync()
            out.write("done\n")
            out.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("calls", type=int)
    ap.add_argument("rounds", type=int)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--core", type=int, default=5)
    ap.add_argument("--no-aslr", action="store_true")
    ap.add_argument("--ballast", type=int, default=0)
    ap.add_argument("--state", choices=["ballast", "compiled", "dynamo"], default="ballast",
                    help="what the first --ballast processes hold beside their Model")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.problem, args.calls, args.core, args.state if args.ballast > 0 else None)
        return
    argv = [sys.executable, os.path.abspath(__file__), args.problem, str(args.calls), str(args.rounds),
            "--core", str(args.core), "--worker"]

    def layout_fixed() -> None:
        ctypes.CDLL(None, use_errno=True).personality(_NO_RANDOMIZE)

    held = ["--ballast", "1", "--state", args.state]
    procs = [subprocess.Popen(argv + (held if i < args.ballast else []), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, bufsize=1,
                              preexec_fn=layout_fixed if args.no_aslr else None) for i in range(args.processes)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    times: list[list[float]] = [[] for _ in procs]
    order = list(range(len(procs)))
    for _ in range(args.rounds):
        random.shuffle(order)
        for i in order:
            p = procs[i]
            assert p.stdin is not None and p.stdout is not None
            t0 = time.perf_counter()
            p.stdin.write("run\n")
            p.stdin.flush()
            p.stdout.readline()
            times[i].append((time.perf_counter() - t0) * 1e3)
    half = args.rounds // 2
    overall = [st.median(t) for t in times]
    base = min(overall)
    name = os.path.basename(args.problem)
    print(f"== {name} calls {args.calls} rounds {args.rounds} core {args.core} aslr {'off' if args.no_aslr else 'on'} "
          f"{args.state} on {args.ballast}")
    for i, t in enumerate(times):
        a, b = st.median(t[:half]), st.median(t[half:])
        print(f"  process {i}{f' ({args.state})' if i < args.ballast else ''}: median {overall[i]:7.2f} ms "
              f"({overall[i] / base:.3f} of the fastest); halves {a:7.2f} {b:7.2f}")
    print(f"  slowest over fastest: {max(overall) / base:.3f}", flush=True)
    if 0 < args.ballast < len(procs):  # each round's ballasted windows over its plain ones: the host's moves cancel
        paired = [st.mean(t[r] for t in times[:args.ballast]) / st.mean(t[r] for t in times[args.ballast:])
                  for r in range(args.rounds)]
        q = st.quantiles(paired, n=4)
        print(f"  {args.state} over plain, paired by round: median {st.median(paired):.3f}, interquartile "
              f"{q[0]:.3f}-{q[2]:.3f}", flush=True)
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("exit\n")
        p.stdin.flush()
        p.wait()


if __name__ == "__main__":
    main()
