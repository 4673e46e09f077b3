"""`harness worker`: evaluate queued submissions, one slot per GPU, with a CPU compile pool."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import typer

from harness.db.session import Database
from harness.problems import get_registry
from harness.service.devices import SlotError
from harness.service.runtime import make_worker, settings_with, setup_logging

GpusOption = typer.Option("all", "--gpus", help="all (every visible GPU; the CPU when there is none), none (CPU "
                          "only), or indices such as 0,1. One evaluation slot per GPU.")


def _watch_parent(pid: int, stop) -> None:
    """Stop when the process that started us is gone (a killed `harness serve` leaves no orphan worker)."""
    def loop() -> None:
        while os.getppid() == pid:
            threading.Event().wait(1.0)
        stop()
    threading.Thread(target=loop, name="watch-parent", daemon=True).start()


def worker_command(
    gpus: str = GpusOption,
    compile_workers: int = typer.Option(None, "--compile-workers", min=0,
                                        help="Threads precompiling load_inline code ahead of the slots "
                                        "(default: half the cores up to 8 with GPUs, 0 on a CPU)."),
    exit_when_idle: float = typer.Option(None, "--exit-when-idle", min=0,
                                         help="Exit after this many seconds without a job."),
    database_url: str = typer.Option(None, "--database-url", help="SQLAlchemy URL (default: the SQLite file in "
                                     "the data dir)."),
    problems_dir: Path = typer.Option(None, "--problems-dir", exists=True, file_okay=False,
                                      help="A KernelBench-format folder whose problems this worker can evaluate."),
    batch: str = typer.Option(None, "--batch", hidden=True, help="Claim only jobs of this batch."),
    exit_with_parent: int = typer.Option(None, "--exit-with-parent", hidden=True,
                                         help="Stop when the process with this pid is no longer our parent."),
    allow_unsafe_sandbox: bool = typer.Option(
        None, "--allow-unsafe-sandbox", help="Run even where submissions cannot be kept off the network or (as "
        "root) given a user of their own (HARNESS_ALLOW_UNSAFE_SANDBOX). See docs/security.md."),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Claim jobs from the queue and evaluate them, one slot per GPU, until stopped.

    Ctrl-C or SIGTERM let evaluations in progress finish (10 s at most) and hand back the other jobs in hand.

    Examples:

      harness worker                      # every GPU of this machine, or the CPU without one

      harness worker --gpus 0,1           # GPUs 0 and 1 only

      harness worker --database-url postgresql://host/harness   # a shared queue (PostgreSQL: issue 8)
    """
    setup_logging(log_level)
    settings = settings_with(database_url=database_url, problems_dir=problems_dir,
                             allow_unsafe_sandbox=allow_unsafe_sandbox)
    db = Database(settings)
    try:
        worker = make_worker(db, settings, get_registry(settings.problems_dir), gpus,
                             compile_workers=compile_workers, batch=batch, exit_when_idle_s=exit_when_idle)
    except SlotError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except RuntimeError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None

    def on_signal(signum, _frame) -> None:
        if worker.stopping and signum == signal.SIGINT:
            os._exit(130)  # a second Ctrl-C: leave now; the leases of jobs in hand expire and they are requeued
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if exit_with_parent:
        _watch_parent(exit_with_parent, worker.stop)
    stats = worker.run()
    db.dispose()
    verdicts = ", ".join(f"{k} {v}" for k, v in sorted(stats.verdicts.items())) or "none"
    typer.echo(f"worker {worker.id} stopped: {stats.completed} results ({verdicts}), {stats.retried} retried, "
               f"{stats.released} handed back", err=True)
