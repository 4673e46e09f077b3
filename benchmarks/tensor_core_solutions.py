#!/usr/bin/env python3
"""The 3xTF32 gold solutions (reference_solutions/tensor_cores/) through the harness, on a GPU host.

    python benchmarks/tensor_core_solutions.py --json $OUT/tensor_cores.json
    python benchmarks/tensor_core_solutions.py 75 37 --no-sweep

1. Builds all of them first, in parallel on the CPU (`precompile`, one child process each), so the evaluations
   time kernels, not nvcc.
2. Evaluates each once through `harness.evaluation.runner.evaluate` (isolated processes, fresh parameters, 5 uniform
   trials and one randn*2+0.5 trial, parent-clock timing against eager and torch.compile), one at a time, and
   prints: verdict, flags, speedup vs eager and vs torch.compile, and the worst error against float64 of the
   candidate and of the fp32 reference over the trials (the harness's max |a-g| / (1+|g|)).
3. The chunk sweep (skipped with --no-sweep, or when --deadline-s would be overrun): in this process, each
   solution's extension loaded from the build its evaluation used, the module's chunk length (ModelNew.k_chunk,
   the K-chunk of the hi*hi GEMM) set to each of a few values, error against float64 (the reference Model run in
   float64) on a uniform and a randn*2+0.5 input beside the fp32 reference's, and the forward's median time (CUDA
   events, 256 MB L2 flush before each call). It measures what the solutions' headers assume about the tensor
   cores' truncating accumulation: the error of one long hi*hi chain against chunks summed in fp32.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import artifacts  # noqa: E402
from harness.config import get_settings  # noqa: E402
from harness.evaluation.prebuild import build_inputs, precompile, probe_device  # noqa: E402
from harness.evaluation.runner import EvalOptions, evaluate  # noqa: E402
from harness.problems import get_registry  # noqa: E402
from harness.submission import extract  # noqa: E402

SOLUTIONS = REPO / "reference_solutions" / "tensor_cores"
TARGET_SPEEDUP = 1.8  # vs eager (issue 19)
TARGET_ERR_RATIO = 2.0  # candidate / fp32 reference, error vs float64


def solution_for(kernelbench_id: str) -> Path:
    (path,) = SOLUTIONS.glob(f"level2_{kernelbench_id.split('/')[1]}_*.py")
    return path


def worst(r, key: str, inputs: str | None = None) -> float | None:
    """The largest figure `key` over the trials' outputs (those of one input distribution, if named)."""
    vals = [getattr(o, key) for t in r.observations.trials if inputs is None or t.inputs == inputs
            for o in t.outputs if getattr(o, key) is not None]
    return max(vals) if vals else None


def evaluate_one(spec, text: str, target, settings) -> dict:
    t0 = time.monotonic()
    r = evaluate(spec, text, EvalOptions(device="cuda", size="default", compile_baseline="on", target=target),
                 settings)
    o = r.observations
    row = {
        "problem": spec.kernelbench_id, "verdict": r.verdict.value, "message": r.message,
        "flags": [{"check": f.check, "detail": f.detail} for f in r.flags],
        "speedup_vs_eager": r.speedup_vs_eager, "speedup_vs_compile": r.speedup_vs_compile,
        "candidate_ms": o.candidate_timing.median_ms if o.candidate_timing else None,
        "eager_ms": o.eager_timing.median_ms if o.eager_timing else None,
        "compile_ms": o.compile_timing.median_ms if o.compile_timing else None,
        "err_vs_fp64": worst(r, "err_vs_fp64"), "ref_err_vs_fp64": worst(r, "ref_err_vs_fp64"),
        "max_rel_err": worst(r, "max_rel_err"),
        "trials": [{"inputs": t.inputs, "err_vs_fp64": [x.err_vs_fp64 for x in t.outputs],
                    "ref_err_vs_fp64": [x.ref_err_vs_fp64 for x in t.outputs],
                    "max_rel_err": [x.max_rel_err for x in t.outputs]} for t in o.trials],
        "kernels": o.kernels.model_dump(mode="json") if o.kernels is not None else None,
        "wall_s": time.monotonic() - t0,
        "log_excerpt": r.log_excerpt[-3000:] if r.verdict.value != "passed" else "",
    }
    ratio = (row["err_vs_fp64"] / row["ref_err_vs_fp64"]
             if row["err_vs_fp64"] is not None and row["ref_err_vs_fp64"] else None)
    row["err_ratio"] = ratio
    row["meets"] = bool(r.verdict.value == "passed" and not r.flags and (r.speedup_vs_eager or 0) >= TARGET_SPEEDUP
                        and ratio is not None and ratio <= TARGET_ERR_RATIO)
    return row


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_row(row: dict) -> None:
    flags = ",".join(f["check"] for f in row["flags"]) or "none"
    print(f"{row['problem']:<10} {row['verdict']:<13} flags={flags:<12} "
          f"vs eager {fmt(row['speedup_vs_eager'], '.3f')}x vs compile {fmt(row['speedup_vs_compile'], '.3f')}x  "
          f"cand {fmt(row['candidate_ms'], '.4f')} ms "
          f"eager {fmt(row['eager_ms'], '.4f')} ms  err vs fp64 {fmt(row['err_vs_fp64'], '.3g')} / ref "
          f"{fmt(row['ref_err_vs_fp64'], '.3g')} ({fmt(row['err_ratio'], '.2f')}x)  "
          f"{'MEETS' if row['meets'] else 'misses'} targets  [{row['wall_s']:.0f} s]", flush=True)
    if row["verdict"] != "passed":
        print(f"    {row['message']}\n    {row['log_excerpt'][-1500:]}", flush=True)
    for f in row["flags"]:
        print(f"    flag {f['check']}: {f['detail']}", flush=True)


def sweep_one(spec, text: str, target, settings) -> list[dict]:
    """Error and time of one solution's forward for several hi*hi chunk lengths (see the module docstring)."""
    import copy

    import torch

    from harness.evaluation import parameters, problem_module
    from harness.evaluation.protocol import ProblemLoad

    number = spec.kernelbench_id.split("/")[1]
    problem = problem_module.load_problem(ProblemLoad(path=spec.source_path,
                                                      overrides=spec.size("default").overrides),
                                          module_name=f"_tc_sweep_problem_{number}")
    key = artifacts.build_key(extract(text).source, **build_inputs(target))
    os.environ["TORCH_EXTENSIONS_DIR"] = str(artifacts.build_dir(settings, key))
    if target.compute_capability:
        os.environ["TORCH_CUDA_ARCH_LIST"] = target.compute_capability
    module_spec = importlib.util.spec_from_file_location(f"_tc_sweep_solution_{number}",
                                                         solution_for(spec.kernelbench_id))
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)

    device = torch.device("cuda")
    init = problem.get_init_inputs()
    torch.manual_seed(0)
    ref = problem.Model(*init)
    parameters.draw_fresh(ref, 1234, spec.fixed_parameters)  # as the harness does: GroupNorm's affine not 1/0
    model = module.ModelNew(*init)
    model.load_state_dict(ref.state_dict())
    ref64 = copy.deepcopy(ref).double().to(device)
    ref = ref.to(device)
    model = model.to(device)
    flush = torch.empty(256 << 18, dtype=torch.float32, device=device)

    def err(a, g):
        return float(((a.double() - g).abs() / (1 + g.abs())).max())

    rows = []
    with torch.no_grad():
        uniform = problem_module.seeded_inputs(problem, 7, device)
        inputs = {"uniform": uniform, "randn*2+0.5": problem_module.redistribute(uniform)}
        truth = {k: ref64(*[x.double() for x in v]) for k, v in inputs.items()}
        ref_err = {k: err(ref(*v), truth[k]) for k, v in inputs.items()}
        K = next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).in_features
        chunks = sorted({c for c in (K // 32, K // 16, K // 8, K // 4, K // 2, K) if c >= 128} | {module.K_CHUNK})
        for chunk in chunks:
            model.k_chunk = chunk
            row = {"problem": spec.kernelbench_id, "k_chunk": chunk, "chunks": K // chunk,
                   "shipped": chunk == module.K_CHUNK}
            for k, v in inputs.items():
                row[f"err[{k}]"] = err(model(*v), truth[k])
                row[f"ref_err[{k}]"] = ref_err[k]
            times = []
            for _ in range(3):
                model(*uniform)
            for _ in range(15):
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(*uniform)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            row["ms"] = statistics.median(times)
            rows.append(row)
            ratios = " ".join(f"{k} {row[f'err[{k}]']:.3g} ({row[f'err[{k}]'] / row[f'ref_err[{k}]']:.2f}x ref)"
                              for k in inputs)
            mark = " *" if row["shipped"] else "  "
            print(f"  {spec.kernelbench_id} k_chunk {chunk:>5} ({K // chunk:>2} chunks){mark} {row['ms']:.4f} ms"
                  f"   err vs fp64: {ratios}", flush=True)
    del model, ref, ref64, flush, truth
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="*", help="KernelBench numbers (default: all six)")
    parser.add_argument("--json", type=Path, help="write raw results here (rewritten after each step)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the in-process chunk sweep")
    parser.add_argument("--deadline-s", type=float, default=420.0,
                        help="start no sweep of a problem past this many seconds from the start")
    args = parser.parse_args()
    t_start = time.monotonic()
    settings = get_settings()
    specs = [s for s in get_registry().all() if not args.problems or s.kernelbench_id.split("/")[1] in args.problems]
    texts = {s.id: solution_for(s.kernelbench_id).read_text() for s in specs}
    target = probe_device("cuda", settings)
    print(f"{target.device_name}, driver {target.driver_version}, torch {target.torch_version}, "
          f"CUDA {target.cuda_version}; data dir {settings.data_dir}", flush=True)
    out: dict = {"device": target.model_dump(mode="json"), "builds": {}, "results": [], "sweep": []}

    def write() -> None:
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        built = list(pool.map(lambda s: precompile(texts[s.id], target, settings), specs))
    for s, b in zip(specs, built, strict=True):
        out["builds"][s.kernelbench_id] = {"ok": b.ok, "seconds": b.seconds, "log": "" if b.ok else b.log_tail}
        print(f"build {s.kernelbench_id}: {'ok' if b.ok else 'FAILED'} in {b.seconds:.0f} s", flush=True)
        if not b.ok:
            print(b.log_tail[-3000:], flush=True)
    print(f"built {sum(b.ok for b in built)}/{len(specs)} in {time.monotonic() - t0:.0f} s", flush=True)
    write()

    for s in specs:
        row = evaluate_one(s, texts[s.id], target, settings)
        out["results"].append(row)
        print_row(row)
        write()

    if not args.no_sweep:
        print("\nchunk sweep (* = the shipped K_CHUNK; ref = the fp32 reference Model's error on the same input):",
              flush=True)
        if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":  # the harness's children never see it (scrubbed env)
            print("  NVIDIA_TF32_OVERRIDE=0 here: cuBLAS runs fp32 in this process, the sweep's times are not TF32's",
                  flush=True)
        for s in specs:
            if time.monotonic() - t_start > args.deadline_s:
                print(f"  {s.kernelbench_id}: skipped (past --deadline-s {args.deadline_s:.0f})", flush=True)
                continue
            try:
                out["sweep"] += sweep_one(s, texts[s.id], target, settings)
            except Exception as e:  # a diagnostic: report and go on
                print(f"  {s.kernelbench_id}: sweep failed: {type(e).__name__}: {e}", flush=True)
            write()

    print(f"\n{'problem':<10} {'verdict':<13} {'vs eager':>9} {'vs compile':>10} {'err/ref':>8}  targets "
          f"(>= {TARGET_SPEEDUP}x eager, err <= {TARGET_ERR_RATIO}x ref, no flags)")
    for row in out["results"]:
        print(f"{row['problem']:<10} {row['verdict']:<13} {fmt(row['speedup_vs_eager'], '.3f'):>8}x "
              f"{fmt(row['speedup_vs_compile'], '.3f'):>9}x {fmt(row['err_ratio'], '.2f'):>7}x  "
              f"{'meets' if row['meets'] else 'MISSES'}")
    print(f"total {time.monotonic() - t_start:.0f} s", flush=True)
    write()
    return 0 if all(r["meets"] for r in out["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
