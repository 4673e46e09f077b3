"""The A/A check: every problem's reference, resubmitted as its own `ModelNew`, must pass its own evaluation.

A problem that fails it cannot be solved by anybody: its reference is stochastic, or its sizes do not
build, or the harness mishandles something in it. On a CPU the check runs at reduced sizes, chosen per
problem by `harness.evaluation.size_probe` from the file's own size constants within a time budget, and
every row records the sizes it ran at.

No torch here: sizes are chosen in a child process, evaluations go through `runner.evaluate`, and each device's
target is probed in a child (`Targets`).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from harness.config import Settings
from harness.evaluation import reduced_size
from harness.evaluation.eager_process import aa_submission
from harness.evaluation.prebuild import probe_device
from harness.evaluation.runner import EvalOptions, evaluate
from harness.evaluation.starts import prestart, prestart_trusted
from harness.evaluation.warm import TrustedPool
from harness.problems.spec import ProblemSpec, SizeVariant
from harness.schema import Precision, Provenance

log = logging.getLogger("harness.selfcheck")

SCHEMA_VERSION = 1
UNSIZED = "unsized"  # no size could be found to run the problem at: no evaluation ran

# A fixed sample across the three levels for CI: elementwise, reductions, matmuls, convolutions, norms,
# attention, recurrent and whole networks, each cheap at reduced size (docs/kernelbench.md has them all).
CI_SAMPLE = (
    "level1/1", "level1/19", "level1/23", "level1/40", "level1/41", "level1/47", "level1/54", "level1/89",
    "level1/95", "level1/97",
    "level2/1", "level2/19", "level2/30", "level2/37", "level2/40",
    "level3/1", "level3/4", "level3/8", "level3/31", "level3/43",
)


@dataclass
class SelfcheckOptions:
    device: str = "cpu"  # cpu | cuda
    reduce: bool | None = None  # reduce sizes to the budget; None: on the CPU only
    forward_budget_s: float = reduced_size.FORWARD_BUDGET_S  # one forward pass's estimated time to shrink to
    sizing_time_limit_s: float = reduced_size.SIZING_TIME_LIMIT_S
    jobs: int = 1
    # One environment per GPU (devices.Slot.env: CUDA_VISIBLE_DEVICES pinned), one job on each at a time; empty: every
    # job on the one device this process sees (`jobs` of them side by side).
    gpu_envs: list[dict[str, str]] = field(default_factory=list)
    seed: int | None = None
    # What both sides run at (harness/precision.py). Sizes are chosen at fp32: at a half precision they hold half
    # the bytes, and a CPU without native half arithmetic may take longer than the budget for a forward pass.
    precision: Precision = "fp32"


class SelfcheckRow(BaseModel):
    problem: str
    name: str
    size: str  # "default", or the overridden constants: "batch_size=16 dim=1024"
    overrides: dict[str, Any] = Field(default_factory=dict)
    precision: Precision = "fp32"  # what it was evaluated at (rows written before there was a choice: fp32)
    verdict: str  # an evaluation verdict, or "unsized"
    flags: list[str] = Field(default_factory=list)  # the checks a `flagged` verdict names
    # What each flag says (`flag_details`): why a row was marked timing_unreliable, read from the report alone.
    flag_details: dict[str, str] = Field(default_factory=dict)
    message: str = ""
    speedup_vs_eager: float | None = None
    forward_s: float | None = None  # one forward pass at this size, measured while sizing
    sizing_s: float = 0.0
    eval_s: float = 0.0
    job_dir: str | None = None
    gpu: str | None = None  # the GPU it ran on, where a run spread over several (CUDA_VISIBLE_DEVICES's id)
    torch_version: str | None = None
    commit: str | None = None  # of the harness that made this row (a resumed report holds rows of several)
    # Where the evaluation's time went (the result's phases, seconds on the parent's clock), and each timed kind's
    # clocks side by side (`clocks_of`): a report read on another machine, its job dirs gone, still says why a row
    # took long and where its A/A came from (scripts/aa_clocks.py reads either).
    phases: dict[str, float] = Field(default_factory=dict)
    clocks: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    # Each timed kind's windows in round order (wall ms on the parent's clock; the candidate's charges beside), and
    # what the candidate's ratio was known to when the rounds ended: enough to grade an A/A again by another rule
    # (benchmarks/aa_paired_regrade.py) once the GPU that ran it is gone.
    windows: dict[str, dict[str, list[float | None]]] = Field(default_factory=dict)
    known_to: float | None = None
    eager_process: str | None = None  # where eager's windows ran: "own" or "trusted" (eager_process.py)
    # Why the timed rounds ran twice (their first windows were sized down and ran short: rounds.TimedRounds._retime).
    retimed: str | None = None


class SelfcheckReport(BaseModel):
    schema_version: int = SCHEMA_VERSION
    command: str
    commit: str | None
    host: str
    device: str
    forward_budget_s: float | None
    jobs: int
    gpus: list[str] = Field(default_factory=list)  # where --gpus spread the run: one job on each
    started_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    wall_s: float = 0.0  # from the start of this invocation to its latest row (a resumed run starts again)
    rows: list[SelfcheckRow] = Field(default_factory=list)

    def passed(self) -> int:
        return sum(r.verdict == "passed" for r in self.rows)


# Per timed kind, the figures that tell an A/A's cause apart (README, "Timing on a GPU"): the parent's time per call,
# the process's own CUDA events and input making per call, the empty window, the round trip, the spread; a
# baseline's speedup paired by round and its spread (windows.paired_ratio).
CLOCK_FIELDS = ("median_ms", "device_median_ms", "inputs_median_ms", "overhead_ms", "round_trip_ms", "spread",
                "calls_per_window", "n", "paired_speedup", "paired_spread")


FLAG_DETAIL_CHARS = 600


def flag_details(flags: list[Any]) -> dict[str, str]:
    """Each flag's check and what it says (those of one check joined), each at most FLAG_DETAIL_CHARS."""
    out: dict[str, list[str]] = {}
    for f in flags:
        out.setdefault(f.check, []).append(f.detail)
    return {check: "; ".join(details)[:FLAG_DETAIL_CHARS] for check, details in out.items()}


def clocks_of(observations: Any) -> dict[str, dict[str, float | None]]:
    """Each timed kind's CLOCK_FIELDS, from an evaluation's observations (none where it was not timed)."""
    out: dict[str, dict[str, float | None]] = {}
    for kind in ("candidate", "eager", "compile"):
        timing = getattr(observations, f"{kind}_timing", None)
        if timing is not None:
            out[kind] = {f: getattr(timing, f, None) for f in CLOCK_FIELDS}
    return out


def windows_of(observations: Any) -> dict[str, dict[str, list[float | None]]]:
    """Each timed kind's windows (`windows_ms`) and charges (`charged_ms`), in round order, and its untimed windows
    before them (`warmup_calls`, `warmup_ms`: what the timed ones were sized on; `warmup_device_ms`, what the
    process's own CUDA events said of each, null where it said nothing)."""
    out: dict[str, dict[str, list[float | None]]] = {}
    warm = getattr(observations, "warmup_windows", None) or {}
    own = getattr(observations, "warmup_own_ms", None) or {}
    for kind in ("candidate", "eager"):
        timing = getattr(observations, f"{kind}_timing", None)
        if timing is not None:
            out[kind] = {"windows_ms": list(timing.windows_ms), "charged_ms": list(timing.charged_ms),
                         "warmup_calls": [c for c, _ in warm.get(kind, [])],
                         "warmup_ms": [ms for _, ms in warm.get(kind, [])],
                         "warmup_device_ms": [device for _, device in own.get(kind, [])]}
    return out


def select(specs: Iterable[ProblemSpec], sample: list[str] | None) -> list[ProblemSpec]:
    """The problems to check: all of them, or those whose id is named or starts with a named prefix
    (`level3/4` names one; `level3/` a level). A name that matches nothing is an error."""
    specs = [s for s in specs if not s.builtin]
    if not sample:
        return specs
    chosen: list[ProblemSpec] = []
    for name in sample:
        hits = [s for s in specs if s.id == name or (name.endswith("/") and s.id.startswith(name))]
        if not hits:
            raise KeyError(f"--sample names {name!r}, which is no problem of this folder (ids look like level1/19)")
        chosen.extend(h for h in hits if h not in chosen)
    return chosen


def choose_size(spec: ProblemSpec, options: SelfcheckOptions, threads: int) -> dict[str, Any]:
    """Run the size probe for one problem; its `sized` fields, or {"ok": False, "error": ...}."""
    return reduced_size.probe(spec.source_path, device=options.device, budget_s=options.forward_budget_s,
                              time_limit_s=options.sizing_time_limit_s, threads=threads)


def eval_env(options: SelfcheckOptions, threads: int, gpu_env: dict[str, str] | None) -> dict[str, str]:
    """The environment an evaluation's children run under, and its device's target is probed under."""
    # One thread per job, as the size probe measured: the A/A ratio then compares like with like.
    return {"OMP_NUM_THREADS": str(threads)} if options.device == "cpu" else dict(gpu_env or {})


class Targets:
    """Each device's target (device, arch, versions: what a candidate's build dir is keyed by), probed once by a child
    under that device's environment the first time a job uses it. Given it, an evaluation starts the candidate's
    process beside the trusted one, its torch import overlapping the trusted child's start, instead of after the
    trusted child's probe (on an H100 each took about 4.7 s, one after the other). A target that turns out wrong
    only starts the candidate again (`runner._target_changes`); a probe that fails leaves its device without one,
    its evaluations as they were before.

    On the CPU too: the runner keys a CPU build by the same fields (arch "cpu"), and one probe per run is one torch
    import against one saved on every problem."""

    def __init__(self, device: str, settings: Settings):
        self.device, self.settings = device, settings
        self._found: dict[tuple[tuple[str, str], ...], Provenance | None] = {}
        self._locks: dict[tuple[tuple[str, str], ...], threading.Lock] = {}
        self._lock = threading.Lock()

    def of(self, env: dict[str, str]) -> Provenance | None:
        """The target of the device `env` pins, or None where its probe failed."""
        key = tuple(sorted(env.items()))
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # jobs sharing one device (no --gpus) wait for its one probe
            if key not in self._found:
                self._found[key] = self._probe(env)
            return self._found[key]

    def _probe(self, env: dict[str, str]) -> Provenance | None:
        try:
            return probe_device(self.device, self.settings, env)
        except (RuntimeError, OSError) as e:
            gpu = env.get("CUDA_VISIBLE_DEVICES")
            where = f"GPU {gpu}" if gpu is not None else f"the {self.device} device"
            log.warning("could not probe %s for its target, so its evaluations start the candidate after the "
                        "trusted child's probe: %s", where, e)
            return None


def _reduced(options: SelfcheckOptions) -> bool:
    return options.device == "cpu" if options.reduce is None else options.reduce


def _planned(spec: ProblemSpec, options: SelfcheckOptions, threads: int, sized: dict[str, Any],
             gpu_env: dict[str, str] | None, target: Provenance | None,
             pool: TrustedPool | None) -> tuple[ProblemSpec, str, EvalOptions]:
    """The evaluation one row runs, at the size `sized` chose: its problem, its A/A submission and its options (the
    same for a problem's look-ahead as for its row, so what was started ahead is what its evaluation takes)."""
    overrides: dict[str, Any] = sized["overrides"]
    size_name = "reduced" if overrides else "default"
    variants = {"default": SizeVariant(), "reduced": SizeVariant(overrides=overrides)}
    sized_spec = spec.model_copy(update={"sizes": variants})
    # The A/A ratio is against eager; a torch.compile baseline would only add its compile time to each row.
    opts = EvalOptions(device=options.device, size=size_name, seed=options.seed, compile_baseline="off",
                       precision=options.precision, extra_env=eval_env(options, threads, gpu_env), target=target,
                       trusted_pool=pool)
    return sized_spec, aa_submission(spec.source(), overrides), opts


_UNREDUCED: dict[str, Any] = {"ok": True, "overrides": {}, "size": "default", "forward_s": None}


def check_problem(spec: ProblemSpec, options: SelfcheckOptions, settings: Settings, threads: int,
                  gpu_env: dict[str, str] | None = None, target: Provenance | None = None,
                  pool: TrustedPool | None = None) -> SelfcheckRow:
    """One problem's A/A row, evaluated under `gpu_env` (its GPU's pin) with `target` (that device's, see `Targets`;
    None: the candidate starts after the trusted child's probe) and `pool` (its lane's, where the next row's
    processes were started ahead: `start_ahead`)."""
    t0 = time.monotonic()
    sized = choose_size(spec, options, threads) if _reduced(options) else _UNREDUCED
    sizing_s = time.monotonic() - t0
    if not sized.get("ok"):
        return SelfcheckRow(problem=spec.id, name=spec.name, size="-", precision=options.precision, verdict=UNSIZED,
                            message=str(sized.get("error", ""))[:500], sizing_s=sizing_s)
    overrides: dict[str, Any] = sized["overrides"]
    t1 = time.monotonic()
    result = evaluate(*_planned(spec, options, threads, sized, gpu_env, target, pool), settings)
    return SelfcheckRow(
        problem=spec.id, name=spec.name, size=sized["size"], overrides=overrides, precision=options.precision,
        verdict=result.verdict.value,
        flags=[f.check for f in result.flags], flag_details=flag_details(result.flags), message=result.message,
        speedup_vs_eager=result.speedup_vs_eager, forward_s=sized.get("forward_s"),
        sizing_s=sizing_s, eval_s=time.monotonic() - t1, job_dir=result.job_dir,
        gpu=(gpu_env or {}).get("CUDA_VISIBLE_DEVICES"),
        torch_version=result.provenance.torch_version if result.provenance else None,
        phases={k: round(v, 3) for k, v in result.observations.phases.items()},
        clocks=clocks_of(result.observations), windows=windows_of(result.observations),
        known_to=getattr(result.observations, "timing_known_to", None),
        eager_process=getattr(result.observations, "eager_process", None),
        retimed=getattr(result.observations, "windows_retimed", None),
    )


def looks_ahead(options: SelfcheckOptions) -> bool:
    """Whether a lane starts its next row's processes while it evaluates a row: on CUDA at the files' own sizes.
    On the CPU they would share the cores the row is timed on, and a size probe would run the next problem's
    forward beside the row's timed windows."""
    return options.device == "cuda" and not _reduced(options)


def start_ahead(spec: ProblemSpec, options: SelfcheckOptions, settings: Settings, threads: int,
                gpu_env: dict[str, str] | None, target: Provenance | None, pool: TrustedPool) -> None:
    """Start the next row's trusted process and candidate process (torch imported in each, nothing of the problem
    or its submission run yet: `starts.prestart_trusted`, `starts.prestart`), while this lane evaluates a row."""
    sized_spec, text, opts = _planned(spec, options, threads, _UNREDUCED, gpu_env, target, pool)
    prestart_trusted(sized_spec, opts, settings)
    prestart(sized_spec, text, opts, settings)


def run_selfcheck(specs: list[ProblemSpec], options: SelfcheckOptions, settings: Settings,
                  on_row: Callable[[SelfcheckRow], None] | None = None) -> list[SelfcheckRow]:
    """Check `specs`, `options.jobs` at a time (with `options.gpu_envs`, one lane on each GPU, each probed for its
    target by its first job); `on_row` hears of each row as it is done (in any order). The rows come back in the
    order of `specs`. On CUDA each lane starts its next row's processes during a row (`looks_ahead`)."""
    jobs = len(options.gpu_envs) if options.gpu_envs else max(1, options.jobs)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    lock = threading.Lock()
    if jobs > 1 and options.device != "cpu" and not options.gpu_envs:
        # Evaluations side by side on one GPU: each one's work is the other process's work that a reference
        # window would wait for (Settings.gpu_idle_wait_s), so none waits.
        settings = settings.model_copy(update={"gpu_idle_wait_s": 0.0})
    todo: queue.SimpleQueue[tuple[int, ProblemSpec]] = queue.SimpleQueue()
    for item in enumerate(specs):
        todo.put(item)
    rows: list[SelfcheckRow | None] = [None] * len(specs)
    targets = Targets(options.device, settings)

    def take() -> tuple[int, ProblemSpec] | None:
        try:
            return todo.get_nowait()
        except queue.Empty:
            return None

    def lane(env: dict[str, str] | None) -> None:
        """One GPU's rows (or one job's), one at a time: never two on one GPU."""
        target = targets.of(eval_env(options, threads, env))
        # Problems do not come again in a run: each trusted process ends with its row.
        pool = TrustedPool(settings, keep_warm=False) if looks_ahead(options) else None
        try:
            upcoming = take()
            while upcoming is not None:
                (i, spec), upcoming = upcoming, take()
                if pool is not None and upcoming is not None:
                    start_ahead(upcoming[1], options, settings, threads, env, target, pool)
                row = rows[i] = check_problem(spec, options, settings, threads, env, target, pool)
                if on_row is not None:
                    with lock:
                        on_row(row)
        finally:
            if pool is not None:
                pool.close()

    with ThreadPoolExecutor(max_workers=jobs) as ex:
        for f in [ex.submit(lane, env) for env in options.gpu_envs or [None] * jobs]:
            f.result()
    return [r for r in rows if r is not None]


def current_commit() -> str | None:
    """The checkout's commit, `+dirty` when it has uncommitted changes; None outside a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


def write_report(report: SelfcheckReport, path: Path) -> None:
    """Atomically: a run killed mid-write leaves the previous complete report."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(report.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)


def markdown_table(rows: list[SelfcheckRow]) -> str:
    """The rows as a Markdown table (docs/kernelbench.md is made of it)."""
    lines = ["| problem | size used | verdict | A/A vs eager | forward ms | time s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        speedup = "-" if r.speedup_vs_eager is None else f"{r.speedup_vs_eager:.2f}x"
        forward = "-" if r.forward_s is None else f"{r.forward_s * 1e3:.1f}"
        verdict = f"{r.verdict} ({', '.join(r.flags)})" if r.flags else r.verdict
        lines.append(f"| {r.problem} `{r.name}` | `{r.size}` | {verdict} | {speedup} | {forward} | "
                     f"{r.sizing_s + r.eval_s:.0f} |")
    return "\n".join(lines) + "\n"


def load_rows(path: Path) -> list[SelfcheckRow]:
    """Rows of an earlier report (to resume a run); none if the file does not exist."""
    if not path.exists():
        return []
    return [SelfcheckRow.model_validate(r) for r in json.loads(path.read_text()).get("rows", [])]
