#!/usr/bin/env python3
"""Two processes time the same launch-bound network against each other (an A/A), in alternating windows on the
parent's clock, with their launching threads on two cores, on one core, and where the system puts them.

    python3 benchmarks/window_core_aa.py PROBLEM.py CALLS ROUNDS      # e.g. level3/15_DenseNet121.py 6 24

Each process builds the problem's Model at its file's size on CUDA (the same seed) and runs CALLS forwards a window
when told; the parent alternates which goes first each round. Per placement it prints both medians, their ratio,
the median of the rounds' paired ratios and its spread (interquartile range over median). Only torch and the problem
file are used: nothing of the harness's processes. Settings.timing_core is what came of it (rounds.RoundsPlan.core).
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import statistics as st
import sys
import time
from typing import Any

# Where each pair of processes' window threads run, in order: two cores, one core, the system's choice, again.
PLACEMENTS = (("different cores", ({2}, {9})), ("same core", ({5}, {5})), ("unpinned", (None, None)),
              ("same core again", ({11}, {11})), ("different again", ({4}, {13})))


def worker(path: str, conn: Any) -> None:
    """Build the problem's model on CUDA, then answer the parent: pin to cores, run a window of calls, or exit."""
    import torch

    spec = importlib.util.spec_from_file_location("problem", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs()).cuda().eval()
    x = [t.cuda() if isinstance(t, torch.Tensor) else t for t in module.get_inputs()]
    own = os.sched_getaffinity(0)
    with torch.no_grad():
        for _ in range(5):
            model(*x)
        torch.cuda.synchronize()
        conn.send("ready")
        while True:
            cmd = conn.recv()
            if cmd[0] == "exit":
                return
            if cmd[0] == "pin":
                os.sched_setaffinity(0, cmd[1] if cmd[1] is not None else own)
                conn.send("ok")
                continue
            for _ in range(cmd[1]):
                model(*x)
            torch.cuda.synchronize()
            conn.send("done")


def spread(values: list[float]) -> float:
    q = st.quantiles(values, n=4)
    return (q[2] - q[0]) / st.median(values)


def main() -> None:
    path, calls, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=worker, args=(path, child)) for _, child in pipes]
    for p in procs:
        p.start()
    for parent, _ in pipes:
        assert parent.recv() == "ready"

    def window(i: int) -> float:
        t0 = time.perf_counter()
        pipes[i][0].send(("run", calls))
        pipes[i][0].recv()
        return (time.perf_counter() - t0) * 1e3

    for name, pins in PLACEMENTS:
        for (parent, _), cores in zip(pipes, pins, strict=True):
            parent.send(("pin", cores))
            parent.recv()
        a: list[float] = []
        b: list[float] = []
        for r in range(rounds):
            got = {i: window(i) for i in ((0, 1) if r % 2 == 0 else (1, 0))}
            a.append(got[0])
            b.append(got[1])
        paired = [y / x for x, y in zip(a, b, strict=True)]
        print(f"{name:16s} A med {st.median(a):7.2f} B med {st.median(b):7.2f} ratio-of-medians "
              f"{st.median(b) / st.median(a):.3f} paired median {st.median(paired):.3f} paired IQR/med "
              f"{spread(paired):.3f} A spread {spread(a):.3f}", flush=True)
    for parent, _ in pipes:
        parent.send(("exit",))
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()
