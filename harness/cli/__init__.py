"""The `harness` command: a thin layer over library functions. No torch is imported here."""

from __future__ import annotations

import typer

from harness.cli import bench as bench_cmd
from harness.cli import db as db_cmd
from harness.cli import demo as demo_cmd
from harness.cli import eval as eval_cmd
from harness.cli import eval_dir as eval_dir_cmd
from harness.cli import export as export_cmd
from harness.cli import problems as problems_cmd
from harness.cli import reeval as reeval_cmd
from harness.cli import selfcheck as selfcheck_cmd
from harness.cli import serve as serve_cmd
from harness.cli import tokens as tokens_cmd
from harness.cli import worker as worker_cmd

app = typer.Typer(
    help="KernelHarness: evaluate LLM-written GPU kernels (KernelBench ModelNew files) against reference models.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(problems_cmd.app, name="problems")
app.command("eval")(eval_cmd.eval_command)
app.command("serve")(serve_cmd.serve_command)
app.command("worker")(worker_cmd.worker_command)
app.command("reeval")(reeval_cmd.reeval_command)
app.command("eval-dir")(eval_dir_cmd.eval_dir_command)
app.add_typer(tokens_cmd.app, name="tokens")
app.add_typer(export_cmd.app, name="export")
app.add_typer(db_cmd.app, name="db")
app.command("demo-seed")(demo_cmd.demo_seed_command)
app.add_typer(bench_cmd.app, name="bench")
app.command("selfcheck")(selfcheck_cmd.selfcheck_command)


def main() -> None:
    app()
