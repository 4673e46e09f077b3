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


def aligned(header: list[str], rows: list[list[str]], right: frozenset[int] = frozenset()) -> list[str]:
    """A text table whose columns are as wide as their widest cell (a long name shifts no column after it); the
    columns in `right` are aligned to the right."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            .rstrip() for r in [header, *rows]]


def si(value: float, unit: str) -> str:
    """A quantity with the SI prefix that fits it, to 3 significant digits: 17.3 MFLOP, not 0.0 GFLOP."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"
