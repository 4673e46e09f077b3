"""`harness bench throughput`: serial against pipelined evaluation of N distinct load_inline submissions, and warm
evaluations per problem (of any KernelBench problem, by its A/A copy)."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.problems import UnknownProblem, get_registry
from harness.schema import EvalResult
from harness.service import throughput
from harness.service.devices import SlotError
from harness.service.runtime import settings_with, setup_logging

app = typer.Typer(help="Measure the harness itself.", no_args_is_help=True)


def render(rep: throughput.ThroughputReport, console: Console) -> None:
    arch = (rep.arch_list or "the GPU's own (default)") if rep.device == "cuda" else "n/a (no nvcc)"
    console.print(f"{rep.n} submissions ({rep.distinct_sources} distinct sources) from {', '.join(rep.origins)} on "
                  f"{rep.device} ({rep.device_name}); CUDA arch list: {arch}", soft_wrap=True)
    if rep.serial_n:
        console.print(f"serial mode on the first {rep.serial_n} of the {rep.n} (a sample: serial time is linear in "
                      "the count; its evaluations per hour are a rate)", soft_wrap=True)
    table = Table()
    rows: list[tuple[str, str, str]] = [
        ("compile workers", "{compile_workers}", ""),
        ("verdicts", "{verdicts}", ""),
        ("wall s", "{wall_s:.1f}", ""),
        ("compile s (sum of builds)", "{compile_s:.1f}", "wall s per build, parent's clock"),
        ("device stage s (sum in slot)", "{slot_s:.1f}", ""),
        ("  of which candidate import/build s", "{slot_import_s:.1f}", ""),
        ("device-busy s", "{device_s:.1f}", "stage minus import/build"),
        ("device-busy fraction", "{device_busy_fraction:.2f}", "device-busy s / wall"),
        ("evaluations per hour", "{evals_per_hour:.1f}", ""),
        ("children CPU s", "{children_cpu_s:.1f}", "RUSAGE_CHILDREN, all children"),
    ]
    table.add_column("")
    for m in rep.modes:
        table.add_column(m.mode, justify="right")
    table.add_column("how")
    for label, fmt, note in rows:
        values = []
        for m in rep.modes:
            fields = m.model_dump()
            fields["verdicts"] = ", ".join(f"{k} {v}" for k, v in sorted(m.verdicts.items()))
            values.append(fmt.format(**fields))
        table.add_row(label, *values, note)
    console.print(table)
    render_problems(rep, console)
    for m in rep.modes:
        console.print(f"{m.mode}: compile s = {m.compile_where}", soft_wrap=True)
    for m in rep.modes:
        if m.phases_s:
            console.print(f"{m.mode}: evaluation phases, s summed over {m.submissions}: "
                          + ", ".join(f"{k} {v:.1f}" for k, v in m.phases_s.items()), soft_wrap=True)
    by_mode = {m.mode: m for m in rep.modes}
    for m in rep.modes:
        if m.trusted_warm_s:
            console.print(f"{m.mode}: {len(m.trusted_warm_s)} evaluations with the trusted process warm, median "
                          f"{statistics.median(m.trusted_warm_s):.2f} s each ({m.trusted_warm_per_hour():.0f} an "
                          f"hour); {sum(e['candidate_ahead'] for e in m.evaluations)} of {m.submissions} candidates "
                          "started ahead", soft_wrap=True)
    if "warm" in by_mode:
        warm = by_mode["warm"]
        rate = warm.trusted_warm_per_hour() or warm.evals_per_hour
        console.print(f"bar: warm evaluations per hour {rate:.0f} >= {throughput.WARM_BAR:g}: "
                      f"{'met' if rate >= throughput.WARM_BAR else 'NOT met'} (the mode as a whole, each problem's "
                      f"first evaluation starting its trusted process: {warm.evals_per_hour:.0f})", soft_wrap=True)
    b = rep.bar
    if b is None:
        console.print("bar: the pipelined bars need the pipelined mode", soft_wrap=True)
        return
    pipelined = by_mode["pipelined"]
    console.print(f"bar: pipelined wall {pipelined.wall_s:.1f} s <= {throughput.WALL_BAR} x max(compile s / workers, "
                  f"device stage s) = {throughput.WALL_BAR * b.stage_bound_s:.1f} s: "
                  f"{'met' if b.wall_ok else 'NOT met'}", soft_wrap=True)
    if b.speedup is None:
        console.print("bar: pipelined against serial evaluations per hour needs the serial mode too", soft_wrap=True)
        return
    console.print(f"bar: pipelined evaluations per hour {b.speedup:.2f} x serial >= {throughput.SPEEDUP_BAR:g} x: "
                  f"{'met' if b.speedup_ok else 'NOT met'}", soft_wrap=True)


def render_problems(rep: throughput.ThroughputReport, console: Console) -> None:
    """Per problem and mode, the median warm evaluation (of how many), and the warm mode's bar on each."""
    problems = sorted({p for m in rep.modes for p in m.per_problem})
    if not problems:  # a report written before per-problem figures existed
        return
    table = Table(title="median s of each problem's evaluations with the trusted process warm (warm of all)")
    table.add_column("problem")
    for m in rep.modes:
        table.add_column(m.mode, justify="right")
    for problem in problems:
        cells = []
        for m in rep.modes:
            f = m.per_problem.get(problem)
            median = "-" if f is None or f.median_warm_s is None else f"{f.median_warm_s:.2f}"
            cells.append("" if f is None else f"{median} ({f.warm} of {f.evaluations})")
        table.add_row(problem, *cells)
    console.print(table)
    warm = next((m for m in rep.modes if m.mode == "warm"), None)
    if warm is None:
        return
    for problem, f in warm.per_problem.items():
        verdict = "no warm evaluation (give -n at least 2 per problem)" if f.median_warm_s is None else \
            "met" if f.median_warm_s <= throughput.WARM_MEDIAN_BAR_S else "NOT met"
        shown = "-" if f.median_warm_s is None else f"{f.median_warm_s:.2f} s"
        speed = f"; vs eager {min(f.speedups_vs_eager):.3f}x-{max(f.speedups_vs_eager):.3f}x, median " \
                f"{statistics.median(f.speedups_vs_eager):.3f}x" if f.speedups_vs_eager else ""
        console.print(f"bar: {problem} median warm evaluation {shown} <= {throughput.WARM_MEDIAN_BAR_S:g} s: {verdict}"
                      f"{speed}", soft_wrap=True)


@app.command("throughput")
def throughput_command(
    n: int = typer.Option(32, "-n", min=1, help="Distinct submissions, evaluated once per mode."),
    device: str = typer.Option("cuda", "--device", help="cuda (the reference solutions' CUDA) or cpu (a C++-only "
                               "load_inline submission, for machines without a GPU)."),
    gpu: int = typer.Option(0, "--gpu", min=0, help="With --device cuda: the GPU (index among the visible ones)."),
    compile_workers: int = typer.Option(None, "--compile-workers", min=1, help="The pipelined mode's compile pool "
                                        "(default: the worker's, half the cores up to 8; at least 1)."),
    arch_list: str = typer.Option(None, "--arch-list", help="TORCH_CUDA_ARCH_LIST for every build instead of the "
                                  "GPU's own arch (the default), e.g. '8.0;8.6;9.0': measures what the default "
                                  "saves."),
    serial_n: int = typer.Option(None, "--serial-n", min=1, help="Run the serial mode on the first K of the N "
                                 "submissions only (default: all N): N serial CUDA builds can outlast the time at "
                                 "hand, and serial evaluations per hour are a rate."),
    modes: str = typer.Option(None, "--modes", help="The modes to run, in this order: serial, pipelined, warm "
                              "(without pipelined, warm builds first, untimed). Default: all three; warm alone where a "
                              "--problem's submissions are A/A copies, which build nothing: serial and pipelined "
                              "measure builds, and are refused for them. Each mode's figures are printed, and written "
                              "to --json, as soon as it ends."),
    solutions_dir: Path = typer.Option(None, "--solutions-dir", exists=True, file_okay=False,
                                       help="Reference solutions to vary (default: reference_solutions/, for the "
                                       "six built-in level-2 problems), named levelN_M_*.py."),
    problems: list[str] = typer.Option([], "--problem", help="Only this problem's submissions (e.g. level2/75; "
                                       "repeat for more). On --device cuda, variants of its reference solution in "
                                       "--solutions-dir where it has one; else (and on --device cpu) copies of its "
                                       "own reference as ModelNew (A/A: pure PyTorch, warm mode only)."),
    problems_dir: Path = typer.Option(None, "--problems-dir", exists=True, file_okay=False,
                                      help="A KernelBench folder (KernelBench/KernelBench, or one level of it) "
                                      "whose problems --problem names (level1/19, level3/1): they join the built-in "
                                      "ones, and a folder's problem replaces the built-in of the same id (level2/75: "
                                      "the folder's file, with the reference solution of that id, if any)."),
    work_dir: Path = typer.Option(None, "--work-dir", file_okay=False, help="Keep each mode's data dir (builds, "
                                  "logs, queue) under this new folder (default: a temp dir, removed)."),
    json_out: Path = typer.Option(None, "--json", dir_okay=False, help="Also write the report as JSON here."),
    log_level: str = typer.Option("warning", "--log-level"),
) -> None:
    """Evaluate N distinct submissions serially (compile, then run, one at a time) and pipelined (the worker's
    compile pool building ahead of the device slot), each mode with a fresh build cache; then warm (the same
    submissions again, builds cached, problem by problem, as an RL loop sends them); report all three.

    Examples:

      harness bench throughput -n 32 --device cuda --json throughput.json

      harness bench throughput -n 32 --serial-n 6 --device cuda   (serial on one variant of each solution)

      harness bench throughput -n 3 --device cpu

      harness bench throughput -n 15 --problems-dir KernelBench/KernelBench --problem level2/75 --problem level1/19
      --problem level3/1 --device cuda   (warm: level2/75's solution, the others' A/A copies, 5 of each)
    """
    setup_logging(log_level)
    if device not in ("cuda", "cpu"):
        typer.echo("error: --device takes cuda or cpu", err=True)
        raise typer.Exit(2)
    if serial_n is not None and serial_n > n:
        typer.echo(f"error: --serial-n ({serial_n}) cannot exceed -n ({n})", err=True)
        raise typer.Exit(2)
    if arch_list and device != "cuda":
        typer.echo("error: --arch-list needs --device cuda (a C++-only build has no CUDA arch)", err=True)
        raise typer.Exit(2)
    if problems_dir is not None and not problems:
        typer.echo("error: --problems-dir needs --problem: the folder's problems to measure (e.g. level1/19)", err=True)
        raise typer.Exit(2)
    settings = settings_with()
    folder = problems_dir.resolve() if problems_dir is not None else settings.problems_dir
    registry = get_registry(folder)
    try:
        variants = throughput.make_variants(n, device, registry, solutions_dir, problems=problems)
    except UnknownProblem as e:
        where = f"in {folder} nor the built-ins" if folder is not None else "among the built-ins (see --problems-dir)"
        typer.echo(f"error: --problem: {e} (not {where})", err=True)
        raise typer.Exit(2) from None
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    chosen = [m.strip() for m in modes.split(",") if m.strip()] if modes is not None else \
        list(throughput.default_modes(variants))
    try:
        throughput.check_modes(chosen, variants)
    except ValueError as e:
        typer.echo(f"error: --modes: {e}", err=True)
        raise typer.Exit(2) from None
    console = Console()
    with tempfile.TemporaryDirectory(prefix="kh-bench-") as tmp, \
            Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     console=Console(stderr=True)) as bar:
        tasks = {m: bar.add_task(m, total=total) for m, total in (("serial", serial_n or n), ("pipelined", n),
                                                                   ("warm", n)) if m in chosen}

        def mode_done(rep: throughput.ThroughputReport) -> None:
            m = rep.modes[-1]
            bar.console.print(f"{m.mode} done: {m.submissions} evaluations in {m.wall_s:.1f} s, "
                              f"{m.evals_per_hour:.1f} an hour, verdicts "
                              + ", ".join(f"{k} {v}" for k, v in sorted(m.verdicts.items())), soft_wrap=True)
            if json_out is not None:  # so far: a run its time limit cuts off still leaves these
                json_out.write_text(rep.model_dump_json(indent=2) + "\n")

        shown: dict[str, int] = {}
        started = time.monotonic()

        def advance(mode: str, done: int, total: int) -> None:
            bar.update(tasks[mode], completed=done)
            if not bar.console.is_terminal and shown.get(mode) != done:  # a log: a line as the count moves
                shown[mode] = done
                bar.console.print(f"{mode}: {done} of {total} done at {time.monotonic() - started:.0f} s")

        def evaluated(mode: str, problem: str, seconds: float, result: EvalResult | None) -> None:
            if not bar.console.is_terminal:  # which of a cut-off run's evaluations were warm, and how long each took
                obs = result.observations if result is not None else None
                warm = ", ".join(what for what, yes in (("trusted process warm", obs and obs.trusted_warm),
                                                         ("candidate started ahead", obs and obs.candidate_ahead))
                                 if yes)
                warm = f" ({warm})" if warm else ""
                verdict = result.verdict.value if result is not None else "no result (the evaluation raised)"
                bar.console.print(f"{mode}: {problem} evaluated in {seconds:.1f} s{warm}: {verdict}")

        try:
            rep = throughput.run_bench(variants, settings, registry, work_dir or Path(tmp), device=device, gpu=gpu,
                                       compile_workers=compile_workers, arch_list=arch_list, serial_n=serial_n,
                                       modes=chosen, on_mode=mode_done,
                                       progress=advance, on_evaluation=evaluated)
        except (SlotError, ValueError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        except RuntimeError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
    render(rep, console)
    if json_out is not None:
        json_out.write_text(rep.model_dump_json(indent=2) + "\n")
        typer.echo(f"report written to {json_out}", err=True)
