"""`harness reeval`: evaluate stored submissions again, or re-grade their stored figures (no GPU)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.cli.common import aligned
from harness.config import Settings
from harness.db import queries
from harness.db.models import UNFINISHED_STATUSES
from harness.db.session import Database
from harness.problems import UnknownProblem, find_problem, get_registry
from harness.problems.spec import V01_TOLERANCE
from harness.service import reeval
from harness.service.runtime import settings_with, setup_logging
from harness.verdicts import Verdict


def _summary(title: str, rows: list[tuple[str, str, str, int]], console: Console, dry_run: bool = False) -> None:
    """The title, then one line per (verdict before, verdict after, what happened)."""
    console.print(title, soft_wrap=True)
    table = Table()
    for col in ("verdict before", "verdict after", "what would happen" if dry_run else "what happened", "submissions"):
        table.add_column(col)
    for before, after, what, n in sorted(rows):
        table.add_row(before, after, what, str(n))
    console.print(table)


def _regrade_report(summary: reeval.RegradeSummary, under: str, undo: bool, console: Console) -> None:
    verb = "would " if summary.dry_run else ""
    if undo:
        title = (f"{summary.matched} results matched: {summary.restored} {verb}go back to the grading before their "
                 f"latest re-grade, {summary.skipped} have no re-grade to undo")
    else:
        title = (f"{summary.matched} results matched, re-graded under {under}: {summary.verdicts_changed} verdicts "
                 f"{verb}change, {summary.count(reeval.Outcome.same_verdict)} {verb}keep their verdict (a new revision "
                 f"records the tolerance), {summary.unchanged} unchanged, {summary.skipped} without figures that a "
                 "tolerance applies to (left as they are)")
    if summary.dry_run:
        title += "\ndry run: nothing was written"
    elif summary.regraded:
        title += ("\neach result shows the tolerance it was graded at; the previous grading is kept: "
                  "`harness reeval --undo` with the same filters restores it")
    _summary(title, [(b, a, o.value, n) for (b, a, o), n in summary.transitions.items()], console, summary.dry_run)


def follow_jobs(db: Database, settings: Settings, job_ids: list[int], *,
                on_done: Callable[[int], None] | None = None, interrupted: str = "") -> None:
    """A progress bar until the jobs are done; `on_done(done)` each time more of them are done. A job that takes long
    is said (which, in which state, for how long). Ctrl-C is the caller's (KeyboardInterrupt)."""
    last = -1

    def progressed(done: int, _total: int) -> None:
        nonlocal last
        bar.update(task, completed=done)
        if on_done is not None and done != last:
            last = done
            on_done(done)

    with Progress(TextColumn("evaluating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True)) as bar:
        task = bar.add_task("jobs", total=len(job_ids))
        reeval.wait_for_jobs(db, job_ids, progress=progressed, stalled=lambda secs: bar.console.print(
            reeval.stall_report(db, job_ids, secs, settings.worker_silent_after_s) + interrupted, soft_wrap=True))


def watch_jobs(db: Database, settings: Settings, job_ids: list[int]) -> None:
    """`follow_jobs`; Ctrl-C stops watching (exit 130), the jobs stay queued."""
    try:
        follow_jobs(db, settings, job_ids, interrupted=". Ctrl-C stops watching; the jobs stay queued")
    except KeyboardInterrupt:
        typer.echo("stopped watching; the jobs stay queued", err=True)
        raise typer.Exit(130) from None


def _requeue_preview(db: Database, f: queries.SubmissionFilter, shown: int = 200) -> None:
    """Which submissions a requeue would queue, and which it would leave as they are (already queued or running)."""
    with db.session() as s:
        rows, total = queries.list_submissions(s, f, limit=shown, offset=0, with_text=False)
        lines = aligned(["submission", "problem", "submitter", "model", "verdict now", "would be"],
                        [[str(sub.id), sub.problem_id, sub.submitter, sub.model, sub.verdict or "-",
                          "left as it is (already " + sub.status + ")" if sub.status in UNFINISHED_STATUSES
                          else "queued again"] for sub, _res in reversed(rows)], right=frozenset({0}))
    for line in lines if rows else []:
        typer.echo(line)
    more = f" (the {shown} newest listed)" if total > shown else ""
    typer.echo(f"{total} submissions match{more}; dry run: nothing queued", err=True)


def reeval_command(
    problem: str = typer.Option(None, "--problem", "-p", help="Only this problem (slug, KernelBench id or "
                                 "the path of its file)."),
    verdict: Verdict = typer.Option(None, "--verdict", help="Only submissions whose current verdict is this."),
    since: datetime = typer.Option(None, "--since", help="Only submissions made at or after this UTC date/time."),
    regrade_only: bool = typer.Option(False, "--regrade-only", help="Grade the stored figures again (no GPU, no "
                                      "worker) under the problems' current tolerance or the one given."),
    atol: float = typer.Option(None, "--atol", min=0.0, help="With --regrade-only: absolute tolerance."),
    rtol: float = typer.Option(None, "--rtol", min=0.0, help="With --regrade-only: relative tolerance."),
    v01: bool = typer.Option(False, "--v01-tolerance", help="With --regrade-only: KernelBench v0.1's 1e-2."),
    undo: bool = typer.Option(False, "--undo", help="Restore the grading each matching result had before its "
                              "latest re-grade."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would change; write and queue nothing."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Watch the queued jobs until they are done."),
    problems_dir: Path = typer.Option(None, "--problems-dir", exists=True, file_okay=False),
    database_url: str = typer.Option(None, "--database-url"),
) -> None:
    """Evaluate stored submissions again through the queue, or re-grade their stored figures (no GPU).

    Shows progress, then a table of verdicts before and after.

    Examples:

      harness reeval --verdict infra_error                 # run them again

      harness reeval --problem level2/75 --regrade-only --v01-tolerance --dry-run

      harness reeval --problem level2/75 --undo            # back to the grading before the re-grade

      harness reeval --since 2026-01-01 --no-wait
    """
    setup_logging("warning")
    console = Console()
    if (atol is not None or rtol is not None or v01) and not regrade_only:
        raise typer.BadParameter("a tolerance applies to --regrade-only", param_hint="--atol/--rtol/--v01-tolerance")
    if undo and regrade_only:
        raise typer.BadParameter("--undo restores the grading before a re-grade; give it without --regrade-only",
                                 param_hint="--undo")
    settings = settings_with(database_url=database_url, problems_dir=problems_dir)
    registry = get_registry(settings.problems_dir)
    problem_id = None
    if problem is not None:
        try:
            problem_id = find_problem(registry, problem).id
        except UnknownProblem as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
    f = queries.SubmissionFilter(problem_id=problem_id, verdict=verdict.value if verdict else None, since=since)
    db = Database(settings)
    if undo:
        with db.session() as s:
            _regrade_report(reeval.undo_regrade(s, f, dry_run=dry_run), "", True, console)
        return
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
                    s, registry, f, tolerance=tolerance, dry_run=dry_run,
                    progress=lambda done, total: bar.update(task, completed=done, total=total))
        _regrade_report(summary, str(tolerance) if tolerance else "each problem's tolerance", False, console)
        return
    if dry_run:
        _requeue_preview(db, f)
        return
    with db.session() as s:
        queued = reeval.requeue(s, settings, f)
    typer.echo(f"{queued.matched} submissions matched; {len(queued.job_ids)} queued"
               + (f", {queued.already_queued} already queued or running" if queued.already_queued else ""), err=True)
    if not wait or not queued.job_ids:
        return
    watch_jobs(db, settings, queued.job_ids)
    _summary(f"re-evaluated {len(queued.job_ids)} submissions",
             [(b, a, "same verdict" if a == b else "verdict changed", n)
              for (b, a), n in reeval.verdict_transitions(db, queued.verdict_before).items()], console)
