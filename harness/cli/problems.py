"""`harness problems ls|show`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from harness.cli.common import ProblemsDirOption, find_problem, registry, si
from harness.config import get_settings
from harness.evaluation.runner import phase_limits
from harness.precision import PRECISIONS
from harness.problems.spec import module_constants

app = typer.Typer(help="List and inspect problems.", no_args_is_help=True)


@app.command("ls")
def list_problems(problems_dir: Path | None = ProblemsDirOption,
                  as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List problems: id, KernelBench id, tolerance and sizes.

    Example: harness problems ls --problems-dir ~/KernelBench/KernelBench/level2
    """
    specs = registry(problems_dir).all()
    if as_json:
        typer.echo(json.dumps([s.model_dump(mode="json") for s in specs], indent=2))
        return
    width = max((len(s.id) for s in specs), default=2)
    typer.echo(f"{'id':<{width}}  {'kernelbench':<12} {'tolerance':<18} sizes")
    for s in specs:
        typer.echo(f"{s.id:<{width}}  {s.kernelbench_id or '-':<12} {s.tolerance!s:<18} {', '.join(s.sizes)}")


@app.command("show")
def show_problem(problem: str = typer.Argument(..., help="Slug, KernelBench id (level2/75), file stem "
                                                        "or the path of a problem file."),
                 problems_dir: Path | None = ProblemsDirOption,
                 source: bool = typer.Option(False, "--source", help="Print the reference source too."),
                 as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show one problem's metadata, constants and sizes.

    Example: harness problems show level2/75 --source
    """
    spec = find_problem(problems_dir, problem)
    limits = phase_limits(spec, get_settings())
    if as_json:
        typer.echo(json.dumps({**spec.model_dump(mode="json"), "stochastic": spec.stochastic,
                               "time_limits": [vars(lim) for lim in limits]}, indent=2))
        return
    typer.echo(f"{spec.id}  (KernelBench {spec.kernelbench_id or '-'}, version {spec.version})")
    if spec.description:
        typer.echo(f"  {spec.description}")
    typer.echo(f"  file:        {spec.source_path}")
    typer.echo("  tolerance:   " + ", ".join(f"{spec.tolerance_at(p)} at {p}" for p in PRECISIONS))
    typer.echo("  time limits:")
    for lim in limits:
        typer.echo(f"    {lim.phase + ':':<14}{lim.seconds:g} s: {lim.rule}")
    typer.echo(f"  constructor: Model({', '.join(spec.init_arg_names)})")
    if spec.stochastic:
        typer.echo(f"  stochastic:  yes ({', '.join(spec.stochastic)}): both sides run each call right after "
                   "torch.manual_seed(the same fresh seed)")
    typer.echo("  constants:   " + ", ".join(f"{k}={v}" for k, v in module_constants(spec.source()).items()))
    for name, variant in spec.sizes.items():
        extra = f"  overrides {variant.overrides}" if variant.overrides else ""
        flops = si(variant.flops, "FLOP") if variant.flops else "FLOPs unknown"
        nbytes = si(variant.min_bytes, "B") if variant.min_bytes else "bytes unknown"
        typer.echo(f"  size {name}: {flops}, min traffic {nbytes}{extra}")
    if source:
        typer.echo("")
        typer.echo(spec.source())
