"""The `harness` command: a thin layer over library functions. No torch is imported here."""

from __future__ import annotations

import typer

from harness.cli import eval as eval_cmd
from harness.cli import problems as problems_cmd

app = typer.Typer(
    help="KernelHarness: evaluate LLM-written GPU kernels (KernelBench ModelNew files) against reference models.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(problems_cmd.app, name="problems")
app.command("eval")(eval_cmd.eval_command)


def main() -> None:
    app()
