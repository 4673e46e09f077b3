"""`harness demo-seed`: fill a database with realistic demo results, to look at the leaderboard pages."""

from __future__ import annotations

import typer

from harness.cli.tokens import DatabaseUrlOption
from harness.db.session import Database
from harness.problems import get_registry
from harness.service.runtime import settings_with


def demo_seed_command(
    seed: int = typer.Option(0, "--seed", help="Random seed: the same seed gives the same results."),
    pending: bool = typer.Option(True, "--pending/--no-pending", help="Also leave one submission queued and one "
                                 "running (a worker would evaluate them: use with `harness serve --no-worker`)."),
    database_url: str = DatabaseUrlOption,
) -> None:
    """Store demo submissions and results: four models, a few attempts at each built-in problem, with the
    failures LLM kernels really have (compile errors, wrong answers, TF32 shortcuts, timeouts, flags).

    They go through the normal queue path and are tagged `demo`; use a data dir of their own.

    Example:

      HARNESS_DATA_DIR=/tmp/kh-demo harness demo-seed && HARNESS_DATA_DIR=/tmp/kh-demo harness serve --no-worker
    """
    from harness import demo

    settings = settings_with(database_url=database_url)
    db = Database(settings)
    with db.session() as s:
        summary = demo.seed_demo(s, [p for p in get_registry(settings.problems_dir).all() if p.builtin], seed=seed,
                                 pending=pending)
    db.dispose()
    verdicts = ", ".join(f"{v} {n}" for v, n in sorted(summary.verdicts.items(), key=lambda kv: -kv[1]))
    typer.echo(f"stored {summary.submissions} demo results ({verdicts})"
               + (f"; submissions {', '.join(map(str, summary.pending))} left queued/running" if summary.pending
                  else ""))
