"""Two evaluations at once on one GPU, with the wait for an idle GPU on: neither may be blamed for the other's work.

Each of two threads evaluates built-in problems' own references as their submissions (A/A, honest by construction),
one after another, so that two evaluations share the GPU the whole time. Every result's verdict and marks are printed
with what its waits for an idle GPU saw; the exit status is 1 where any result is flagged leftover_gpu_work (or did
not pass). A result marked shared_gpu is the expected outcome where the other evaluation's work made a wait long.

    source scripts/device-env.sh && python3 scripts/shared_gpu_check.py   # on a CUDA host; about a minute on an H100
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.config import get_settings
from harness.evaluation.runner import EvalOptions, evaluate
from harness.problems import get_registry
from harness.schema import EvalResult
from harness.service.selfcheck import aa_submission


def _evaluate_all(problems: list[str], windows: int) -> list[tuple[str, EvalResult, float]]:
    registry, settings = get_registry(), get_settings()
    out = []
    for pid in problems:
        spec = registry.get(pid)
        t0 = time.monotonic()
        result = evaluate(spec, aa_submission(spec.source(), {}),
                          EvalOptions(device="cuda", compile_baseline="off", windows=windows), settings)
        out.append((pid, result, time.monotonic() - t0))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="*", help="problem ids (default: every built-in problem)")
    parser.add_argument("--windows", type=int, default=10, help="timed windows of each kind per evaluation")
    args = parser.parse_args()
    settings = get_settings()
    if not settings.gpu_idle_wait_s:
        print("HARNESS_GPU_IDLE_WAIT_S is 0: no wait for an idle GPU, nothing to check", file=sys.stderr)
        return 2
    problems = args.problems or [spec.id for spec in get_registry().all()]
    halves = [problems[0::2], problems[1::2]]
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = [row for rows in pool.map(lambda ps: _evaluate_all(ps, args.windows), halves) for row in rows]
    bad = 0
    for pid, r, seconds in done:
        obs = r.observations
        flags = [f.check for f in r.flags]
        own = max(obs.gpu_idle_waits_ms, default=0.0)
        shared = max(obs.gpu_shared_waits_ms, default=0.0)
        print(f"{pid:40s} {r.verdict.value:12s} flags={','.join(flags) or '-':24s} "
              f"speedup={r.speedup_vs_eager if r.speedup_vs_eager is not None else float('nan'):.3f} "
              f"waits={len(obs.gpu_idle_waits_ms) + len(obs.gpu_shared_waits_ms)} "
              f"own_max_ms={own:.3g} shared={len(obs.gpu_shared_waits_ms)} shared_max_ms={shared:.3g} "
              f"sharers={obs.gpu_sharers} unattributed={obs.gpu_unattributed!r} {seconds:.1f}s")
        if "leftover_gpu_work" in flags or r.verdict.value != "passed":
            bad += 1
            print(f"  {r.message}", file=sys.stderr)
    shared_any = sum(bool(r.observations.gpu_shared_waits_ms) for _, r, _ in done)
    print(f"{len(done)} evaluations, two at a time, in {time.monotonic() - t0:.1f} s; {shared_any} saw the other's "
          f"work in a long wait; {bad} flagged leftover_gpu_work or not passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
