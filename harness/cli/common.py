"""Shared option handling for CLI commands."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.config import get_settings
from harness.problems import Registry, UnknownProblem, get_registry
from harness.problems.spec import ProblemSpec

ProblemsDirOption = typer.Option(
    None, "--problems-dir", help="A KernelBench-format folder (e.g. KernelBench/level2) whose problems "
    "become available as levelN/<number>.", exists=True, file_okay=False, dir_okay=True,
)


def registry(problems_dir: Path | None) -> Registry:
    return get_registry(problems_dir or get_settings().problems_dir)


def find_problem(problems_dir: Path | None, problem: str) -> ProblemSpec:
    try:
        return registry(problems_dir).get(problem)
    except UnknownProblem as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
