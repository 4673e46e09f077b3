#!/usr/bin/env python3
"""Timing fidelity of the harness on the reference solutions: evaluate each one N times through
`harness.evaluation.runner.evaluate` (the full isolated pipeline) and report the spread of its speedup.

    python benchmarks/reference_solutions_harness.py --repeats 5 --json $OUT/harness.json

All builds are warmed first, in parallel on the CPU (`precompile`), so the repeats time kernels,
not nvcc. Speedups are against eager only (torch.compile is timed by reference_solutions_gpu.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.config import get_settings  # noqa: E402
from harness.evaluation.prebuild import precompile, probe_device  # noqa: E402
from harness.evaluation.runner import EvalOptions, evaluate  # noqa: E402
from harness.problems import get_registry  # noqa: E402

SOLUTIONS = REPO / "reference_solutions"


def solution_for(kernelbench_id: str) -> Path:
    number = kernelbench_id.split("/")[1]
    (path,) = SOLUTIONS.glob(f"level2_{number}_*.py")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="*", help="KernelBench numbers (default: all six)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", default="default")
    parser.add_argument("--json", type=Path, help="write raw results here")
    args = parser.parse_args()
    settings = get_settings()
    specs = [s for s in get_registry().all() if not args.problems or s.kernelbench_id.split("/")[1] in args.problems]

    target = probe_device("cuda", settings)
    print(f"{target.device_name}, driver {target.driver_version}, torch {target.torch_version}, "
          f"CUDA {target.cuda_version}", flush=True)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        warmed = list(pool.map(lambda s: precompile(solution_for(s.kernelbench_id).read_text(), target, settings),
                               specs))
    print(f"precompiled {sum(w.ok for w in warmed)}/{len(specs)} in {time.monotonic() - t0:.0f} s", flush=True)

    rows = []
    for spec in specs:
        text = solution_for(spec.kernelbench_id).read_text()
        runs = []
        for i in range(args.repeats):
            r = evaluate(spec, text, EvalOptions(device="cuda", size=args.size, compile_baseline="off"), settings)
            o = r.observations
            runs.append({
                "verdict": r.verdict.value, "message": r.message, "speedup_vs_eager": r.speedup_vs_eager,
                "candidate_ms": o.candidate_timing.median_ms if o.candidate_timing else None,
                "eager_ms": o.eager_timing.median_ms if o.eager_timing else None,
                "max_abs_err": max((x.max_abs_err or 0.0 for t in o.trials for x in t.outputs), default=None),
                "wall_s": r.provenance.wall_s if r.provenance else None,
            })
            print(f"{spec.kernelbench_id} run {i}: {r.verdict.value} {r.message}", flush=True)
        speedups = [x["speedup_vs_eager"] for x in runs if x["speedup_vs_eager"]]
        rows.append({
            "problem": spec.kernelbench_id, "id": spec.id, "runs": runs,
            "all_passed": all(x["verdict"] == "passed" for x in runs),
            "speedup_median": statistics.median(speedups) if speedups else None,
            "speedup_spread": (max(speedups) / min(speedups) - 1) if speedups else None,
            "candidate_ms_median": statistics.median(x["candidate_ms"] for x in runs if x["candidate_ms"])
            if speedups else None,
        })
    print(f"\n{'problem':<10} {'passed':<7} {'solution ms':>11} {'speedup':>8} {'spread':>7}")
    for row in rows:
        sp = row["speedup_spread"]
        print(f"{row['problem']:<10} {row['all_passed']!s:<7} {row['candidate_ms_median'] or 0:>11.4f} "
              f"{row['speedup_median'] or 0:>8.3f} {(sp or 0) * 100:>6.2f}%")
    if args.json:
        args.json.write_text(json.dumps({"device": target.model_dump(mode="json"), "rows": rows}, indent=2))
    return 0 if all(r["all_passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
