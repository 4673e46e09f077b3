#!/usr/bin/env python3
"""Timing fidelity on the parent's clock: A/A runs and the reference solutions against the profiler.

    python benchmarks/timing_fidelity.py --repeats 5 --json $OUT/fidelity.json            # A/A, six problems
    python benchmarks/timing_fidelity.py --solutions --repeats 3 --json $OUT/solutions.json
    python benchmarks/timing_fidelity.py --repeats 5 --json aa.json --resume   # add the repeats aa.json lacks
    python benchmarks/timing_fidelity.py --device cpu --repeats 3               # A/A on the CPU, small sizes

A/A: each problem's reference, renamed ModelNew, evaluated against itself through the whole pipeline
(`harness.evaluation.runner.evaluate`) at its default size; its speedup vs eager should be 1.00x. The repeats
interleave the problems (75, 62, ..., 75, 62, ...), so drift spreads over all of them. Beside each time, what its
windows alone gave (before what each window's fingerprints took beyond the trusted side's was charged to it): for an
honest submission the charge should be about nothing.
--solutions: the reference solutions instead, each also profiled in this process (CUPTI: the sum of its
kernels' device time per call; the L2 flush before each call is profiled alone and taken off), so the harness's time per
call can be set against the kernels' own.
Speedups are vs eager (torch.compile off: it adds compile time and is not what fidelity is about); the kernel
trace is skipped (7 s of profiler start-up an evaluation, and no part of the timing).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import artifacts  # noqa: E402
from harness.config import get_settings  # noqa: E402
from harness.evaluation.prebuild import build_inputs, precompile, probe_device  # noqa: E402
from harness.evaluation.runner import EvalOptions, evaluate  # noqa: E402
from harness.problems import get_registry  # noqa: E402
from harness.service.selfcheck import current_commit  # noqa: E402
from harness.submission import extract  # noqa: E402

SOLUTIONS = REPO / "reference_solutions"


def solution_for(kernelbench_id: str) -> Path:
    (path,) = SOLUTIONS.glob(f"level2_{kernelbench_id.split('/')[1]}_*.py")
    return path


def profiled_kernel_ms(path: Path, spec, target, settings, calls: int = 20) -> float:
    """The solution's kernels' device time per call (CUPTI), in this process, at the problem's default size.
    Its extension is loaded from the build its evaluations used (the harness's build cache), not built again."""

    import torch
    from torch.profiler import ProfilerActivity, profile

    from harness.evaluation import problem_module
    from harness.evaluation.protocol import ProblemLoad

    problem = problem_module.load_problem(ProblemLoad(path=spec.source_path, overrides=spec.size("default").overrides),
                                          module_name=f"_fidelity_{spec.kernelbench_id.replace('/', '_')}")
    key = artifacts.build_key(extract(path.read_text()).source, **build_inputs(target))
    os.environ["TORCH_EXTENSIONS_DIR"] = str(artifacts.build_dir(settings, key))
    if target.compute_capability:
        os.environ["TORCH_CUDA_ARCH_LIST"] = target.compute_capability
    module_spec = importlib.util.spec_from_file_location(f"_solution_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    device = torch.device("cuda")
    model = module.ModelNew(*problem.get_init_inputs()).to(device)
    flush = torch.empty(256 << 18, dtype=torch.float32, device=device)
    inputs = [problem_module.seeded_inputs(problem, i, device) for i in range(calls)]
    def device_ms(call) -> float:
        """Device time of the CUDA kernels of `calls` rounds of: flush, call, sync."""
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for x in inputs:
                flush.zero_()
                call(x)
                torch.cuda.synchronize()
        return sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3

    with torch.no_grad():
        for x in inputs[:3]:
            model(*x)
        torch.cuda.synchronize()
        # The flush's own kernels, profiled the same way without the call, are taken off.
        return (device_ms(lambda x: model(*x)) - device_ms(lambda x: None)) / calls


# Each kind's figures in a row: the parent's, then what each process's own clocks said (diagnostics: CUDA events
# per call, round trip per window, input making per call).
FIGURES = {"ms": "median_ms", "spread": "spread", "device_ms": "device_median_ms", "round_trip_ms": "round_trip_ms",
           "inputs_ms": "inputs_median_ms", "windows_alone_ms": "windows_alone_median_ms"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="*", help="KernelBench numbers (default: all six built-ins)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--solutions", action="store_true", help="the reference solutions, not A/A")
    parser.add_argument("--json", type=Path, help="write raw results here (rewritten after each evaluation)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the evaluations already in --json and run only the repeats it lacks")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: A/A at each problem's small size (no profiler, no solutions)")
    parser.add_argument("--quiet-host-s", type=float, default=0.0, metavar="S",
                        help="before each evaluation, wait (up to 10 s) until no other task has been runnable for S "
                             "seconds (/proc/stat procs_running): on a shared host, an A/A timed beside others' work "
                             "says more about their work than about the harness")
    args = parser.parse_args()
    if args.resume and not args.json:
        parser.error("--resume needs --json")
    if args.solutions and args.device != "cuda":
        parser.error("--solutions needs --device cuda")
    settings = get_settings()
    specs = [s for s in get_registry().all() if not args.problems or s.kernelbench_id.split("/")[1] in args.problems]
    target = probe_device(args.device, settings)
    print(f"{target.device_name}, driver {target.driver_version}, torch {target.torch_version}, "
          f"CUDA {target.cuda_version}", flush=True)
    texts = {s.id: solution_for(s.kernelbench_id).read_text() if args.solutions
             else s.source().replace("class Model(", "class ModelNew(") for s in specs}
    if args.solutions:
        for s in specs:
            precompile(texts[s.id], target, settings)
    runs: dict[str, list[dict]] = {s.id: [] for s in specs}
    if args.resume and args.json.exists():
        kept = json.loads(args.json.read_text())["runs"]
        runs.update({k: v for k, v in kept.items() if k in runs})
    t0 = time.monotonic()
    for i in range(args.repeats):
        for s in specs:
            if len(runs[s.id]) > i:
                continue
            size = "small" if args.device == "cpu" and "small" in s.sizes else "default"
            waited_s = wait_for_quiet_host(args.quiet_host_s) if args.quiet_host_s else 0.0
            load_before = os.getloadavg()[0]
            r = evaluate(s, texts[s.id], EvalOptions(device=args.device, size=size, compile_baseline="off",
                                                     target=target, kernel_trace=False), settings)
            o = r.observations
            row = {"verdict": r.verdict.value, "flags": [f.check for f in r.flags], "speedup": r.speedup_vs_eager,
                   "calls_per_window": o.candidate_timing.calls_per_window if o.candidate_timing else None,
                   "overhead_ms": o.eager_timing.overhead_ms if o.eager_timing else None,
                   "timings": {k: t.model_dump(mode="json") if t else None for k, t in
                               (("candidate", o.candidate_timing), ("eager", o.eager_timing))},
                   "wall_s": r.provenance.wall_s if r.provenance else None, "phases": o.phases,
                   # The host's load around the evaluation (1-minute averages): others' work on the same cores.
                   "load_before": load_before, "load_after": os.getloadavg()[0], "waited_for_quiet_s": waited_s,
                   "commit": current_commit(),
                   # Where the rounds ran: the core both sides' window threads were kept to, whether the candidate
                   # was held there (the CPU's one-core timing), and the core kept busy beside it.
                   "timing_core": o.timing_core, "timing_core_held": o.timing_core_held, "busy_core": o.busy_core,
                   "timing_core_refused": o.timing_core_refused,
                   # Each timed window's fingerprint figures, in round order: what the charges were made of
                   # (windows.fingerprint_charges), so that another rule can be tried on the same windows.
                   "fingerprints": o.timed_outputs.model_dump(include={
                       "fingerprint_ms", "fingerprint_latency_ms", "reference_fingerprint_ms",
                       "reference_fingerprint_own_ms", "handover_slack_ms"}) if o.timed_outputs else None,
                   "message": r.message[:300]}
            for kind, t in (("candidate", o.candidate_timing), ("eager", o.eager_timing)):
                row.update({f"{kind}_{key}": getattr(t, figure) if t else None for key, figure in FIGURES.items()})
            runs[s.id].append(row)
            print(f"[{i + 1}/{args.repeats}] {s.kernelbench_id} {row['verdict']} {row['flags']} "
                  f"speedup {row['speedup'] or 0:.4f} cand {row['candidate_ms'] or 0:.4f} ms eager "
                  f"{row['eager_ms'] or 0:.4f} ms (window spread {row['candidate_spread'] or 0:.2%} / "
                  f"{row['eager_spread'] or 0:.2%}) wall {row['wall_s'] or 0:.1f} s; own clocks: device "
                  f"{row['candidate_device_ms'] or 0:.4f} / {row['eager_device_ms'] or 0:.4f} ms, round trip "
                  f"{row['candidate_round_trip_ms'] or 0:.3f} / {row['eager_round_trip_ms'] or 0:.3f} ms, inputs "
                  f"{row['candidate_inputs_ms'] or 0:.3f} / {row['eager_inputs_ms'] or 0:.3f} ms a call, "
                  f"{row['calls_per_window']} calls; windows alone {row['candidate_windows_alone_ms'] or 0:.4f} ms "
                  f"(charged {_charged(row) or 0:+.2%}); load {load_before:.2f}-{row['load_after']:.2f}", flush=True)
            if args.json:
                write(args.json, target, summarize(specs, runs), runs)
    print(f"{sum(len(v) for v in runs.values())} evaluations in {time.monotonic() - t0:.0f} s", flush=True)
    table = summarize(specs, runs)
    if args.solutions:
        for row, s in zip(table, specs, strict=True):
            row["profiler_ms"] = profiled_kernel_ms(solution_for(s.kernelbench_id), s, target, settings)
            row["harness_over_profiler"] = (row["median_candidate_ms"] / row["profiler_ms"] - 1
                                            if row["median_candidate_ms"] else None)
    head = ("| problem | passed | median speedup vs eager | spread (max-min)/median | median ms | "
            "charged to the windows (median, max) |")
    sep = "|---|---|---|---|---|---|"
    if args.solutions:
        head, sep = head + " profiler ms | harness / profiler |", sep + "---|---|"
    print("\n" + head + "\n" + sep)
    for row in table:
        line = (f"| {row['problem']} | {row['passed']}/{row['runs']} | {row['median_speedup'] or 0:.4f}x | "
                f"{row['speedup_spread'] or 0:.2%} | {row['median_candidate_ms'] or 0:.4f} | "
                f"{row['median_charged'] or 0:+.2%}, {row['max_charged'] or 0:+.2%} |")
        if args.solutions:
            line += f" {row['profiler_ms']:.4f} | {row['harness_over_profiler'] or 0:+.2%} |"
        print(line)
    if args.json:
        write(args.json, target, table, runs)
    return 0


def wait_for_quiet_host(quiet_s: float, limit_s: float = 10.0) -> float:
    """Wait until /proc/stat has counted no runnable task but this one for `quiet_s` seconds (sampled every 50 ms), at
    most `limit_s`; the seconds waited (a host never quiet in that time is used as it is: the row's load says so)."""
    t0 = time.monotonic()
    quiet_since = t0
    while time.monotonic() - t0 < limit_s:
        with open("/proc/stat") as f:
            running = next(int(line.split()[1]) for line in f if line.startswith("procs_running"))
        now = time.monotonic()
        if running > 1:
            quiet_since = now
        elif now - quiet_since >= quiet_s:
            break
        time.sleep(0.05)
    return round(time.monotonic() - t0, 1)


def _charged(row: dict) -> float | None:
    """How much the candidate's time grew by what its fingerprints were charged: its time over its windows alone."""
    ms, alone = row.get("candidate_ms"), row.get("candidate_windows_alone_ms")
    return ms / alone - 1 if ms is not None and alone else None


def summarize(specs, runs: dict[str, list[dict]]) -> list[dict]:
    """One row a problem: how many passed, the median speedup and its spread, the median candidate time, and how much
    the fingerprints' charge moved it (median and largest over runs)."""
    table = []
    for s in specs:
        speedups = [r["speedup"] for r in runs[s.id] if r["speedup"]]
        cand = [r["candidate_ms"] for r in runs[s.id] if r["candidate_ms"]]
        charged = [c for r in runs[s.id] if (c := _charged(r)) is not None]
        table.append({"problem": s.kernelbench_id, "passed": sum(r["verdict"] == "passed" for r in runs[s.id]),
                      "runs": len(runs[s.id]), "median_speedup": statistics.median(speedups) if speedups else None,
                      "speedup_spread": ((max(speedups) - min(speedups)) / statistics.median(speedups)
                                         if speedups else None),
                      "median_candidate_ms": statistics.median(cand) if cand else None,
                      "median_charged": statistics.median(charged) if charged else None,
                      "max_charged": max(charged) if charged else None})
    return table


def write(path: Path, target, table: list[dict], runs: dict[str, list[dict]]) -> None:
    path.write_text(json.dumps({"device": target.model_dump(mode="json"), "command": " ".join(sys.argv),
                                "cpus": os.cpu_count(), "table": table, "runs": runs}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
