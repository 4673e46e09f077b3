"""`harness eval`: judge one submission file against one problem."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from harness.cli.common import ProblemsDirOption, find_problem, require_cuda
from harness.config import get_settings
from harness.evaluation.reduced_size import SMALL
from harness.evaluation.runner import EvalOptions, evaluate
from harness.precision import PRECISIONS
from harness.precision import check as check_precision
from harness.problems.spec import V01_TOLERANCE
from harness.schema import EvalResult, Tolerance


def eval_command(
    problem: str = typer.Option(..., "--problem", "-p", help="Slug, KernelBench id (level2/75), file "
                                  "stem, or the path of a KernelBench-format problem file."),
    submission: Path = typer.Option(..., "--submission", "-s", exists=True, dir_okay=False,
                                    help="A Python file defining ModelNew, or a raw LLM reply holding one."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
    size: str = typer.Option("auto", "--size", help="auto (default on CUDA, small on CPU) | default | small. Every "
                             "problem has small: a KernelBench file's is chosen on first use (one forward pass "
                             "of about 20 ms here) and kept in the data dir."),
    trials: int = typer.Option(None, "--trials", min=1, help="Correctness trials (default 5)."),
    atol: float = typer.Option(None, "--atol", help="Override the problem's absolute tolerance."),
    rtol: float = typer.Option(None, "--rtol", help="Override the problem's relative tolerance."),
    v01: bool = typer.Option(False, "--v01-tolerance", help="Use KernelBench v0.1's atol=rtol=1e-2."),
    precision: str = typer.Option("fp32", "--precision", help="fp32 | fp16 | bf16: the problem's inputs and both "
                                  "models cast to it (as KernelBench does), graded at its tolerance."),
    no_timing: bool = typer.Option(False, "--no-timing", help="Check correctness only."),
    compile_baseline: str = typer.Option(None, "--compile-baseline",
                                         help="auto | on | off: also time torch.compile of the reference."),
    problems_dir: Path | None = ProblemsDirOption,
    as_json: bool = typer.Option(False, "--json", help="Print the result model as JSON on stdout."),
) -> None:
    """Evaluate SUBMISSION against PROBLEM in isolated processes and print the verdict.

    Examples:

      harness eval --problem level2/75 --submission my_kernel.py

      harness eval -p gemm-groupnorm-hardtanh -s reply.txt --device cpu --size small --json

      harness eval -p myprob/level1/1_Add.py -s my_kernel.py    # a problem file of your own
      harness eval -p level2/75 -s my_fp16_kernel.py --precision fp16
    """
    if device not in ("auto", "cpu", "cuda"):
        raise typer.BadParameter("use auto, cpu or cuda", param_hint="--device")
    if compile_baseline not in (None, "auto", "on", "off"):
        raise typer.BadParameter("use auto, on or off", param_hint="--compile-baseline")
    if precision not in PRECISIONS:
        raise typer.BadParameter(f"use {', '.join(PRECISIONS)}", param_hint="--precision")
    spec = find_problem(problems_dir, problem)
    if size not in ("auto", SMALL, *spec.sizes):
        raise typer.BadParameter(f"problem {spec.id} has sizes: {', '.join(dict.fromkeys([*spec.sizes, SMALL]))}",
                                 param_hint="--size")
    tolerance = V01_TOLERANCE if v01 else None
    if atol is not None or rtol is not None:
        base = tolerance or spec.tolerance_at(precision)
        tolerance = Tolerance(atol=atol if atol is not None else base.atol,
                              rtol=rtol if rtol is not None else base.rtol)
    if device == "cuda":
        require_cuda(get_settings())
    text = submission.read_bytes().decode("utf-8", errors="replace")
    typer.echo(f"evaluating {submission} against {spec.id} ...", err=True)
    result = evaluate(spec, text, EvalOptions(device=device, size=size, tolerance=tolerance, trials=trials,
                                              timing=not no_timing, compile_baseline=compile_baseline,
                                              precision=check_precision(precision)))
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        typer.echo(render(result))
    raise typer.Exit(0 if result.verdict.value == "passed" else 1)


def _ms(stats) -> str:
    if stats is None:
        return "-"
    return f"{stats.median_ms:.4f} ms (mean {stats.mean_ms:.4f}, min {stats.min_ms:.4f}, max {stats.max_ms:.4f}, " \
           f"std {stats.std_ms:.4f}, n={stats.n})"


def render(r: EvalResult) -> str:
    p, o = r.provenance, r.observations
    lines = [f"verdict:    {r.verdict.value}", f"message:    {r.message}",
             f"problem:    {r.problem.id} v{r.problem.version} ({r.problem.kernelbench_id or '-'})"
             + (f", size {r.problem.size}" if p is not None else "")  # no size where nothing ran
             + (f" ({' '.join(f'{k}={v}' for k, v in r.problem.overrides.items())})" if r.problem.overrides else ""),
             f"precision:  {r.problem.precision}",
             f"tolerance:  {r.tolerance}"]
    if p is not None:
        lines.append(f"device:     {p.device} {p.device_name}"
                     + (f" (sm {p.compute_capability}, driver {p.driver_version})" if p.compute_capability else ""))
        lines.append(f"software:   torch {p.torch_version}, CUDA {p.cuda_version or '-'}, "
                     f"python {p.python_version}, harness {p.harness_version}")
    for f in r.flags:
        lines.append(f"flag:       {f.check}: {f.detail}")
    if o.candidate_timing:
        lines.append(f"candidate:  {_ms(o.candidate_timing)}")
        lines.append(f"eager:      {_ms(o.eager_timing)}")
        lines.append(f"compile:    {_ms(o.compile_timing)}" + (f"  [{o.compile_baseline_error}]"
                                                              if o.compile_baseline_error else ""))
    if o.memory_plan is not None:
        plan = o.memory_plan
        lines.append(f"memory:     {plan.message}")
        lines.append(f"            {plan.trials_kept} of {plan.trials} trials kept to the judge, float64 truth on the "
                     f"{plan.truth}, {plan.calls_per_window} call(s) per timed window at most")
    if o.pause_method:
        lines.append(f"paused by:  {o.pause_method} (between the candidate's turns)")
    if o.exchange_memory:
        lines.append(f"exchange:   {o.exchange_memory} (trial data between the two processes)")
    if r.speedup_vs_eager is not None:
        lines.append(f"speedup:    {r.speedup_vs_eager:.3f}x vs eager" + (
            f", {r.speedup_vs_compile:.3f}x vs torch.compile" if r.speedup_vs_compile is not None else ""))
    for t in o.trials:
        for out in t.outputs:
            if out.max_abs_err is not None:
                fp64 = (f", vs fp64 {out.err_vs_fp64:.3g} (reference {out.ref_err_vs_fp64:.3g})"
                        if out.err_vs_fp64 is not None and out.ref_err_vs_fp64 is not None
                        else ", no float64 truth made")
                lines.append(f"trial {t.trial}:    max abs {out.max_abs_err:.3g}, max rel {out.max_rel_err:.3g}"
                             + fp64)
    if o.phases:
        lines.append(f"phases:     {sum(o.phases.values()):.1f} s: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in o.phases.items()))
    if r.log_excerpt:
        lines.append("log:")
        lines.extend("  " + ln for ln in r.log_excerpt.splitlines())
    if r.job_dir:
        lines.append(f"logs:       {r.job_dir}")
    return "\n".join(lines)
