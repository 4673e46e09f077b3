#!/usr/bin/env python3
"""A/A runs re-graded from their stored windows by a second rule, beside the rule that ranks: no evaluation runs.

    python benchmarks/aa_paired_regrade.py docs/results/cpu-aa-vm-e142e9e-sign-draws.json
    python benchmarks/aa_paired_regrade.py --per-row 0.03 REPORT.json   # each row: spreads, rounds for +-3%

Reads timing_fidelity.py's JSON, or a selfcheck report (`harness selfcheck --json`: rows with their windows). The
rule that ranks is the paired one (windows.paired_ratio): each round's own ratio (eager's window and the
candidate's of that round: the same seeds, moments apart, each net of the median empty window and the candidate's
with its charge), the median over rounds, marked where the ratios' logs spread over 10% (grading.SPREAD_LIMIT).
Beside it, the rule that ranked before: the ratio of two medians, each kind's over its own windows, marked where
either kind's windows spread over 10%. Reports made before paired speedups are re-graded by both from their
windows. Where the noise is the host's and common to both windows of a round, the paired rule cancels it; where
each process runs at a speed of its own, it does not.

`--per-row AIM` prints each run instead: each kind's spread and the paired ratios' (of the times a call), the rounds
that each rule needs for its ratio to be known to +-AIM (95%, by the harness's formula, windows.halfwidth; the
former rule's spread the two kinds' in quadrature), and both ratios, the ratio of medians here taken over the times
a call as re-graded.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.evaluation import windows

SPREAD_LIMIT = 0.10
NEAR = 0.05


def _spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return (q[2] - q[0]) / statistics.median(values)


def _per_call(t: dict) -> list[float]:
    calls = t["calls_per_window"]
    empty = (t.get("overhead_ms") or 0.0) * calls
    charges = t.get("charged_ms") or [0.0] * len(t["windows_ms"])
    return [(max(w - empty, 0.0) + c) / calls for w, c in zip(t["windows_ms"], charges, strict=True)]


def _runs(report: dict) -> list[tuple[str, dict, dict]]:
    """(problem, candidate's timing, eager's) of each run: timing_fidelity.py's, or a selfcheck report's rows, whose
    windows and clocks make the same figures."""
    if "runs" in report:
        return [(problem, run["timings"].get("candidate"), run["timings"].get("eager"))
                for problem, runs in report["runs"].items() for run in runs]
    out = []
    for row in report["rows"]:
        timing = {kind: {**row["clocks"][kind], **row["windows"][kind]}
                  for kind in ("candidate", "eager") if kind in row.get("windows", {}) and kind in row["clocks"]}
        out.append((row["problem"], timing.get("candidate"), timing.get("eager")))
    return out


def rows(path: Path) -> list[dict]:
    out = []
    for problem, cand, eager in _runs(json.loads(path.read_text())):
        if not cand or not eager or not cand.get("windows_ms"):
            continue
        if cand["median_ms"] <= 0:  # a time lost in the empty windows' noise: no ratio to grade
            continue
        paired, logs_spread = windows.paired_ratio(_per_call(eager), _per_call(cand))
        out.append({"problem": problem, "medians": eager["median_ms"] / cand["median_ms"],
                    "medians_marked": max(cand["spread"], eager["spread"]) > SPREAD_LIMIT,
                    "paired": paired, "paired_marked": logs_spread > SPREAD_LIMIT})
    return out


def rounds_for(spread: float, aim: float, most: int = 100_000) -> int:
    """The fewest rounds n at which a median of this spread is known to `aim` (windows.halfwidth)."""
    n = 2
    while n < most and windows.halfwidth(spread, n) > aim:
        n += 1
    return n


def per_row(path: Path, aim: float) -> None:
    print(f"| {path.name} | rounds | spread C / E | paired | rounds for {aim:.0%}: paired / medians | "
          "ratio of medians | paired median |")
    print("|---|---|---|---|---|---|---|")
    for problem, cand, eager in _runs(json.loads(path.read_text())):
        if not cand or not eager or not cand.get("windows_ms"):
            continue
        c, e = _per_call(cand), _per_call(eager)
        if statistics.median(c) <= 0:
            continue
        paired, sp = windows.paired_ratio(e, c)
        sc, se = _spread(c), _spread(e)
        print(f"| {problem} | {len(c)} | {sc:.1%} / {se:.1%} | {sp:.1%} | {rounds_for(sp, aim)} / "
              f"{rounds_for(math.hypot(sc, se), aim)} | {statistics.median(e) / statistics.median(c):.3f}x | "
              f"{paired:.3f}x |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--per-row", type=float, default=None, metavar="AIM",
                        help="each run's spreads and the rounds each rule needs for +-AIM (0.03: 3%%)")
    args = parser.parse_args()
    if args.per_row is not None:
        for path in args.files:
            per_row(path, args.per_row)
        return 0
    print("| file | rule | runs | median | worst | within 5% | marked | within 5% and unmarked |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args.files:
        got = rows(path)
        if not got:
            print(f"| {path.name} | - | 0 | no run with windows and a time above zero | | | | |")
            continue
        for rule in ("medians", "paired"):
            values = [r[rule] for r in got]
            near = [abs(v - 1) <= NEAR for v in values]
            marked = [r[f"{rule}_marked"] for r in got]
            worst = max(values, key=lambda v: abs(v - 1))
            print(f"| {path.name} | {rule} | {len(got)} | {statistics.median(values):.3f}x | {worst:.3f}x | "
                  f"{sum(near)} | {sum(marked)} | {sum(n and not m for n, m in zip(near, marked, strict=True))} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
