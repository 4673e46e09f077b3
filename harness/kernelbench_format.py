"""KernelBench's file formats, written from our results and read back. Pure: no DB, no GPU, no torch.

- Eval results (`runs/<run>/eval_results.json`): problem number (a string) -> one entry per sample:
  `sample_id`, `compiled`, `correctness`, `metadata`, `runtime` (the mean time per call in ms, -1.0 when not
  timed) and `runtime_stats` (`mean`, `std`, `min`, `max`, `num_trials`, all ms).
- Baseline times (`results/timing/<hardware>/<baseline>.json`, e.g. `baseline_time_torch.json` for eager and
  `baseline_time_torch_compile_inductor_default.json` for torch.compile): `level<L>` -> the problem's file name
  (`75_Gemm_GroupNorm_Min_BiasAdd.py`) -> the same statistics, with `hardware` and `device`.

Our statistics are over timed windows of many calls each (TimingStats: the parent's clock, per call), so
`num_trials` is the number of windows; `median` and `clock` are added beside KernelBench's fields, which
KernelBench's tools ignore. Nothing is rounded (KernelBench rounds to 3 significant digits).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from harness.schema import TimingStats

BASELINE_FILES = {"eager": "baseline_time_torch", "compile": "baseline_time_torch_compile_inductor_default"}
NOT_TIMED = -1.0  # KernelBench's runtime when nothing was timed
_LEVEL_KEY = re.compile(r"^level(\d+)$")
_PROBLEM_FILE = re.compile(r"^(\d+)_.+\.py$")


class BaselineFileError(ValueError):
    """A baseline file that is not in KernelBench's format: the message says where."""


def runtime_stats(t: TimingStats) -> dict[str, Any]:
    return {"mean": t.mean_ms, "std": t.std_ms, "min": t.min_ms, "max": t.max_ms, "num_trials": t.n,
            "median": t.median_ms, "clock": t.clock}


def eval_entry(*, sample: int, compiled: bool, correct: bool, timing: TimingStats | None,
               metadata: dict[str, Any]) -> dict[str, Any]:
    """One sample as KernelBench's eval results hold it. `metadata` says what KernelBench's fields cannot (our
    verdict, message, flags, whether the time is vouched for)."""
    return {"sample_id": sample, "compiled": compiled, "correctness": correct, "metadata": metadata,
            "runtime": timing.mean_ms if timing is not None else NOT_TIMED,
            "runtime_stats": runtime_stats(timing) if timing is not None else {}}


def eval_results(entries: Iterable[tuple[int, dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """(problem number, entry) pairs as the eval-results file: problems in numeric order, samples in order."""
    out: dict[int, list[dict[str, Any]]] = {}
    for number, entry in entries:
        out.setdefault(number, []).append(entry)
    return {str(n): sorted(out[n], key=lambda e: e["sample_id"]) for n in sorted(out)}


def baseline_entry(t: TimingStats, *, hardware: str, device: str, measurements: int) -> dict[str, Any]:
    """A problem's baseline statistics; `measurements`: how many vouched measurements it was chosen from."""
    return {**runtime_stats(t), "hardware": hardware, "device": device, "measurements": measurements}


class BaselineStat(BaseModel):
    mean: float
    std: float | None = None
    min: float | None = None
    max: float | None = None
    num_trials: int | None = None
    hardware: str | None = None
    device: str | None = None


class BaselineFile(BaseModel):
    """A baseline-time file read back: level -> problem number -> statistics (file names kept beside)."""

    levels: dict[int, dict[int, BaselineStat]]
    names: dict[int, dict[int, str]]  # level -> problem number -> the file name it was given under

    def times(self, level: int) -> dict[int, float]:
        """The mean time per problem of one level, ms (what KernelBench's analysis reads)."""
        return {n: s.mean for n, s in self.levels.get(level, {}).items()}

    def hardware(self) -> list[str]:
        return sorted({s.hardware for lv in self.levels.values() for s in lv.values() if s.hardware})


def _number(x: Any, where: str, *, positive: bool = False) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or (positive and x <= 0):
        raise BaselineFileError(f"{where}: expected a {'positive ' if positive else ''}finite number, got {x!r}")
    return float(x)


def read_baseline(data: Any) -> BaselineFile:
    """Validate a parsed baseline-time file; a file not in the format gets an error that names the entry."""
    if not isinstance(data, dict) or not data:
        raise BaselineFileError("expected an object of levels such as {\"level1\": {\"1_Square_matrix_"
                                "multiplication_.py\": {\"mean\": 2.66, ...}}}")
    levels: dict[int, dict[int, BaselineStat]] = {}
    names: dict[int, dict[int, str]] = {}
    for key, problems in data.items():
        m = _LEVEL_KEY.match(str(key))
        if not m:
            raise BaselineFileError(f"{key!r}: a level key is level<N> (level1, level2, ...)")
        if not isinstance(problems, dict):
            raise BaselineFileError(f"{key}: expected an object of problem files")
        level = int(m.group(1))
        levels[level], names[level] = {}, {}
        for name, stats in problems.items():
            where = f"{key}/{name}"
            pm = _PROBLEM_FILE.match(str(name))
            if not pm:
                raise BaselineFileError(f"{where}: a problem is named by its file, <N>_<Name>.py")
            if not isinstance(stats, dict) or "mean" not in stats:
                raise BaselineFileError(f"{where}: expected statistics with a 'mean' (ms)")
            number = int(pm.group(1))
            if number in levels[level]:
                raise BaselineFileError(f"{where}: problem {number} of {key} is given twice "
                                        f"(also as {names[level][number]})")
            trials = stats.get("num_trials")
            if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
                raise BaselineFileError(f"{where}: num_trials must be a positive integer, got {trials!r}")
            levels[level][number] = BaselineStat(
                mean=_number(stats["mean"], f"{where} mean", positive=True),
                **{f: _number(stats[f], f"{where} {f}") for f in ("std", "min", "max") if stats.get(f) is not None},
                num_trials=trials, hardware=_text(stats.get("hardware")), device=_text(stats.get("device")))
            names[level][number] = str(name)
    return BaselineFile(levels=levels, names=names)


def _text(x: Any) -> str | None:
    return None if x is None else str(x)
