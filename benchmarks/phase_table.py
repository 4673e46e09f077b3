#!/usr/bin/env python3
"""Where an evaluation's wall time goes: `observations.phases` of a few evaluations, one after another.

    python benchmarks/phase_table.py level2/75=reference_solutions/level2_75_gemm_groupnorm_min_biasadd.py \
        level2/75=tests/fixtures/submissions/l75_pytorch_correct.py --repeats 2 --json phases.json

Each PROBLEM=FILE is evaluated through the whole pipeline (`runner.evaluate`, every check and the timing
protocol, the problem's default size on CUDA), `--repeats` times, interleaved. With `--warm`, the evaluations
share one `TrustedPool`, as a worker's slot does (its trusted process stays warm between evaluations of one
problem), instead of starting a trusted process each; with `--ahead` too, the next evaluations' candidate
processes (`prestart_depth` of them) are started before each evaluation (`starts.prestart`), as a worker's GPU slot
does (each evaluation's source then carries a comment line of its own: a worker starts nothing ahead for the very
source it is evaluating, whose build dir that evaluation holds; `--prebuild` builds them all first, as a worker's
compile pool would).
`--vary` takes a setting's values in turn. Prints one row per evaluation and the median of each phase, and of each
step of the trusted side's commands on its own clock (`observations.trusted_seconds`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.config import get_settings  # noqa: E402
from harness.evaluation import prebuild, runner, starts  # noqa: E402
from harness.evaluation.warm import TrustedPool  # noqa: E402
from harness.problems import get_registry  # noqa: E402


def _summary(rows: list[dict], label: str) -> None:
    """Median seconds per phase and per trusted step over `rows` (the first, cold, included), and the A/A range."""
    names = sorted({k for r in rows for k in r["phases"]})
    print(f"\nmedian seconds per phase over {len(rows)} evaluations{label}:")
    for k in sorted(names, key=lambda n: -statistics.median(r["phases"].get(n, 0.0) for r in rows)):
        print(f"  {k:22s} {statistics.median(r['phases'].get(k, 0.0) for r in rows):7.3f}")
    print(f"  {'wall':22s} {statistics.median(r['wall_s'] for r in rows):7.3f}")
    steps = sorted({k for r in rows for k in r["trusted_seconds"]})
    print("median seconds per step of the trusted side's commands (its own clock):")
    for k in steps:
        print(f"  {k:22s} {statistics.median(r['trusted_seconds'].get(k, 0.0) for r in rows):7.3f}")
    eager = [r["speedup_vs_eager"] for r in rows if r["speedup_vs_eager"] is not None]
    if eager:
        print(f"speedup vs eager: {min(eager):.4f}-{max(eager):.4f}, median {statistics.median(eager):.4f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pairs", nargs="+", help="PROBLEM=FILE")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="auto")
    ap.add_argument("--warm", action="store_true", help="one TrustedPool for all, as a worker's slot")
    ap.add_argument("--ahead", action="store_true", help="with --warm: start each next candidate's process ahead")
    ap.add_argument("--windows", default="",
                    help="rounds of timed windows, a comma list taken in turn (side by side); default: the settings'")
    ap.add_argument("--vary", default="", metavar="FIELD=V1,V2",
                    help="a setting (a Settings field, e.g. gpu_idle_wait_s=10,0 or prestart_candidates=on,off), "
                         "its values taken in turn (side by side); default: the settings'")
    ap.add_argument("--prebuild", action="store_true",
                    help="build every evaluation's source first, in parallel and untimed, as a worker's compile pool "
                         "does: the evaluations then measure cached builds")
    ap.add_argument("--json")
    args = ap.parse_args()
    rounds = [int(w) for w in args.windows.split(",") if w.strip()] or [None]
    settings = get_settings()
    field, _, values = args.vary.partition("=")
    if field and field not in type(settings).model_fields:
        ap.error(f"--vary: {field!r} is not a setting (harness/config.py)")
    varied = [type(settings)(**{**settings.model_dump(), field: v}) for v in values.split(",")] if field else [None]
    variants = [(w, i) for w in rounds for i in range(len(varied))]
    registry = get_registry()
    jobs = [(registry.get(p), Path(f)) for p, f in (pair.split("=", 1) for pair in args.pairs)]
    target = prebuild.probe_device(args.device, settings)
    pool = TrustedPool(settings) if args.warm else None
    rows = []
    ahead: set[int] = set()  # the evaluations whose candidates were started ahead
    order = [(rep, spec, path, w, v) for rep in range(args.repeats) for spec, path in jobs for w, v in variants]
    texts = [path.read_text() + (f"\n# evaluation {i}\n" if args.ahead else "")
             for i, (_, _, path, _, _) in enumerate(order)]
    options = [runner.EvalOptions(device=args.device, size=args.size, target=target, trusted_pool=pool, windows=w)
               for _, _, _, w, _ in order]
    chosen = [varied[v] or settings for _, _, _, _, v in order]
    if args.prebuild:
        t0 = time.monotonic()
        built = prebuild.precompile_all(sorted(set(texts)), target, settings)
        print(f"built {sum(b.ok for b in built)} of {len(built)} sources in {time.monotonic() - t0:.1f} s", flush=True)
    try:
        for i, (rep, spec, path, w, v) in enumerate(order):
            value = f"{field} {values.split(',')[v]}" if field else ""
            # As a worker's slot does: the next `prestart_depth` evaluations' candidates started before this one (with
            # one only, a short evaluation after a long one waited for its candidate's import, and walls side by side
            # misled).
            for j in range(i + 1, min(i + 1 + settings.prestart_depth, len(order))) if args.ahead and pool else ():
                if j not in ahead:
                    starts.prestart(order[j][1], texts[j], options[j], chosen[j])
                    ahead.add(j)
            t0 = time.monotonic()
            result = runner.evaluate(spec, texts[i], options[i], chosen[i])
            wall = time.monotonic() - t0
            row = {"problem": spec.kernelbench_id, "file": path.name, "repeat": rep, "rounds": w, "variant": value,
                   "wall_s": round(wall, 3),
                   "verdict": result.verdict.value, "flags": [f.check for f in result.flags],
                   "warm": result.observations.trusted_warm, "import_s": result.observations.candidate_import_s,
                   "trusted_seconds": result.observations.trusted_seconds,
                   "speedup_vs_eager": result.speedup_vs_eager, "speedup_vs_compile": result.speedup_vs_compile,
                   "phases": result.observations.phases, "windows": result.observations.window_costs()}
            rows.append(row)
            top = sorted(row["phases"].items(), key=lambda kv: -kv[1])[:6]
            print(f"{spec.kernelbench_id} {path.name} #{rep} rounds {w or 'default'} {value}: {wall:.1f} s "
                  f"{row['verdict']} "
                  f"{row['flags']} eager {row['speedup_vs_eager']} compile {row['speedup_vs_compile']} :: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in top) + f" :: {row['windows']}", flush=True)
    finally:
        if pool is not None:
            pool.close()
    for w, v in variants:
        value = f"{field} {values.split(',')[v]}" if field else ""
        label = (f" with {w} rounds of windows" if w else "") + (f", {value}" if value else "")
        _summary([r for r in rows if r["rounds"] == w and r["variant"] == value], label)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
