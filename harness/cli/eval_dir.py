"""`harness eval-dir`: evaluate a folder of KernelBench-layout generations, store them, report fast_p."""

from __future__ import annotations

import getpass
import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.cli.common import ProblemsDirOption, require_cuda
from harness.cli.export import read_baseline_file
from harness.cli.reeval import follow_jobs
from harness.config import Settings
from harness.db.session import Database
from harness.kernelbench_format import BaselineFile
from harness.precision import PRECISIONS
from harness.problems import Registry, get_registry
from harness.service import batch as batch_mod
from harness.service.devices import SlotError
from harness.service.kernelbench import KernelBenchReport
from harness.service.runtime import make_worker, settings_with, setup_logging
from harness.service.worker import Worker


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}x"


def render(rep: batch_mod.EvalDirReport, console: Console) -> None:
    console.print(f"{rep.run}: {rep.model} ({rep.submitter}), at {rep.precision}", soft_wrap=True)
    table = Table()
    for col, width in (("problem", 10), ("sample", 6), ("verdict", 18), ("vs eager", 8), ("vs compile", 10)):
        table.add_column(col, no_wrap=True, min_width=width)
    table.add_column("flags")  # wraps: the messages go below the table
    for p in rep.problems:
        for smp in p.samples:
            table.add_row(p.kernelbench_id or p.problem_id, str(smp.sample), smp.verdict or "-",
                          _fmt(smp.speedup_vs_eager), _fmt(smp.speedup_vs_compile), flag_cell(smp.flags))
    console.print(table)
    render_messages(rep, console)
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
    if rep.kernelbench is not None:
        render_kernelbench(rep.kernelbench, console)


# Flags that keep a speedup from counting, shortened for the table; the JSON has every flag as it is.
_SHORT = {"timing_unreliable": "unreliable time", "shared_gpu": "shared GPU", "no_custom_kernel": "no custom kernel",
          "degenerate_tolerance": "degenerate tolerance", "precision_below_fp32": "lower precision"}


def flag_cell(flags: list[str]) -> str:
    return ", ".join(_SHORT.get(f, f) for f in flags)


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def render_kernelbench(kb: KernelBenchReport, console: Console) -> None:
    """KernelBench's metrics of the run, by its definitions, beside our own fast_p above: one column per level,
    so that the table fits a narrow terminal."""
    console.print(f"KernelBench's metrics, by its definitions (every problem of the level, sample 0 of each; "
                  f"README, \"Metrics\"), on {kb.device_name or kb.device}, {kb.size} size; baseline: "
                  f"{kb.baseline_source}", soft_wrap=True)
    if not kb.levels:
        return
    t = Table()
    t.add_column("KernelBench's")
    for m in kb.levels:
        t.add_column(f"level {m.level}", justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("problems (all of the level)", [str(m.problems) for m in kb.levels]),
        ("with a sample 0", [str(m.evaluated) for m in kb.levels]),
        ("compilation rate", [_rate(m.compilation_rate) for m in kb.levels]),
        ("correctness rate", [_rate(m.correctness_rate) for m in kb.levels]),
        *[(f"fast_{p}", [_rate(m.fast_p.get(p)) for m in kb.levels]) for p in kb.levels[0].fast_p],
        ("geomean speedup, correct", [_fmt(m.geomean_speedup_correct) for m in kb.levels]),
        ("geomean speedup, correct and faster", [_fmt(m.geomean_speedup_correct_and_faster) for m in kb.levels]),
        *[(k, [_rate(m.pass_at_k.get(k)) for m in kb.levels])
          for k in sorted({k for m in kb.levels for k in m.pass_at_k})],
    ]
    for name, cells in rows:
        t.add_row(name, *cells)
    console.print(t)
    for m in kb.levels:
        notes = []
        if m.unvouched:
            notes.append(f"{m.unvouched} correct with a time not vouched for (counted as correct, not as faster)")
        if m.no_baseline:
            notes.append(f"no baseline time for problem{'s' if len(m.no_baseline) > 1 else ''} "
                         f"{', '.join(map(str, m.no_baseline))} (correct, not counted as faster)")
        if notes:
            console.print(f"level {m.level}: " + "; ".join(notes), soft_wrap=True)
    left = {k: v for k, v in kb.left_out.model_dump().items() if v}
    if left:
        console.print("left out of KernelBench's metrics: " + ", ".join(f"{v} {k.replace('_', ' ')}"
                                                                      for k, v in left.items()), soft_wrap=True)


def kernelbench_baseline_option(path: Path | None) -> tuple[BaselineFile | None, str | None]:
    """The --kernelbench-baseline file, read before anything is evaluated (a bad one is a usage error), and its
    label."""
    if path is None:
        return None, None
    baseline = read_baseline_file(path)
    return baseline, f"{path} ({', '.join(baseline.hardware()) or 'hardware not named'})"


def attach_kernelbench(rep: batch_mod.EvalDirReport, db: Database, registry: Registry,
                       baseline: tuple[BaselineFile | None, str | None], json_path: Path | None) -> None:
    """KernelBench's metrics into the report; its eval results written to `json_path` (one level: that file;
    several: <stem>_level<L>.json beside it)."""
    rep.kernelbench, per_level = batch_mod.kernelbench_view(db, registry, rep.batch, *baseline)
    if json_path is None:
        return
    for level, results in per_level.items():
        path = json_path if len(per_level) == 1 else json_path.with_name(f"{json_path.stem}_level{level}.json")
        path.write_text(json.dumps(results, indent=2) + "\n")
        typer.echo(f"KernelBench eval results written to {path}", err=True)


def unknown_warning(unknown: list[batch_mod.Generation], shown: int = 10) -> str:
    """Names each file whose problem this harness does not know, with the problem it names."""
    files = [f"{g.path.name} (unknown problem {g.kernelbench_id!r})" for g in unknown[:shown]]
    more = f" and {len(unknown) - shown} more" if len(unknown) > shown else ""
    return (f"warning: {len(unknown)} files are not evaluated, for problems this harness does not know: "
            f"{', '.join(files)}{more}. Pass --problems-dir with a KernelBench folder that has them")


def render_messages(rep: batch_mod.EvalDirReport, console: Console) -> None:
    """The messages of the samples that did not pass, below the table and wrapped to the terminal: in a table
    column an 80-column terminal or a pipe cut them to a few characters."""
    failed = [(p.kernelbench_id or p.problem_id, smp) for p in rep.problems for smp in p.samples
              if smp.verdict != "passed" and smp.message]
    if not failed:
        return
    console.print("why the others did not pass:")
    for problem, smp in failed:
        # Plain text: a message quotes the submission's output, which must not be read as console markup.
        console.print(Text(f"  {problem} sample {smp.sample} ({smp.verdict}): {smp.message}"))


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
    json_out: Path = typer.Option(None, "--json", dir_okay=False, help="Also write the report as JSON here (written "
                                  "again as each result comes)."),
    kernelbench_json: Path = typer.Option(None, "--kernelbench-json", dir_okay=False, help="Also write the results "
                                          "as KernelBench's eval_results.json here."),
    kernelbench_baseline: Path = typer.Option(None, "--kernelbench-baseline", exists=True, dir_okay=False,
                                              help="A KernelBench baseline-time file (results/timing/<hardware>/"
                                              "<baseline>.json) for KernelBench's metrics (default: the "
                                              "reference's vouched measurements here)."),
    resume: bool = typer.Option(False, "--resume", help="Evaluate only the files without a finished result for the "
                                "same source and model in the database (from an earlier run of the folder, stopped "
                                "with Ctrl-C or not); the report shows those results beside the new ones."),
    precision: str = typer.Option("fp32", "--precision", help="fp32 | fp16 | bf16: every sample evaluated with "
                                  "the inputs and both models cast to it (as KernelBench does), at its tolerance."),
    problems_dir: Path = ProblemsDirOption,
    database_url: str = typer.Option(None, "--database-url"),
    log_level: str = typer.Option("warning", "--log-level"),
) -> None:
    """Evaluate a folder of KernelBench generations (level_<L>_problem_<N>_sample_<S>_kernel.py); report fast_p.

    The results are stored like any submission and printed per problem with their flags, with the harness's
    fast_p at p = 0, 0.5, 0.8, 1, 1.5, 2 against eager and torch.compile, and beside it KernelBench's metrics by
    KernelBench's definitions (every problem of the level, sample 0; see README). A speedup counts as faster
    only where the harness vouches for its time.

    Examples:

      harness eval-dir runs/my_run/ --model my-llm --json my_run.json

      harness eval-dir runs/my_run/ --problems-dir ~/KernelBench/KernelBench --gpus 0,1

      harness eval-dir runs/my_run/ --device cpu        # no GPU: the problems' small sizes

      harness eval-dir runs/my_run/ --resume            # after Ctrl-C: only what has no result yet

      harness eval-dir runs/my_run/ --kernelbench-json runs/my_run/eval_results.json \\
          --kernelbench-baseline KernelBench/results/timing/H100_Modal/baseline_time_torch.json

    Ctrl-C stops the run: the table so far is printed (and the JSON written), and this run's unfinished
    evaluations are taken out of the queue.
    """
    if precision not in PRECISIONS:
        raise typer.BadParameter(f"use {', '.join(PRECISIONS)}", param_hint="--precision")
    setup_logging(log_level)
    console = Console(stderr=False)
    settings = settings_with(database_url=database_url, problems_dir=problems_dir)
    slots = None if via_queue else slot_choice(device, gpus, settings)
    kb_baseline = kernelbench_baseline_option(kernelbench_baseline)
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
        typer.echo(unknown_warning([g for g in gens if g.spec is None]), err=True)
    db = Database(settings)
    reused = batch_mod.finished_before(db, known, model=model, precision=precision) if resume else {}
    if resume:
        typer.echo(f"--resume: {len(reused)} files have a result for the same source already; "
                   f"{len(known) - len(reused)} to evaluate", err=True)
    to_run = [g for g in known if g.path not in reused]
    worker = None
    if slots is not None and to_run:
        try:  # before anything is stored: a bad --gpus leaves no orphan jobs behind
            worker = make_worker(db, settings, registry, slots, compile_workers=compile_workers)
        except (SlotError, RuntimeError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
    batch, by_job = batch_mod.store(db, settings, to_run, run=run, submitter=submitter, model=model,
                                    precision=precision)

    def snapshot() -> batch_mod.EvalDirReport:
        return batch_mod.report(db, batch, gens, run=run, folder=folder, submitter=submitter, model=model,
                                reused=list(reused.values()), precision=precision)

    def save(_done: int = 0) -> None:
        if json_out is not None:  # as each result comes: a run stopped or killed keeps what it had
            batch_mod.write_report(json_out, snapshot())

    stopped = run_batch(db, settings, worker, batch, list(by_job), save)
    rep = snapshot()
    attach_kernelbench(rep, db, registry, kb_baseline, kernelbench_json)
    render(rep, console)
    if json_out is not None:
        batch_mod.write_report(json_out, rep)  # the last one with KernelBench's metrics
        typer.echo(f"report written to {json_out}", err=True)
    db.dispose()
    if stopped is not None:
        typer.echo(f"stopped (Ctrl-C): the table holds the results so far; {stopped} unfinished evaluations of this "
                   "run were taken out of the queue. `harness eval-dir --resume` with the same folder and model "
                   "evaluates only what has no result", err=True)
        raise typer.Exit(130)


def run_batch(db: Database, settings: Settings, worker: Worker | None, batch: str, job_ids: list[int],
              on_result: Callable[[int], None]) -> int | None:
    """Evaluate the batch's jobs (with the worker, or the service's when None) until all are done. On Ctrl-C: stop
    the worker at once, take the batch's unfinished jobs out of the queue, and return how many (None: not stopped)."""
    thread = None
    if worker is not None:
        worker.batch = batch  # claims this run's jobs only
        thread = threading.Thread(target=worker.run, name="eval-dir-worker", daemon=True)
        thread.start()
    beyond = batch_mod.needing_more(db, job_ids, worker.accepts()) if worker is not None else {}
    if beyond:
        typer.echo(f"warning: {len(beyond)} files need what this machine's worker has not ("
                   f"{', '.join(sorted(set(beyond.values())))}): they stay queued for a worker that has it and are "
                   "not evaluated here", err=True)
    stopped = False
    try:
        follow_jobs(db, settings, [j for j in job_ids if j not in beyond], on_done=on_result,
                    interrupted=". Ctrl-C stops the run and prints the table so far")
    except KeyboardInterrupt:
        stopped = True
    if stopped:
        # A second Ctrl-C while the run is cleaned up and its table printed would lose the table: from here to the
        # exit that follows, it is ignored (a few seconds).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if worker is not None and thread is not None:
        if stopped:
            worker.stop_grace_s = 0.0  # the evaluation in progress is not waited for: its children end with us
        worker.stop()
        thread.join()
    return batch_mod.cancel_unfinished(db, batch) if stopped else None
