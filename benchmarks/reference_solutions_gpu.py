#!/usr/bin/env python3
"""Correctness and timing of the gold reference solutions (reference_solutions/) on a GPU.

Standalone: needs only torch (no harness imports). For each selected problem it

  1. builds the reference `Model` (torch.manual_seed(0)) and `ModelNew` (torch.manual_seed(0)), checks
     that their state dicts have the same keys, shapes and dtypes, and loads the reference's state dict
     into ModelNew;
  2. checks correctness on 5 seeded torch.rand inputs (as the problem's get_inputs makes them) and on
     one randn * 2 + 0.5 input at atol = rtol = 1e-4, printing the max abs error, the max
     |a - b| / (1 + |b|), and both outputs' errors against a float64 ground truth (the reference run
     on .double() copies);
  3. times, in one run, with CUDA events (median over --iters calls after --warmup calls; a 256 MB
     buffer is zeroed before every call to flush the L2; fresh inputs every call, generated before the
     timed window): eager Model, torch.compile(Model), torch.compile(Model, mode="max-autotune"), a bare
     torch.addmm of the same shapes (the fp32 GEMM floor) and ModelNew.

Usage (from the repository root):
    python benchmarks/reference_solutions_gpu.py                       # all six, default sizes
    python benchmarks/reference_solutions_gpu.py 75 37 --no-max-autotune
    python benchmarks/reference_solutions_gpu.py --sizes small --json /tmp/small.json
    python benchmarks/reference_solutions_gpu.py --list                # works without a GPU
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn as nn

REPO = Path(__file__).resolve().parent.parent
PROBLEMS_DIR = REPO / "harness" / "problems" / "kernelbench" / "level2"
SOLUTIONS_DIR = REPO / "reference_solutions"

# id -> module-constant overrides of the "small" size: the harness catalog's (which imports no torch).
sys.path.insert(0, str(REPO))
from harness.problems.catalog import builtin_problems  # noqa: E402

SMALL = {spec.kernelbench_id.split("/")[1]: spec.size("small").overrides for spec in builtin_problems()}
ORDER = ["75", "62", "37", "94", "30", "88"]

ATOL = RTOL = 1e-4
N_UNIFORM_TRIALS = 5
FLUSH_BYTES = 256 * 1024 * 1024


def log(msg: str) -> None:
    print(msg, flush=True)


def find_one(directory: Path, pattern: str) -> Path | None:
    hits = sorted(directory.glob(pattern))
    return hits[0] if hits else None


def load_module(path: Path, name: str, overrides: dict | None = None):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    for key, value in (overrides or {}).items():
        if not hasattr(mod, key):
            raise AttributeError(f"{path.name} has no module constant {key!r}")
        setattr(mod, key, value)
    return mod


def gpu_environment() -> dict:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "driver": None,
        "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        )
        env["nvidia_smi"] = out.stdout.strip()
        env["driver"] = out.stdout.strip().splitlines()[0].split(",")[0].strip()
    except Exception as exc:  # nvidia-smi absent or failing: not fatal
        env["nvidia_smi"] = f"unavailable ({exc.__class__.__name__})"
    return env


def first_linear(model: nn.Module) -> nn.Linear:
    for m in model.modules():
        if isinstance(m, nn.Linear):
            return m
    raise RuntimeError("model has no nn.Linear")


def error_stats(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    diff = (out.double() - ref.double()).abs()
    return diff.max().item(), (diff / (1.0 + ref.double().abs())).max().item()


def check_correctness(pid, prob, ref, new, device) -> dict:
    """5 seeded uniform inputs + one randn*2+0.5 input; each also against a float64 ground truth."""
    ref64 = copy.deepcopy(ref).double()
    trials = []
    for t in range(N_UNIFORM_TRIALS + 1):
        kind = "rand" if t < N_UNIFORM_TRIALS else "randn*2+0.5"
        torch.manual_seed(1000 + t)
        cpu_inputs = prob.get_inputs()  # torch.rand on the CPU, as the harness makes them
        if kind != "rand":
            cpu_inputs = [torch.randn_like(x) * 2 + 0.5 for x in cpu_inputs]
        inputs = [x.to(device) for x in cpu_inputs]
        with torch.no_grad():
            r = ref(*inputs)
            o = new(*inputs)
            truth = ref64(*[x.double() for x in inputs])
        torch.cuda.synchronize()
        rec = {"trial": t, "kind": kind, "ref_shape": list(r.shape), "sol_shape": list(o.shape),
               "sol_dtype": str(o.dtype)}
        if o.shape != r.shape or o.dtype != r.dtype:
            rec.update(passed=False, reason="shape/dtype mismatch")
        else:
            rec["max_abs"], rec["max_rel1"] = error_stats(o, r)
            rec["ref_vs_f64_abs"], rec["ref_vs_f64_rel1"] = error_stats(r, truth)
            rec["sol_vs_f64_abs"], rec["sol_vs_f64_rel1"] = error_stats(o, truth)
            rec["finite"] = bool(torch.isfinite(o).all().item())
            rec["passed"] = bool(torch.allclose(o, r, atol=ATOL, rtol=RTOL)) and rec["finite"]
        trials.append(rec)
        if "max_abs" in rec:
            log(f"    [{pid}] {kind:11s} #{t}: {'pass' if rec['passed'] else 'FAIL'}  "
                f"max|a-b|={rec['max_abs']:.3e}  max|a-b|/(1+|b|)={rec['max_rel1']:.3e}  "
                f"vs fp64: ref {rec['ref_vs_f64_abs']:.3e}  solution {rec['sol_vs_f64_abs']:.3e}")
        else:
            log(f"    [{pid}] {kind:11s} #{t}: FAIL  shape {rec['sol_shape']} {rec['sol_dtype']}"
                f" vs reference {rec['ref_shape']}")
        del r, o, truth, inputs
    del ref64
    torch.cuda.empty_cache()
    return {"passed": all(t["passed"] for t in trials), "trials": trials}


def bench(fn, shapes, device, iters, warmup, flush) -> list[float]:
    """Milliseconds per call: fresh inputs and an L2 flush before each call, outside the events."""

    def make():
        return [torch.rand(s, device=device) for s in shapes]

    with torch.no_grad():
        for _ in range(warmup):
            args = make()
            fn(*args)
            del args
        torch.cuda.synchronize()
        times = []
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        for _ in range(iters):
            args = make()
            flush.zero_()
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            del args
    return times


_NOT_THE_MODEL = ("fill", "Fill", "zero", "distribution", "philox", "uniform", "normal")


def profile_kernels(fn, shapes, device, iters, flush) -> float:
    """An independent measure: the CUDA kernels' own device time per call, from the torch profiler
    (input generation and the L2 flush kernels excluded), to check the event-based medians against."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(3):
            fn(*[torch.rand(s, device=device) for s in shapes])
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                args = [torch.rand(s, device=device) for s in shapes]
                flush.zero_()
                fn(*args)
                torch.cuda.synchronize()
    total_us = 0.0
    for evt in prof.key_averages():
        if any(tag in evt.key for tag in _NOT_THE_MODEL):
            continue
        total_us += getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0.0)
    return total_us / iters / 1000.0


def run_problem(pid, args, device, flush) -> dict:
    t_problem = time.perf_counter()
    ppath = find_one(PROBLEMS_DIR, f"{pid}_*.py")
    spath = find_one(SOLUTIONS_DIR, f"level2_{pid}_*.py")
    res: dict = {"id": pid, "problem_file": str(ppath), "solution_file": str(spath), "sizes": args.sizes,
                 "times_ms": {}, "median_ms": {}, "errors": {}}
    overrides = SMALL[pid] if args.sizes == "small" else {}
    prob = load_module(ppath, f"kh_problem_{pid}", overrides)
    init = prob.get_init_inputs()
    shapes = [tuple(x.shape) for x in prob.get_inputs()]
    res["init_inputs"] = repr(init)
    res["input_shapes"] = [list(s) for s in shapes]
    log(f"\n=== level2/{pid}: {ppath.name} | {spath.name} | init {init} | inputs {shapes}")

    t0 = time.perf_counter()
    sol = load_module(spath, f"kh_solution_{pid}")
    res["solution_load_s"] = time.perf_counter() - t0
    log(f"  solution imported (load_inline build) in {res['solution_load_s']:.1f} s")
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    if tf32 != (False, "highest"):
        log(f"  WARNING: matmul precision flags changed after importing the solution: {tf32}")
    res["matmul_flags_after_import"] = list(tf32)

    torch.manual_seed(0)
    ref = prob.Model(*init).to(device).eval()
    torch.manual_seed(0)
    new = sol.ModelNew(*init).to(device).eval()
    sd_ref, sd_new = ref.state_dict(), new.state_dict()
    same_layout = list(sd_ref) == list(sd_new) and all(
        sd_ref[k].shape == sd_new[k].shape and sd_ref[k].dtype == sd_new[k].dtype for k in sd_ref)
    same_values = same_layout and all(torch.equal(sd_ref[k], sd_new[k]) for k in sd_ref)
    res["state_dict_layout_equal"], res["seeded_params_equal"] = same_layout, same_values
    log(f"  state_dict keys/shapes/dtypes equal: {same_layout}; seeded values equal: {same_values}")
    new.load_state_dict(sd_ref)

    t0 = time.perf_counter()
    corr = check_correctness(pid, prob, ref, new, device)
    res["correctness"] = corr
    res["passed"] = corr["passed"] and same_layout
    log(f"  correctness: {'PASS' if res['passed'] else 'FAIL'} ({time.perf_counter() - t0:.1f} s)")

    lin = first_linear(ref)
    w_t, b = lin.weight.t(), lin.bias
    contenders = [("eager", ref), ("compile", None), ("max_autotune", None),
                  ("gemm", lambda x: torch.addmm(b, x, w_t)), ("solution", new)]
    for name, fn in contenders:
        if name == "compile" and args.no_compile:
            continue
        if name == "max_autotune" and (args.no_max_autotune or args.no_compile):
            continue
        t0 = time.perf_counter()
        try:
            if name in ("compile", "max_autotune"):
                torch._dynamo.reset()
                fn = torch.compile(ref) if name == "compile" else torch.compile(ref, mode="max-autotune")
                torch.manual_seed(1000)
                x0 = [x.to(device) for x in prob.get_inputs()]
                with torch.no_grad():
                    out_c = fn(*x0).clone()
                    out_e = ref(*x0)
                torch.cuda.synchronize()
                res[f"{name}_build_s"] = time.perf_counter() - t0
                res[f"{name}_max_abs_vs_eager"] = error_stats(out_c, out_e)[0]
                log(f"  {name}: compiled in {res[f'{name}_build_s']:.1f} s; max |compiled - eager| = "
                    f"{res[f'{name}_max_abs_vs_eager']:.3e}")
                del out_c, out_e, x0
            times = bench(fn, shapes, device, args.iters, args.warmup, flush)
            res["times_ms"][name] = times
            res["median_ms"][name] = statistics.median(times)
            log(f"  {name:12s}: median {res['median_ms'][name]:.4f} ms  (min {min(times):.4f}, "
                f"max {max(times):.4f}; {len(times)} calls; stage {time.perf_counter() - t0:.1f} s)")
        except Exception as exc:  # keep going: one failing stage must not lose the others
            res["errors"][name] = f"{exc.__class__.__name__}: {exc}"
            log(f"  {name}: ERROR {res['errors'][name]}")
            traceback.print_exc()
        finally:
            fn = None
            if name in ("compile", "max_autotune"):
                torch._dynamo.reset()
            torch.cuda.empty_cache()
    try:
        res["profiler_solution_ms"] = profile_kernels(new, shapes, device, 20, flush)
        log(f"  solution kernels by the profiler: {res['profiler_solution_ms']:.4f} ms per call")
    except Exception as exc:
        res["errors"]["profiler"] = f"{exc.__class__.__name__}: {exc}"
        log(f"  profiler: ERROR {res['errors']['profiler']}")
    del ref, new
    torch.cuda.empty_cache()
    res["problem_s"] = time.perf_counter() - t_problem
    log(f"  level2/{pid} done in {res['problem_s']:.1f} s")
    return res


def fmt_ms(v):
    return f"{v:9.4f}" if v is not None else f"{'-':>9s}"


def fmt_x(num, den):
    return f"{num / den:7.3f}x" if num is not None and den else f"{'-':>8s}"


def print_table(results, env):
    log("\n" + "=" * 118)
    log(f"GPU {env['gpu']} | driver {env['driver']} | torch {env['torch']} | CUDA {env['cuda']} | "
        f"sizes {results[0]['sizes'] if results else '-'} | median ms over calls with an L2 flush")
    head = (f"{'problem':8s} {'eager':>9s} {'compile':>9s} {'max-at':>9s} {'gemm':>9s} {'solution':>9s} "
            f"{'vs eager':>8s} {'vs comp':>8s} {'vs m-at':>8s} {'floor':>6s}  correct")
    log(head)
    log("-" * len(head))
    for r in results:
        m = r["median_ms"]
        e, c, a, g, s = (m.get(k) for k in ("eager", "compile", "max_autotune", "gemm", "solution"))
        floor = f"{g / s:6.3f}" if g and s else f"{'-':>6s}"
        log(f"{r['id']:8s} {fmt_ms(e)} {fmt_ms(c)} {fmt_ms(a)} {fmt_ms(g)} {fmt_ms(s)} "
            f"{fmt_x(e, s)} {fmt_x(c, s)} {fmt_x(a, s)} {floor}  {'pass' if r['passed'] else 'FAIL'}")
    log("floor = t_gemm / t_solution (1.0 = the solution costs no more than the bare fp32 addmm)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("problems", nargs="*", help=f"KernelBench level2 ids (default: {' '.join(ORDER)})")
    ap.add_argument("--sizes", choices=["default", "small"], default="default")
    ap.add_argument("--no-max-autotune", action="store_true", help="skip torch.compile(mode='max-autotune')")
    ap.add_argument("--no-compile", action="store_true", help="skip both torch.compile variants")
    ap.add_argument("--iters", type=int, default=50, help="timed calls per contender (>= 30)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", metavar="PATH", help="write raw results (all timings) to PATH")
    ap.add_argument("--list", action="store_true", help="list the problem and solution files, then exit")
    args = ap.parse_args(argv)

    pids = [p.strip().removeprefix("level2/") for p in args.problems] or ORDER
    unknown = [p for p in pids if p not in SMALL]
    if unknown:
        ap.error(f"unknown problem id(s) {unknown}; known: {' '.join(ORDER)}")
    if args.iters < 30:
        log(f"note: --iters {args.iters} < 30")
    missing = []
    for pid in pids:
        ppath = find_one(PROBLEMS_DIR, f"{pid}_*.py")
        spath = find_one(SOLUTIONS_DIR, f"level2_{pid}_*.py")
        if args.list:
            log(f"{pid}: {ppath} | {spath}")
        if ppath is None or spath is None:
            missing.append(pid)
    if missing:
        log(f"error: no problem or solution file for {missing} under {PROBLEMS_DIR} / {SOLUTIONS_DIR}")
        return 2
    if args.list:
        return 0
    if not torch.cuda.is_available():
        log("error: CUDA is not available; this benchmark needs a GPU (use --list to check the files).")
        return 2

    device = torch.device("cuda")
    env = gpu_environment()
    log(f"GPU: {env['gpu']}\ndriver: {env['driver']} ({env['nvidia_smi']})\n"
        f"torch {env['torch']}, CUDA {env['cuda']}, Python {env['python']}\n"
        f"matmul allow_tf32={env['allow_tf32_matmul']}, "
        f"float32_matmul_precision={env['float32_matmul_precision']}"
        f"\nproblems {pids}, sizes {args.sizes}, iters {args.iters}, warmup {args.warmup}, "
        f"max-autotune {'off' if args.no_max_autotune or args.no_compile else 'on'}")
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device=device)

    t_all = time.perf_counter()
    results = []
    for pid in pids:
        try:
            results.append(run_problem(pid, args, device, flush))
        except Exception as exc:
            log(f"level2/{pid}: ERROR {exc.__class__.__name__}: {exc}")
            traceback.print_exc()
            results.append({"id": pid, "sizes": args.sizes, "median_ms": {}, "passed": False,
                            "errors": {"problem": f"{exc.__class__.__name__}: {exc}"}})
        if args.json:  # write as we go: a crash later keeps what was measured
            Path(args.json).write_text(json.dumps({"environment": env, "results": results}, indent=1))
    print_table(results, env)
    log(f"total {time.perf_counter() - t_all:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "results": results}, indent=1))
        log(f"raw results written to {args.json}")
    return 0 if all(r.get("passed") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
