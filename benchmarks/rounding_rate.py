#!/usr/bin/env python3
"""How often an honest submission's correctness trials have elements outside the tolerance of the fp32 reference
that are within it of the float64 truth: the trials that judging against the reference alone would have failed.

    python benchmarks/rounding_rate.py \
        level2/94=reference_solutions/tensor_cores/level2_94_gemm_biasadd_hardtanh_mish_groupnorm.py --repeats 20

Each PROBLEM=FILE is evaluated `--repeats` times through the whole pipeline's correctness phase (`runner.evaluate`
with timing off, the problem's default size, fresh inputs and parameters each time, one warm trusted process per
problem), its build made first. Prints a line per evaluation and, per file, the trials and evaluations that needed
the truth, and the worst element's error against the reference and against the truth.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import grading  # noqa: E402
from harness.config import get_settings  # noqa: E402
from harness.evaluation import prebuild, runner  # noqa: E402
from harness.evaluation.warm import TrustedPool  # noqa: E402
from harness.problems import get_registry  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pairs", nargs="+", help="PROBLEM=FILE")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="auto")
    ap.add_argument("--problems-dir", type=Path, help="a KernelBench-format folder beside the built-in problems")
    ap.add_argument("--json")
    args = ap.parse_args()
    settings = get_settings()
    registry = get_registry(args.problems_dir)
    jobs = [(registry.get(p), Path(f)) for p, f in (pair.split("=", 1) for pair in args.pairs)]
    target = prebuild.probe_device(args.device, settings)
    prebuild.precompile_all(sorted({path.read_text() for _, path in jobs}), target, settings)
    pool = TrustedPool(settings)
    options = runner.EvalOptions(device=args.device, size=args.size, target=target, trusted_pool=pool, timing=False,
                                 kernel_trace=False)
    rows = []
    try:
        for rep in range(args.repeats):
            for spec, path in jobs:
                result = runner.evaluate(spec, path.read_text(), options, settings)
                tol = result.tolerance
                trials = []
                for t in result.observations.trials:
                    for o in t.outputs:
                        trials.append({
                            "trial": t.trial, "inputs": t.inputs, "outside_reference": o.mismatches_at_eval_tolerance,
                            "within_truth_only": o.fp64_only_at_eval_tolerance, "max_rel_err": o.max_rel_err,
                            "max_rel_err_or_fp64": o.max_rel_err_or_fp64,
                            "reference_alone_passes": grading.within_reference_tolerance(o, tol)})
                needed = [t["trial"] for t in trials if not t["reference_alone_passes"]]
                rows.append({"problem": spec.kernelbench_id, "file": str(path), "repeat": rep,
                             "verdict": result.verdict.value, "needed_truth": needed, "trials": trials})
                worst = max((t["max_rel_err"] or 0) for t in trials)
                nearer = max((t["max_rel_err_or_fp64"] or 0) for t in trials)
                print(f"{spec.kernelbench_id} {path} #{rep}: {result.verdict.value}; trials outside the reference's "
                      f"tolerance {needed or 'none'}; max rel err {worst:.3g}, to the nearer {nearer:.3g}", flush=True)
    finally:
        pool.close()
    for spec, path in jobs:
        mine = [r for r in rows if r["file"] == str(path) and r["problem"] == spec.kernelbench_id]
        n_trials = sum(len(r["trials"]) for r in mine)
        needing = sum(len(r["needed_truth"]) for r in mine)
        failed_before = sum(bool(r["needed_truth"]) for r in mine)
        verdicts = sorted({r["verdict"] for r in mine})
        worst = max((t["max_rel_err"] or 0.0 for r in mine for t in r["trials"]), default=0.0)
        nearer = max((t["max_rel_err_or_fp64"] or 0.0 for r in mine for t in r["trials"]), default=0.0)
        print(f"{spec.kernelbench_id} {path}: {len(mine)} evaluations ({', '.join(verdicts)}); {needing} of "
              f"{n_trials} trials had elements outside the tolerance of the fp32 reference: {failed_before} "
              f"evaluations would have failed judged against the reference alone; the worst max rel err {worst:.3g} "
              f"against the reference, {nearer:.3g} against the nearer of reference and truth")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
