#!/usr/bin/env python3
"""How fast the host's speed changes under a launch-bound network: one process's calls, one after another, timed one
by one; then what an A/A of windows cut from that one timeline would measure, by window length. No harness.

    python3 benchmarks/call_timeline.py PROBLEM.py [--seconds 15] [--core 15] [--spinner 0] [--json OUT]

The process builds the problem's Model at its file's size on CUDA, keeps its thread to `--core`, and runs forwards
for `--seconds` in each of three phases: nothing beside it, a process spinning on `--spinner` beside it (a plain
`while True: pass`), nothing again. Each call's time is the CPU's (perf_counter around the call; a launch-bound call's
launches take as long as the call) with the GPU synchronized every 50 calls.

Windows cut from one process's timeline hold no difference of process, so whatever an A/A of them shows is the host's
drift alone. For window lengths of 1 to 64 calls, consecutive windows are paired (A, B, A, B, ...) and grouped 12
pairs at a time, as the harness's rounds are; per group, the ratio of the medians of A and B (the harness's figure)
and the median of the pairs' ratios. Printed per length: the groups whose figure is more than 3% from 1, and the
spread (interquartile range over median) of the windows. Where short windows pass and long ones do not, the drift is
slower than a short window and a paired figure of short windows cancels it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics as st
import subprocess
import sys
import time

from process_speed_aa import built  # benchmarks/, beside this script

WINDOWS = (1, 2, 4, 8, 16, 32, 64)
GROUP = 12


def _steal() -> int:
    """The host's steal ticks over every CPU, as this guest's /proc/stat counts them (0 where there is none)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


def timeline(model, x, seconds: float, sync) -> tuple[list[float], int]:
    import torch

    calls: list[float] = []
    steal0 = _steal()
    end = time.perf_counter() + seconds
    with torch.no_grad():
        while time.perf_counter() < end:
            for _ in range(50):
                t0 = time.perf_counter()
                model(*x)
                calls.append((time.perf_counter() - t0) * 1e3)
            sync()
    return calls, _steal() - steal0


def _iqr_over_median(v: list[float]) -> float:
    if len(v) < 2:
        return 0.0
    q = st.quantiles(v, n=4, method="inclusive")
    return (q[2] - q[0]) / st.median(v)


def aa_of(calls: list[float]) -> list[dict[str, float]]:
    """Per window length: the share of 12-pair groups off by more than 3%, by each figure; the windows' spread."""
    rows = []
    for w in WINDOWS:
        wins = [sum(calls[i:i + w]) for i in range(0, len(calls) - w + 1, w)]
        pairs = list(zip(wins[0::2], wins[1::2], strict=False))
        groups = [pairs[i:i + GROUP] for i in range(0, len(pairs) - GROUP + 1, GROUP)]
        if not groups:
            continue
        of_medians = [st.median(b for _, b in g) / st.median(a for a, _ in g) for g in groups]
        paired = [math.exp(st.median(math.log(b / a) for a, b in g)) for g in groups]
        rows.append({"calls": w, "groups": len(groups),
                     "off_3pct_ratio_of_medians": sum(abs(r - 1) > 0.03 for r in of_medians) / len(groups),
                     "off_3pct_paired": sum(abs(r - 1) > 0.03 for r in paired) / len(groups),
                     "worst_ratio_of_medians": max(of_medians, key=lambda r: abs(r - 1)),
                     "worst_paired": max(paired, key=lambda r: abs(r - 1)),
                     "window_spread": st.median(_iqr_over_median(wins[i:i + 2 * GROUP])
                                                for i in range(0, len(wins) - 2 * GROUP + 1, 2 * GROUP))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--core", type=int, default=15)
    ap.add_argument("--spinner", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    model, x, sync, _ = built(args.problem, args.core)
    with torch.no_grad():
        for _ in range(20):
            model(*x)
    sync()
    report = {"problem": args.problem, "core": args.core, "spinner_core": args.spinner, "phases": []}
    for phase in ("idle", "spinner", "idle again"):
        spinner = None
        if phase == "spinner":
            spinner = subprocess.Popen(["taskset", "-c", str(args.spinner), sys.executable, "-S", "-c",
                                        "while True: pass"])
            time.sleep(0.2)
        try:
            calls, steal = timeline(model, x, args.seconds, sync)
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
        tenths = [st.median(calls[i:i + 10]) for i in range(0, len(calls) - 9, 10)]
        aa = aa_of(calls)
        report["phases"].append({"phase": phase, "calls": len(calls), "median_ms": st.median(calls),
                                 "p10_ms": st.quantiles(calls, n=10)[0], "p90_ms": st.quantiles(calls, n=10)[-1],
                                 "steal_ticks": steal, "aa": aa, "call_ms": [round(c, 4) for c in calls[:20000]]})
        print(f"{os.path.basename(args.problem)} {phase}: {len(calls)} calls, median {st.median(calls):.3f} ms "
              f"(p10 {st.quantiles(calls, n=10)[0]:.3f}, p90 {st.quantiles(calls, n=10)[-1]:.3f}), steal {steal}")
        step = max(1, len(tenths) // 40)
        print(f"  medians of 10 calls, every {step * 10}th call: " + " ".join(f"{t:.3g}" for t in tenths[::step]))
        for r in aa:
            print(f"  {r['calls']:3d} calls a window, {r['groups']:3d} groups: off >3% "
                  f"{r['off_3pct_ratio_of_medians']:.0%} (ratio of medians, worst "
                  f"{r['worst_ratio_of_medians']:.3f}) {r['off_3pct_paired']:.0%} (paired, worst "
                  f"{r['worst_paired']:.3f}); windows spread {r['window_spread']:.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main()
