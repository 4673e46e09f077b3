"""`harness export kernelbench`: a run in KernelBench's formats, for KernelBench's own tools; and
`harness export check-baseline`: read a KernelBench baseline-time file and show what it holds."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from harness import kernelbench_format as kbf
from harness.cli.common import ProblemsDirOption
from harness.db.session import Database
from harness.problems import get_registry
from harness.problems.spec import ProblemSpec
from harness.service import kernelbench as kb
from harness.service.runtime import settings_with

app = typer.Typer(help="Write results in other tools' formats.", no_args_is_help=True)


def read_baseline_file(path: Path) -> kbf.BaselineFile:
    """A KernelBench baseline-time file, validated; a bad one is a usage error that says where."""
    try:
        return kbf.read_baseline(json.loads(path.read_text()))
    except OSError as e:
        raise typer.BadParameter(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"{path} is not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except kbf.BaselineFileError as e:
        raise typer.BadParameter(f"{path} is not a KernelBench baseline-time file: {e}") from None


def missing_baselines(data: dict[str, Any], specs: list[ProblemSpec], levels: list[int]) -> list[str]:
    """The problems of these levels (KernelBench ids) a baseline file has no time for."""
    return [sp.kernelbench_id or sp.id for sp in sorted(specs, key=lambda sp: kb.kernelbench_place(sp) or (0, 0))
            if (place := kb.kernelbench_place(sp)) is not None and place[0] in levels
            and f"{sp.name}.py" not in data.get(f"level{place[0]}", {})]


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    typer.echo(f"wrote {path}", err=True)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "hardware"


@app.command("kernelbench")
def export_kernelbench(
    out: Path = typer.Option(..., "--out", file_okay=False, help="Folder to write KernelBench's layout into."),
    model: str = typer.Option(None, "--model"),
    tag: str = typer.Option(None, "--tag", help="eval-dir tags each result with its run folder's name."),
    submitter: str = typer.Option(None, "--submitter"),
    batch: str = typer.Option(None, "--batch"),
    run: str = typer.Option(None, "--run", help="The run's name in runs/<run>/ (default: the tag or model)."),
    device: str = typer.Option(None, "--device", help="cuda | cpu (default: cuda where the run has GPU results)."),
    hardware: str = typer.Option(None, "--hardware", help="The folder name under results/timing/ (default: the "
                                 "GPU's name)."),
    problems_dir: Path = ProblemsDirOption,
    database_url: str = typer.Option(None, "--database-url"),
) -> None:
    """Write a run as KernelBench's eval results and the reference's vouched measurements as its baseline files:

      OUT/runs/<run>/eval_results.json  (a run of several levels: runs/<run>_level<L>/, as KernelBench keys
                                         problems by their number in the level)
      OUT/results/timing/<hardware>/baseline_time_torch.json
      OUT/results/timing/<hardware>/baseline_time_torch_compile_inductor_default.json

    KernelBench's analysis then reads them (its run_name=<run> level=<L> eval_results_dir=OUT/runs
    baseline_file=OUT/results/timing/<hardware>/baseline_time_torch.json).

    Examples:

      harness export kernelbench --tag my_run --out kb/

      harness export kernelbench --model my-llm --device cuda --hardware H100_ours --out kb/
    """
    settings = settings_with(database_url=database_url, problems_dir=problems_dir)
    registry = get_registry(settings.problems_dir)
    db = Database(settings)
    try:
        with db.session() as s:
            try:
                rows = kb.run_rows(s, model=model, submitter=submitter, tag=tag, batch=batch)
            except kb.NoRun as e:
                raise typer.BadParameter(str(e)) from None
            samples, counts = kb.run_samples(registry, rows)
            if not samples:
                typer.echo("error: no result of a KernelBench problem matches", err=True)
                raise typer.Exit(1)
            dev = kb.pick_device(samples, device)
            name, size = kb.run_hardware(samples, dev)
            specs = [sp for lv in kb.level_specs(registry).values() for sp in lv]
            baselines = {which: kb.baseline_json(kb.measured_baselines(s, specs, device=dev, device_name=name,
                                                                      size=size, baseline=which), specs)
                         for which in ("eager", "compile")}
    finally:
        db.dispose()
    run_name = _safe(run or tag or model or submitter or batch)
    per_level = kb.eval_results_json(samples, dev)
    for level, results in per_level.items():
        folder_name = run_name if len(per_level) == 1 else f"{run_name}_level{level}"
        _write(out / "runs" / folder_name / "eval_results.json", results)
    folder = out / "results" / "timing" / _safe(hardware or name or dev)
    for which, data in baselines.items():
        _write(folder / f"{kbf.BASELINE_FILES[which]}.json", data)
    lacking = missing_baselines(baselines["eager"], specs, sorted(per_level))
    if lacking:
        typer.echo(f"note: {kbf.BASELINE_FILES['eager']}.json has no time for {', '.join(lacking)} (never measured "
                   "here in windows the harness vouches for): KernelBench's script leaves such a problem out of "
                   "fast_p's denominator, where every problem of the level belongs", err=True)
    left = counts.model_dump()
    if any(left.values()):
        typer.echo("left out: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in left.items() if v), err=True)


@app.command("check-baseline")
def check_baseline(path: Path = typer.Argument(..., exists=True, dir_okay=False, help="e.g. results/timing/"
                                               "H100_Modal/baseline_time_torch.json")) -> None:
    """Read a KernelBench baseline-time file, refuse one not in its format, and show what it holds.

    Example: harness export check-baseline KernelBench/results/timing/H100_Modal/baseline_time_torch.json
    """
    data = read_baseline_file(path)
    console = Console()
    console.print(f"{path}: {', '.join(data.hardware()) or 'hardware not named'}", soft_wrap=True)
    table = Table()
    for col in ("level", "problems", "mean ms: min", "median", "max"):
        table.add_column(col)
    for level in sorted(data.levels):
        means = sorted(data.times(level).values())
        if means:
            table.add_row(str(level), str(len(means)), f"{means[0]:.4g}", f"{means[(len(means) - 1) // 2]:.4g}",
                          f"{means[-1]:.4g}")
    console.print(table)
