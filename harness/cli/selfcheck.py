"""`harness selfcheck`: the A/A check over a KernelBench folder (each reference as its own ModelNew)."""

from __future__ import annotations

import shlex
import socket
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.cli.common import require_cuda
from harness.config import get_settings
from harness.precision import PRECISIONS
from harness.precision import check as check_precision
from harness.problems import get_registry
from harness.service import selfcheck as sc
from harness.service.devices import SlotError, plan_slots


def render(rows: list[sc.SelfcheckRow], console: Console) -> None:
    table = Table()
    for col, width in (("problem", 10), ("size used", 24), ("verdict", 18), ("A/A", 7), ("fwd ms", 7),
                       ("time s", 6)):
        table.add_column(col, min_width=width, overflow="fold")
    table.add_column("message", no_wrap=True, overflow="ellipsis", max_width=max(8, console.width - 100))
    for r in rows:
        verdict = f"{r.verdict} ({', '.join(r.flags)})" if r.flags else r.verdict  # beside the A/A it qualifies
        table.add_row(r.problem, r.size, verdict, "-" if r.speedup_vs_eager is None else f"{r.speedup_vs_eager:.3f}x",
                      "-" if r.forward_s is None else f"{r.forward_s * 1e3:.1f}", f"{r.sizing_s + r.eval_s:.1f}",
                      "" if r.verdict == "passed" else r.message)
    console.print(table)
    passed = sum(r.verdict == "passed" for r in rows)
    at = sorted({r.precision for r in rows})
    console.print(f"{passed}/{len(rows)} passed their own evaluation" + (f" at {', '.join(at)}" if at else ""),
                  soft_wrap=True)


def selfcheck_command(
    problems_dir: Path = typer.Option(..., "--problems-dir", exists=True, file_okay=False,
                                      help="A KernelBench folder (KernelBench/KernelBench, or one level of it)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    jobs: int = typer.Option(1, "--jobs", min=1, help="Problems checked at once (each job gets cores/jobs "
                             "threads)."),
    gpus: str = typer.Option(None, "--gpus", help="With --device cuda: all, or GPU indices such as 0,1; one "
                             "problem on each GPU at a time (--jobs is then their number)."),
    sample: str = typer.Option(None, "--sample", help="Comma-separated problem ids or level prefixes "
                               "(level1/19,level3/); `ci` for the fixed CI sample. Default: every problem."),
    json_out: Path = typer.Option(None, "--json", dir_okay=False, help="Write the report here, rewritten after "
                                  "each problem, so a long run can be followed and survives being stopped."),
    resume: bool = typer.Option(False, "--resume", help="Keep the rows already in --json and check only the "
                                "problems it lacks."),
    markdown: Path = typer.Option(None, "--markdown", dir_okay=False, help="Also write the table as Markdown."),
    sizes: str = typer.Option("auto", "--sizes", help="auto: reduced on the CPU, as in the file on CUDA; "
                              "reduced; default (as in the file)."),
    budget_ms: float = typer.Option(20.0, "--budget-ms", min=0.01, help="Reduce each problem until one "
                                    "forward pass is estimated to take about this long."),
    seed: int = typer.Option(None, "--seed", help="Fix the evaluations' secret seeds (to reproduce a run)."),
    precision: str = typer.Option("fp32", "--precision", help="fp32 | fp16 | bf16: inputs, parameters and both "
                                  "models cast to it, graded at its tolerance (KernelBench's)."),
) -> None:
    """Resubmit each problem's reference as its own ModelNew and evaluate it: every one should pass.

    On the CPU each problem runs at a reduced size derived from its module constants (batch first, then
    the largest sizes, halved until one forward pass fits --budget-ms), checked by building it; the size
    used is in the table and the JSON. Exit status 0 when every problem passed, 1 otherwise.

    Examples:

      harness selfcheck --problems-dir ~/KernelBench/KernelBench --sample ci

      nohup harness selfcheck --problems-dir ~/KernelBench/KernelBench --jobs 2 --json aa.json --resume &

      harness selfcheck --problems-dir ~/KernelBench/KernelBench --device cuda --sample level1/ --json gpu.json

      harness selfcheck --problems-dir ~/KernelBench/KernelBench --device cuda --gpus all --json gpu.json --resume

      harness selfcheck --problems-dir harness/problems/kernelbench --device cuda --precision bf16
    """
    if device not in ("cpu", "cuda"):
        typer.echo(f"error: --device must be cpu or cuda, not {device!r}", err=True)
        raise typer.Exit(2)
    if sizes not in ("auto", "reduced", "default"):
        typer.echo(f"error: --sizes must be auto, reduced or default, not {sizes!r}", err=True)
        raise typer.Exit(2)
    gpu_envs: list[dict[str, str]] = []
    if gpus is not None:
        if device != "cuda":
            typer.echo("error: --gpus spreads a run over GPUs: use it with --device cuda", err=True)
            raise typer.Exit(2)
        try:
            slots = plan_slots(gpus, get_settings())
        except SlotError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        gpu_envs = [slot.env for slot in slots if slot.device == "cuda"]
        jobs = max(1, len(gpu_envs))
    if device == "cuda":
        require_cuda(get_settings(), instead="cpu")
        if jobs > 1 and not gpu_envs:  # allowed, for verdicts in less time; the user should know what it costs
            typer.echo(f"note: --jobs {jobs} runs {jobs} evaluations on one GPU at once: they share its memory (each "
                       "holds its trials' outputs there) and the scratch disk, and disturb each other's timed "
                       "windows; quote A/A speedups from --jobs 1", err=True)
    if precision not in PRECISIONS:
        typer.echo(f"error: --precision must be one of {', '.join(PRECISIONS)}, not {precision!r}", err=True)
        raise typer.Exit(2)
    problems_dir = problems_dir.resolve()
    names = list(sc.CI_SAMPLE) if sample == "ci" else [s.strip() for s in (sample or "").split(",") if s.strip()]
    try:
        specs = sc.select(get_registry(problems_dir).all(), names)
    except KeyError as e:
        typer.echo(f"error: {e.args[0]}", err=True)
        raise typer.Exit(2) from None
    options = sc.SelfcheckOptions(device=device, reduce=None if sizes == "auto" else sizes == "reduced",
                                  forward_budget_s=budget_ms / 1e3, jobs=jobs, gpu_envs=gpu_envs, seed=seed,
                                  precision=check_precision(precision))
    done = sc.load_rows(json_out) if (json_out is not None and resume) else []
    done = [r for r in done if r.problem in {s.id for s in specs} and r.precision == precision]
    todo = [s for s in specs if s.id not in {r.problem for r in done}]
    report = sc.SelfcheckReport(command=shlex.join(["harness", *sys.argv[1:]]), commit=sc.current_commit(),
                                host=socket.gethostname(), device=device, jobs=jobs, rows=done,
                                gpus=[e.get("CUDA_VISIBLE_DEVICES", "") for e in gpu_envs],
                                forward_budget_s=options.forward_budget_s if options.reduce is not False else None)
    console = Console(stderr=True)
    order = {s.id: i for i, s in enumerate(specs)}
    t0 = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("A/A", total=len(specs), completed=len(done))

        def on_row(row: sc.SelfcheckRow) -> None:
            row.commit = report.commit
            report.rows.append(row)
            report.wall_s = time.monotonic() - t0
            report.rows.sort(key=lambda r: order[r.problem])
            if json_out is not None:
                sc.write_report(report, json_out)
            mark = "ok" if row.verdict == "passed" else row.verdict
            progress.console.print(f"{row.problem:<11} {mark:<18} {row.size}", soft_wrap=True, highlight=False)
            progress.advance(task)

        sc.run_selfcheck(todo, options, get_settings(), on_row)
    # Piped to a file, rich would wrap at 80 columns: a row per line reads better there.
    render(report.rows, Console() if sys.stdout.isatty() else Console(width=200))
    if json_out is not None:
        sc.write_report(report, json_out)
        typer.echo(f"report written to {json_out}", err=True)
    if markdown is not None:
        markdown.write_text(sc.markdown_table(report.rows))
    raise typer.Exit(0 if report.passed() == len(report.rows) else 1)
