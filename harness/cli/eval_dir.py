"""`harness eval-dir`: evaluate a folder of KernelBench-layout generations, store them, report fast_p."""

from __future__ import annotations

import getpass
import threading
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from harness.cli.common import ProblemsDirOption, require_cuda
from harness.cli.reeval import watch_jobs
from harness.config import Settings
from harness.db.session import Database
from harness.problems import get_registry
from harness.service import batch as batch_mod
from harness.service.devices import SlotError
from harness.service.runtime import make_worker, settings_with, setup_logging


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}x"


def render(rep: batch_mod.EvalDirReport, console: Console) -> None:
    console.print(f"{rep.run}: {rep.model} ({rep.submitter})", soft_wrap=True)
    table = Table()
    # Fixed columns keep their width; the message takes what the terminal has left.
    for col, width in (("problem", 10), ("sample", 6), ("verdict", 18), ("vs eager", 8), ("vs compile", 10)):
        table.add_column(col, no_wrap=True, min_width=width)
    table.add_column("message", no_wrap=True, overflow="ellipsis", max_width=max(8, console.width - 76))
    for p in rep.problems:
        for smp in p.samples:
            table.add_row(p.kernelbench_id or p.problem_id, str(smp.sample), smp.verdict or "-",
                          _fmt(smp.speedup_vs_eager), _fmt(smp.speedup_vs_compile), smp.message or "")
    console.print(table)
    for device, fp in rep.fast_p.items():
        label = {"cpu": "CPU results (small sizes; not comparable with GPU results)", "cuda": "GPU results"}.get(
            device, "no evaluation ran")
        console.print(f"fast_p over {fp.problems} problems, {label}; {rep.fast_p_basis}", soft_wrap=True)
        t = Table()
        t.add_column("p")
        t.add_column("vs eager")
        t.add_column("vs torch.compile")
        for p in rep.thresholds:
            key = f"{p:g}"
            t.add_row(key, f"{fp.eager.get(key, 0.0):.3f}",
                      f"{fp.compile[key]:.3f}" if fp.compile is not None else "not timed")
        console.print(t)
    if rep.not_evaluated:
        console.print(f"not evaluated (unknown problems; pass --problems-dir): {', '.join(rep.not_evaluated)}",
                      soft_wrap=True)


def slot_choice(device: str, gpus: str | None, settings: Settings) -> str:
    """The worker's --gpus value for `--device` and `--gpus` (kept as it was before --device existed)."""
    if device not in ("auto", "cpu", "cuda"):
        raise typer.BadParameter("use auto, cpu or cuda", param_hint="--device")
    choice = (gpus or "all").strip().lower()
    runs_on_cpu = choice in ("none", "cpu")
    if device == "cpu":
        if gpus is not None and not runs_on_cpu:
            raise typer.BadParameter(f"--device cpu uses no GPU; leave out --gpus {gpus}", param_hint="--gpus")
        return "none"
    if device == "cuda":
        if runs_on_cpu:
            raise typer.BadParameter(f"--gpus {gpus} runs on the CPU; leave it out with --device cuda",
                                     param_hint="--gpus")
        require_cuda(settings)
    return choice


def eval_dir_command(
    folder: Path = typer.Argument(..., exists=True, file_okay=False, help="A folder such as runs/<name>/."),
    model: str = typer.Option(None, "--model", help="Model name stored with the results (default: the folder's "
                              "name)."),
    submitter: str = typer.Option(None, "--submitter", help="Submitter stored with the results (default: you)."),
    device: str = typer.Option("auto", "--device", help="auto (every visible GPU, else the CPU) | cpu | cuda "
                               "(an error when no GPU is visible)."),
    gpus: str = typer.Option(None, "--gpus", help="GPU indices such as 0,1 (one slot each; default: all); "
                             "`--gpus none` is `--device cpu`."),
    compile_workers: int = typer.Option(None, "--compile-workers", min=0),
    via_queue: bool = typer.Option(False, "--via-queue", help="Queue the jobs for the running service's workers "
                                   "instead of evaluating here (do so when `harness serve` uses these GPUs)."),
    json_out: Path = typer.Option(None, "--json", dir_okay=False, help="Also write the report as JSON here."),
    problems_dir: Path = ProblemsDirOption,
    database_url: str = typer.Option(None, "--database-url"),
    log_level: str = typer.Option("warning", "--log-level"),
) -> None:
    """Evaluate a folder of KernelBench generations (level_<L>_problem_<N>_sample_<S>_kernel.py); report fast_p.

    The results are stored like any submission and printed per problem, with fast_p at p = 0, 0.5, 0.8, 1,
    1.5, 2 against eager and torch.compile.

    Examples:

      harness eval-dir runs/my_run/ --model my-llm --json my_run.json

      harness eval-dir runs/my_run/ --problems-dir ~/KernelBench/KernelBench --gpus 0,1

      harness eval-dir runs/my_run/ --device cpu        # no GPU: the problems' small sizes
    """
    setup_logging(log_level)
    console = Console(stderr=False)
    settings = settings_with(database_url=database_url, problems_dir=problems_dir)
    slots = None if via_queue else slot_choice(device, gpus, settings)
    registry = get_registry(settings.problems_dir)
    gens, _others = batch_mod.scan(folder, registry)
    if not gens:
        typer.echo(f"error: no file in {folder} is named level_<L>_problem_<N>_sample_<S>_kernel.py", err=True)
        raise typer.Exit(2)
    run = folder.resolve().name
    model = model or run
    submitter = submitter or getpass.getuser()
    known = [g for g in gens if g.spec is not None]
    if len(known) < len(gens):
        typer.echo(f"warning: {len(gens) - len(known)} files are for problems this harness does not know "
                   "(pass --problems-dir with a KernelBench folder); they are not evaluated", err=True)
    db = Database(settings)
    worker = None
    if slots is not None and known:
        try:  # before anything is stored: a bad --gpus leaves no orphan jobs behind
            worker = make_worker(db, settings, registry, slots, compile_workers=compile_workers)
        except (SlotError, RuntimeError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
    batch, by_job = batch_mod.store(db, settings, gens, run=run, submitter=submitter, model=model)
    thread = None
    if worker is not None:
        worker.batch = batch  # claims this run's jobs only
        thread = threading.Thread(target=worker.run, name="eval-dir-worker", daemon=True)
        thread.start()
    beyond = batch_mod.needing_more(db, list(by_job), worker.accepts()) if worker is not None else {}
    if beyond:
        typer.echo(f"warning: {len(beyond)} files need what this machine's worker has not ("
                   f"{', '.join(sorted(set(beyond.values())))}): they stay queued for a worker that has it and are "
                   "not evaluated here", err=True)
    try:
        watch_jobs(db, [j for j in by_job if j not in beyond])
    finally:
        if worker is not None and thread is not None:
            worker.stop()
            thread.join()
    rep = batch_mod.report(db, batch, gens, run=run, folder=folder, submitter=submitter, model=model)
    render(rep, console)
    if json_out is not None:
        json_out.write_text(rep.model_dump_json(indent=2) + "\n")
        typer.echo(f"report written to {json_out}", err=True)
    db.dispose()
