"""Shared option handling for CLI commands."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.config import Settings, get_settings
from harness.problems import Registry, UnknownProblem, get_registry
from harness.problems import find_problem as find_in
from harness.problems.spec import ProblemSpec
from harness.service.devices import cuda_device_missing

# Resolved as it is read: a relative folder means the same to the children, which run elsewhere.
ProblemsDirOption = typer.Option(
    None, "--problems-dir", help="A KernelBench-format folder (KernelBench/KernelBench, or one levelN folder) "
    "whose problems become available as levelN/<number>.", exists=True, file_okay=False, dir_okay=True,
    resolve_path=True,
)


def registry(problems_dir: Path | None) -> Registry:
    return get_registry(problems_dir or get_settings().problems_dir)


def find_problem(problems_dir: Path | None, problem: str) -> ProblemSpec:
    """The problem -p names (an id, a KernelBench id, a stem or a file's path); exit 2 with near names if none."""
    try:
        return find_in(registry(problems_dir), problem)
    except UnknownProblem as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


def require_cuda(settings: Settings, instead: str = "cpu or auto") -> None:
    """A usage error (exit 2) when --device cuda was asked for and no CUDA device is visible."""
    why = cuda_device_missing(settings)
    if why is not None:
        raise typer.BadParameter(f"no CUDA device is visible ({why}); use --device {instead}", param_hint="--device")
