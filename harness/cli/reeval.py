"""`harness reeval`: evaluate stored submissions again, or re-grade their stored figures (no GPU)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.db import queries
from harness.db.session import Database
from harness.problems import UnknownProblem, get_registry
from harness.problems.spec import V01_TOLERANCE
from harness.service import reeval
from harness.service.runtime import settings_with, setup_logging
from harness.verdicts import Verdict


def _summary(title: str, transitions: Counter[tuple[str, str]], console: Console) -> None:
    console.print(title, soft_wrap=True)
    table = Table()
    for col in ("verdict before", "verdict after", "submissions"):
        table.add_column(col)
    for (before, after), n in sorted(transitions.items()):
        table.add_row(before, after if after != before else f"{after} (same)", str(n))
    console.print(table)


def watch_jobs(db: Database, job_ids: list[int]) -> None:
    """A progress bar until the jobs are done; Ctrl-C stops watching (exit 130), the jobs stay queued."""
    try:
        with Progress(TextColumn("evaluating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=Console(stderr=True)) as bar:
            task = bar.add_task("jobs", total=len(job_ids))
            reeval.wait_for_jobs(db, job_ids, progress=lambda done, _t: bar.update(task, completed=done),
                                 stalled=lambda secs: bar.console.print(
                                     f"no job has moved for {secs:.0f} s: is a worker running (`harness serve` or "
                                     "`harness worker`)? Ctrl-C stops watching; the jobs stay queued"))
    except KeyboardInterrupt:
        typer.echo("stopped watching; the jobs stay queued", err=True)
        raise typer.Exit(130) from None


def reeval_command(
    problem: str = typer.Option(None, "--problem", "-p", help="Only this problem (slug or KernelBench id)."),
    verdict: Verdict = typer.Option(None, "--verdict", help="Only submissions whose current verdict is this."),
    since: datetime = typer.Option(None, "--since", help="Only submissions made at or after this UTC date/time."),
    regrade_only: bool = typer.Option(False, "--regrade-only", help="Grade the stored figures again (no GPU, no "
                                      "worker) under the problems' current tolerance or the one given."),
    atol: float = typer.Option(None, "--atol", min=0.0, help="With --regrade-only: absolute tolerance."),
    rtol: float = typer.Option(None, "--rtol", min=0.0, help="With --regrade-only: relative tolerance."),
    v01: bool = typer.Option(False, "--v01-tolerance", help="With --regrade-only: KernelBench v0.1's 1e-2."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Watch the queued jobs until they are done."),
    problems_dir: Path = typer.Option(None, "--problems-dir", exists=True, file_okay=False),
    database_url: str = typer.Option(None, "--database-url"),
) -> None:
    """Evaluate stored submissions again through the queue, or re-grade their stored figures (no GPU).

    Shows progress, then a table of verdicts before and after.

    Examples:

      harness reeval --verdict infra_error                 # run them again

      harness reeval --problem level2/75 --regrade-only --v01-tolerance

      harness reeval --since 2026-01-01 --no-wait
    """
    setup_logging("warning")
    console = Console()
    if (atol is not None or rtol is not None or v01) and not regrade_only:
        raise typer.BadParameter("a tolerance applies to --regrade-only", param_hint="--atol/--rtol/--v01-tolerance")
    settings = settings_with(database_url=database_url, problems_dir=problems_dir)
    registry = get_registry(settings.problems_dir)
    problem_id = None
    if problem is not None:
        try:
            problem_id = registry.get(problem).id
        except UnknownProblem as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
    f = queries.SubmissionFilter(problem_id=problem_id, verdict=verdict.value if verdict else None, since=since)
    db = Database(settings)
    if regrade_only:
        try:
            tolerance = reeval.tolerance_from(atol, rtol, V01_TOLERANCE if v01 else None)
        except ValidationError:
            raise typer.BadParameter("atol must be > 0 and rtol >= 0", param_hint="--atol/--rtol") from None
        with Progress(TextColumn("re-grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=Console(stderr=True)) as bar:
            task = bar.add_task("regrade", total=None)
            with db.session() as s:
                summary = reeval.regrade_matching(
                    s, registry, f, tolerance=tolerance,
                    progress=lambda done, total: bar.update(task, completed=done, total=total))
        under = str(tolerance) if tolerance else "each problem's tolerance"
        _summary(f"re-graded {summary.matched} results under {under}: {summary.regraded} changed, {summary.unchanged} "
                 f"unchanged, {summary.skipped} without figures (skipped)", summary.transitions, console)
        return
    with db.session() as s:
        queued = reeval.requeue(s, settings, f)
    typer.echo(f"{queued.matched} submissions matched; {len(queued.job_ids)} queued"
               + (f", {queued.already_queued} already queued or running" if queued.already_queued else ""), err=True)
    if not wait or not queued.job_ids:
        return
    watch_jobs(db, queued.job_ids)
    _summary(f"re-evaluated {len(queued.job_ids)} submissions", reeval.verdict_transitions(db, queued.verdict_before),
             console)
